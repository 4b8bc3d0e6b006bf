"""``kill -9`` of a broker with topic logs, mid-stream, and a restart on the
same data directory: every confirmed publish is there, once, in order.

The broker runs in its own process (so that it can be killed outright).
A publisher sends batches and flushes each: what a flush returned for is
confirmed. The broker is killed while a batch is on its way; records
published and not confirmed may or may not be in the log (the publisher
cannot know), but the log holds a prefix of what was published (one
channel's records are appended in order, a torn tail is cut), so what is
read back is exactly the first N publishes for some N >= the confirmed
count. Deadlines are generous hang guards only: nothing here waits for a
time to pass, so a busy machine makes it slower, never wrong.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import trio

from broker.client import ConnectionLost, open_client

#: Hang guard of every step (seconds).
DEADLINE = 180.0
#: Confirmed publishes before the broker is killed.
KILL_AFTER = 20_000
#: Publishes per flush.
BATCH = 500
PAYLOAD = 100
END = b"end"

pytestmark = pytest.mark.slow


def payload(number: int) -> bytes:
    return b"%010d" % number + b"." * (PAYLOAD - 10)


def number_of(data: bytes) -> int:
    return int(data[:10])


@contextmanager
def broker_process(data_dir: Path, log: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """A ``broker serve`` process keeping topic logs in ``data_dir`` (its
    stderr appended to ``log``): ``(process, url)``; killed afterwards if
    still running."""
    command = [sys.executable, "-m", "broker", "--log-level", "WARNING", "serve"]
    command += ["--listen", "127.0.0.1:0", "--metrics-listen", ""]
    command += ["--set", f"data_dir={data_dir}"]
    with open(log, "ab") as errors:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=errors)
    try:
        assert process.stdout is not None
        line = process.stdout.readline().decode()  # a hang guard: the pytest timeout
        if "listening on" not in line:
            process.kill()
            raise AssertionError(f"broker did not start: {line!r}; {log.read_text()[-2000:]}")
        yield process, line.split("listening on", 1)[1].strip()
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(DEADLINE)
        if process.stdout is not None:
            process.stdout.close()


async def publish_until_killed(url: str, process: subprocess.Popen[bytes]) -> tuple[int, int]:
    """Publish batches, each flushed, and ``kill -9`` the broker once
    :data:`KILL_AFTER` are confirmed, while the next batch is on its way;
    returns ``(confirmed, published)``."""
    confirmed = 0
    published = 0
    enough = trio.Event()

    async def killer() -> None:
        await enough.wait()
        # Then a moment more (varied: the kill lands anywhere in a batch's
        # way, from being sent to being written and confirmed).
        await trio.sleep(random.uniform(0, 0.05))
        os.kill(process.pid, signal.SIGKILL)

    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(killer)
            try:
                async with open_client(url, name="pub") as client:
                    while True:
                        for _ in range(BATCH):
                            await client.publish("t", payload(published))
                            published += 1
                        await client.flush()
                        confirmed = published
                        if confirmed >= KILL_AFTER:
                            enough.set()
            except ConnectionLost:
                pass
    return confirmed, published


async def read_back(url: str) -> list[bytes]:
    """Every record of topic "t", from the first: an end marker is published
    and the log read from "earliest" up to it."""
    with trio.fail_after(DEADLINE):
        async with open_client(url, name="reader") as client:
            await client.publish("t", END)
            await client.flush()
            got: list[bytes] = []
            seqs: list[int] = []
            async with client.subscribe("t", options={"from": "earliest"}) as sub:
                async for message in sub:
                    if message.payload == END:
                        break
                    got.append(message.payload)
                    seqs.append(message.seq)
    # Offsets are consecutive from 1: the log numbers what it kept.
    assert seqs == list(range(1, len(seqs) + 1))
    return got


async def test_every_confirmed_publish_survives_kill_9_once_and_in_order(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    log = tmp_path / "broker.log"
    with broker_process(data_dir, log) as (process, url):
        confirmed, published = await publish_until_killed(url, process)
        assert await trio.to_thread.run_sync(process.wait, DEADLINE) == -signal.SIGKILL
    assert confirmed >= KILL_AFTER
    with broker_process(data_dir, log) as (_process, url):
        got = await read_back(url)
    numbers = [number_of(data) for data in got]
    # Once and in order, and nothing confirmed missing: the first N publishes.
    assert numbers == list(range(len(numbers))), "a hole, a duplicate or a record out of order"
    assert confirmed <= len(numbers) <= published, (confirmed, len(numbers), published)
    assert got == [payload(n) for n in numbers]
    print(f"confirmed {confirmed}, kept {len(numbers)}, published {published}")
