"""The connection pump (``broker/pump.py``) that the broker's connections,
the workers' links and the trio client run: partial writes from another
task finished by the writer in order, the writer's end, the reader's
hooks, the timer brought forward."""

from __future__ import annotations

import math
import socket
from collections.abc import Callable
from functools import partial
from typing import cast

import trio
import trio.testing

from broker.protocol import Connection
from broker.pump import Pump, Signal
from broker.server.transport._socket_io import socket_io


class Queued:
    """The little of a protocol ``Connection`` a pump looks at, with output
    queued by the test."""

    def __init__(self) -> None:
        self.out: list[bytes] = []
        self.closed = False
        self.frames_waiting = False
        self.deadline = math.inf

    @property
    def bytes_to_send(self) -> int:
        return sum(map(len, self.out))

    def data_to_send(self, now: float | None = None) -> bytes:
        data = b"".join(self.out)
        self.out = []
        return data

    def next_deadline(self) -> float:
        return self.deadline


def pump_on(
    stream: trio.SocketStream, queued: Queued, ready: Callable[[], bool] | None = None
) -> Pump:
    return Pump(stream, cast(Connection, queued), Signal(), io=socket_io(stream), ready=ready)


async def receive_exactly(sock: trio.socket.SocketType, size: int) -> bytes:
    got = bytearray()
    while len(got) < size:
        data = await sock.recv(65536)
        assert data, "the stream ended early"
        got += data
    return bytes(got)


async def test_what_a_write_from_another_task_left_goes_first_then_the_writer_stops() -> None:
    left, right = trio.socket.socketpair()
    left.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    stream = trio.SocketStream(left)
    queued = Queued()
    pump = pump_on(stream, queued)
    big = bytes(range(256)) * 8192  # 2 MiB: more than the socket takes at once
    queued.out = [big]
    assert not pump.write_now()  # the socket took part of it
    assert 0 < sum(map(len, pump.unsent)) < len(big)
    queued.out = [b"next"]
    assert not pump.write_now()  # (nothing interleaves with what is unsent)
    assert queued.out == [b"next"]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pump.write, lambda error: None)
        cast(Signal, pump.wake).set()
        assert await receive_exactly(right, len(big) + 4) == big + b"next"
        await trio.testing.wait_all_tasks_blocked()
        assert pump.unsent == [] and pump.counts.bytes_out == len(big) + 4
        queued.closed = True
        cast(Signal, pump.wake).set()  # closed with nothing left: the writer ends
    await stream.aclose()
    right.close()


async def test_a_write_from_another_task_waits_while_the_writer_sends_or_not_ready() -> None:
    left, right = trio.socket.socketpair()
    stream = trio.SocketStream(left)
    queued = Queued()
    ready = [False]
    pump = pump_on(stream, queued, ready=lambda: ready[0])
    queued.out = [b"held"]
    assert not pump.write_now()
    pump.sending = True
    ready[0] = True
    assert not pump.write_now()
    pump.sending = False
    assert pump.write_now()
    assert await receive_exactly(right, 4) == b"held"
    await stream.aclose()
    right.close()


async def test_the_reader_hands_on_reads_and_waiting_frames_and_reports_the_end() -> None:
    left, right = trio.socket.socketpair()
    stream = trio.SocketStream(left)
    queued = Queued()
    pump = pump_on(stream, queued)
    turns: list[bytes] = []
    ends: list[Exception | None] = []
    pauses = 0

    async def pause() -> None:
        nonlocal pauses
        pauses += 1

    def turn(data: bytes | bytearray) -> bool:
        turns.append(bytes(data))
        queued.frames_waiting = data == b"two frames"  # (its turn handled one)
        return True

    await right.send(b"two frames")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(partial(pump.read, turn, ends.append, pause=pause, frames_left=True))
        await trio.testing.wait_all_tasks_blocked()
        assert turns == [b"two frames", b""]  # the rest without reading
        right.close()
    assert ends == [None]
    assert pauses == 3
    assert pump.counts.bytes_in == len(b"two frames")
    await stream.aclose()


async def test_the_timer_fires_at_the_deadline_or_sooner_when_told(
    autojump_clock: trio.testing.MockClock,
) -> None:
    queued = Queued()
    queued.deadline = trio.current_time() + 3600
    pump = Pump(trio.testing.memory_stream_pair()[0], cast(Connection, queued), Signal())
    fired: list[float] = []

    def fire(now: float) -> bool:
        fired.append(now)
        return True

    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pump.keep_time, fire)
        await trio.testing.wait_all_tasks_blocked()
        pump.sooner(start + 0.05)
    assert len(fired) == 1 and fired[0] - start < 3600
