"""The write path at everyday rates: a read's output is written by the task
that handled it (``Outbox``/``Wake``), plain sockets are read and written
without trio's per-call yields (``SocketIO``), and end to end a message
costs the broker few task switches."""

from __future__ import annotations

import socket

import pytest
import trio
import trio.testing

from broker.bench._rates import rates_table
from broker.server.transport._socket_io import SocketIO, socket_io
from broker.server.transport._wake import Outbox, Wake


class Writes:
    """A ``write_now`` that records calls and answers ``result``."""

    def __init__(self, result: bool) -> None:
        self.result = result
        self.calls = 0

    def __call__(self) -> bool:
        self.calls += 1
        return self.result


async def woken(wake: Wake) -> bool:
    """Whether ``wake.wait()`` returns at once (it was set), without waiting."""
    if not wake._event.is_set():
        return False
    await wake.wait()
    return True


async def test_without_an_open_outbox_set_wakes_the_writer() -> None:
    outbox = Outbox()
    wake = Wake(outbox)
    writes = wake.write_now = Writes(True)
    wake.set()
    assert await woken(wake)
    assert writes.calls == 0


async def test_a_read_s_wakes_are_flushed_once_each_when_the_outermost_step_ends() -> None:
    outbox = Outbox()
    first, second = Wake(outbox), Wake(outbox)
    first_writes = first.write_now = Writes(True)
    second_writes = second.write_now = Writes(False)  # its writer is busy
    outbox.open()
    first.set()
    outbox.open()  # (nested)
    first.set()
    second.set()
    outbox.close()
    assert (first_writes.calls, second_writes.calls) == (0, 0)  # not yet: still open
    assert not await woken(first)
    outbox.close()
    assert (first_writes.calls, second_writes.calls) == (1, 1)  # coalesced: once each
    assert not await woken(first)  # written by the step's task: no wake-up
    assert await woken(second)  # could not write: its writer is woken
    assert not outbox.is_open


async def test_wakes_left_noted_between_turns_go_out_at_the_next_step_s_end() -> None:
    """A read's turns (issue 40, item 6) close the outbox without flushing
    until the last: the wakes wait, and the end of any task's next step, or
    a flush before the reader pauses, writes them (once each)."""
    outbox = Outbox()
    flooder, other = Wake(outbox), Wake(outbox)
    flooder_writes = flooder.write_now = Writes(True)
    other_writes = other.write_now = Writes(True)
    outbox.open()
    flooder.set()
    outbox.close(flush=False)  # a turn with frames of its read left
    assert flooder_writes.calls == 0 and not outbox.is_open
    outbox.open()  # another connection's turn
    other.set()
    outbox.close()
    assert (flooder_writes.calls, other_writes.calls) == (1, 1)
    outbox.open()
    flooder.set()
    outbox.close(flush=False)
    outbox.flush()  # the reader is about to pause
    assert flooder_writes.calls == 2
    outbox.flush()  # (nothing noted: nothing written)
    assert flooder_writes.calls == 2


async def test_a_wake_without_a_direct_write_wakes_its_writer_when_flushed() -> None:
    outbox = Outbox()
    wake = Wake(outbox)  # (write_now None: a TLS stream, say)
    outbox.open()
    wake.set()
    assert not await woken(wake)
    outbox.close()
    assert await woken(wake)


async def test_socket_io_reads_what_was_sent_then_waits_then_sees_the_end() -> None:
    left, right = socket.socketpair()
    left.setblocking(False)
    io = SocketIO(left.fileno())
    try:
        right.sendall(b"hello")
        assert await io.receive_some(100) == b"hello"
        got: list[bytes] = []

        async def read() -> None:
            got.append(await io.receive_some(100))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            await trio.testing.wait_all_tasks_blocked()
            assert got == []  # waiting for data
            right.sendall(b"world")
        assert got == [b"world"]
        # A short read emptied the socket: the next one waits for readiness
        # first, which data already there satisfies at once.
        right.sendall(b"there already")
        assert await io.receive_some(100) == b"there already"
        right.close()
        assert await io.receive_some(100) == b""
    finally:
        left.close()


async def test_socket_io_reads_on_while_reads_come_back_full() -> None:
    left, right = socket.socketpair()
    left.setblocking(False)
    io = SocketIO(left.fileno())
    try:
        right.sendall(b"abcdefgh")
        assert [await io.receive_some(3) for _ in range(3)] == [b"abc", b"def", b"gh"]
    finally:
        left.close()
        right.close()


async def test_socket_io_sees_a_reset_as_the_end() -> None:
    left, right = socket.socketpair()
    left.setblocking(False)
    try:
        right.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        left.sendall(b"unread")  # (a close with unread data resets)
        right.close()
        assert await SocketIO(left.fileno()).receive_some(100) == b""
    finally:
        left.close()


async def test_socket_io_writes_what_fits_and_says_how_much() -> None:
    left, right = socket.socketpair()
    left.setblocking(False)
    left.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    io = SocketIO(left.fileno())
    try:
        data = b"x" * (4 * 1024 * 1024)
        sent = io.send_nowait(data)
        assert 0 < sent < len(data)  # the rest does not fit until the peer reads
        assert io.send_nowait(data) == 0
        right.close()
        with pytest.raises(OSError):
            for _ in range(100):  # (the first write after a close may still be taken)
                io.send_nowait(b"more")
    finally:
        left.close()


async def test_only_a_plain_socket_stream_has_the_fast_path() -> None:
    left, right = trio.socket.socketpair()
    stream = trio.SocketStream(left)
    try:
        assert socket_io(stream) is not None
        assert socket_io(trio.testing.memory_stream_pair()[0]) is None
    finally:
        await stream.aclose()
        right.close()


@pytest.mark.slow
def test_a_message_at_an_everyday_rate_costs_the_broker_few_task_switches() -> None:
    # A broker process with loop_counters, one publisher at 200 msg/s to one
    # subscriber: per message the broker handles the publish's read (routing
    # it, writing the Deliver and the Confirm) and the subscriber's Ack. It
    # took about eight task steps before this write path, about two with it.
    figures = rates_table(3.0, rates=(200,))
    assert figures["rate_200_received"] == 600
    assert 0 < figures["rate_200_task_steps_per_msg"] < 4, figures


async def test_a_direct_write_that_fails_fails_its_own_writer_not_the_flushing_task() -> None:
    outbox = Outbox()
    wake = Wake(outbox)

    def broken() -> bool:
        raise RuntimeError("this connection's bug")

    wake.write_now = broken
    outbox.open()
    wake.set()
    outbox.close()  # the flushing task (another connection's reader) goes on
    with pytest.raises(RuntimeError, match="this connection's bug"):
        await wake.wait()  # raised in the writer of the connection it belongs to
