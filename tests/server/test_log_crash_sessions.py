"""A broker killed with SIGKILL and started again on its data directory
(issue 21): a session resumes (``resumed`` true) and its subscription goes on
after the last message its client processed, and a durable cursor goes on
after its last acknowledged record: no loss, no duplicate."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import trio

from broker.client import open_client
from tests.measure._process import free_port, wait_listening

from .helpers import TIMEOUT

COUNT = 300


@contextmanager
def broker_process(port: int, data_dir: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``broker serve`` on ``port`` with ``data_dir`` (killed at the end if still running)."""
    command = [sys.executable, "-m", "broker", "--log-level", "WARNING", "serve"]
    command += ["--listen", f"127.0.0.1:{port}", "--metrics-listen", "", "--data-dir"]
    command += [str(data_dir), "--set", "lease=30", "--set", "heartbeat=1"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_listening(port)
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(TIMEOUT)


async def publish(address: str, payloads: list[bytes]) -> None:
    async with open_client(address, name="pub") as client:
        for payload in payloads:
            await client.publish("t", payload)
        await client.flush()  # every one confirmed


async def test_a_session_and_a_durable_cursor_continue_after_kill_9(tmp_path: Path) -> None:
    port = free_port()
    address = f"127.0.0.1:{port}"
    first = [b"%d" % i for i in range(1, COUNT + 1)]
    later = [b"%d" % i for i in range(COUNT + 1, COUNT + 51)]
    got: list[tuple[int | None, bytes]] = []
    cursor_got: list[int | None] = []
    with ExitStack() as brokers:  # (the second broker outlives the client)
        process = brokers.enter_context(broker_process(port, tmp_path))
        await publish(address, first)
        # A durable cursor takes 100 and leaves (leaving acknowledges them).
        async with (
            open_client(address, name="cursor") as reader,
            reader.subscribe("t", start="earliest", cursor="c") as sub,
        ):
            with trio.fail_after(TIMEOUT):
                cursor_got = [(await sub.receive()).offset for _ in range(100)]
        async with (
            open_client(address, name="sub", reconnect=4 * TIMEOUT) as client,
            client.subscribe("t", start="earliest") as subscription,
        ):
            with trio.fail_after(TIMEOUT):
                for _ in range(COUNT // 2):
                    message = await subscription.receive()
                    got.append((message.offset, message.payload))
            os.kill(process.pid, signal.SIGKILL)
            await trio.to_thread.run_sync(process.wait)
            brokers.enter_context(broker_process(port, tmp_path))
            with trio.fail_after(4 * TIMEOUT):
                for _ in range(COUNT - COUNT // 2):
                    message = await subscription.receive()
                    got.append((message.offset, message.payload))
                await publish(address, later)
                for _ in range(len(later)):
                    message = await subscription.receive()
                    got.append((message.offset, message.payload))
            stats = client.statistics()
        async with (
            open_client(address, name="cursor") as reader,
            reader.subscribe("t", cursor="c") as sub,
        ):
            with trio.fail_after(TIMEOUT):
                after = [(await sub.receive()).offset for _ in range(10)]
    everything = first + later
    assert got == [(i + 1, payload) for i, payload in enumerate(everything)]
    assert stats["resumes"] >= 1
    assert stats["sessions_lost"] == 0  # resumed: the broker knew the session
    assert cursor_got == list(range(1, 101))
    assert after == list(range(101, 111))
