"""Members of a consumer group in their own processes, ``kill -9``-ed
mid-stream (and one ``SIGSTOP``-ed): no record is lost, and the only
records delivered again are ones a killed (or stopped) member held
unsettled (with one record out at a time: what it logged as received and
not settled, or the one on its way to it).

Each member writes a line per record it is given (``R offset``) and,
once the broker has its settle (``settled()``: the double ack), a line
``A offset``. A record a killed member has an ``R`` for and no ``A`` is
one it may have held unsettled; every record delivered again (its
``deliveries`` above 0) must be one of those. Waits are hang guards only.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from broker.client import open_client
from tests.measure._process import free_port

from .helpers import TIMEOUT
from .processes import running_broker

pytestmark = pytest.mark.slow

RECORDS = 2000
KILLS = 6

MEMBER = """
import sys, trio
from broker.client import open_client
url, out, ack_wait = sys.argv[1], sys.argv[2], int(sys.argv[3])
async def main():
    with open(out, "a", buffering=1) as log:
        async with open_client(url) as client, client.subscribe(
            "work", group="g", start="earliest", max_outstanding=int(sys.argv[4]),
            options={"ack_wait": ack_wait},
        ) as member:
            async for message in member:
                log.write(f"R {message.offset} {message.deliveries}\\n")
                await trio.sleep(0.002)
                message.ack()
                await member.settled()
                log.write(f"A {message.offset}\\n")
trio.run(main)
"""


def _start(
    url: str, out: Path, ack_wait: int = 30_000, outstanding: int = 20
) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-c", MEMBER, url, str(out), str(ack_wait), str(outstanding)]
    return subprocess.Popen(command, stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _read(path: Path) -> tuple[list[tuple[int, int]], set[int]]:
    received: list[tuple[int, int]] = []
    acked: set[int] = set()
    if not path.exists():
        return received, acked
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "R":
            received.append((int(parts[1]), int(parts[2])))
        elif len(parts) == 2 and parts[0] == "A":
            acked.add(int(parts[1]))
    return received, acked


async def _publish(url: str) -> None:
    async with open_client(url) as publisher:
        for index in range(RECORDS):
            await publisher.publish("work", b"%d" % index)
        await publisher.flush()


async def _until(condition: Callable[[], bool]) -> None:
    """Look at the members' files every 50 ms until ``condition()`` holds."""
    while True:
        if condition():
            return
        await trio.sleep(0.05)


def _group_figures(metrics_port: int) -> dict[str, int]:
    """The group's figures in the broker's ``/stat.json``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/stat.json", timeout=10) as r:
        (group,) = json.load(r)["groups"]
    return dict(group)


def _all_acked(logs: list[Path]) -> set[int]:
    done: set[int] = set()
    for path in logs:
        done |= _read(path)[1]
    return done


async def test_killed_members_lose_nothing_and_only_what_they_held_comes_again(
    tmp_path: Path,
) -> None:
    rng = random.Random(41)
    metrics = free_port()
    # (A short lease: a killed member's session, and what it held, ends soon.)
    settings = ("heartbeat=1", "lease=3", f"metrics_listen=127.0.0.1:{metrics}")
    with running_broker(tmp_path, *settings) as broker:
        await _publish(broker.url)
        logs = [tmp_path / f"member-{n}.log" for n in range(3 + KILLS)]
        # (One record out at a time: what a member holds is what it logged
        # as received, or the one on its way to it.)
        members = [_start(broker.url, logs[n], outstanding=1) for n in range(3)]
        member_logs = logs[:3]
        killed: list[Path] = []

        def covered() -> set[int]:
            """Settled for sure (logged after the double ack), or received
            by a member killed before it could log its ack."""
            seen = _all_acked(logs)
            for path in killed:
                seen |= {offset for offset, _ in _read(path)[0]}
            return seen

        try:
            with trio.fail_after(TIMEOUT * 6):
                for n in range(KILLS):
                    target = RECORDS * (n + 1) // (KILLS + 2)
                    await _until(lambda target=target: len(_all_acked(logs)) >= target)  # type: ignore[misc]
                    await trio.sleep(rng.uniform(0, 0.05))
                    victim = rng.randrange(len(members))
                    os.kill(members[victim].pid, signal.SIGKILL)
                    members[victim].wait(TIMEOUT)
                    killed.append(member_logs[victim])
                    members[victim] = _start(broker.url, logs[3 + n], outstanding=1)
                    member_logs[victim] = logs[3 + n]
                await _until(lambda: len(covered()) >= RECORDS)
                # The broker's word: every record settled, none left over.
                await _until(lambda: _group_figures(metrics)["floor"] == RECORDS + 1)
        finally:
            for process in members:
                process.kill()
                process.wait(TIMEOUT)
    assert covered() == set(range(1, RECORDS + 1))  # nothing lost
    maybe_held: set[int] = set()
    for path in killed:
        received, acked = _read(path)
        maybe_held |= {offset for offset, _ in received} - acked
    again = {offset for path in logs for offset, before in _read(path)[0] if before > 0}
    # Delivered again: what a killed member had received and not settled,
    # or the one record on its way to it when it died (at most one a kill).
    assert len(again - maybe_held) <= KILLS, again - maybe_held
    # And everything a killed member held unsettled came again (but the
    # settle it had sent in the moment it died: at most one a kill).
    assert len(maybe_held - again) <= KILLS
    print(f"kills {KILLS}: delivered again {len(again)}, held unsettled {len(maybe_held)}")


async def test_a_stopped_member_holds_nothing_back(tmp_path: Path) -> None:
    """One of three members SIGSTOPped: the others settle everything,
    including what it held (given back after ``ack_wait``)."""
    metrics = free_port()
    with running_broker(tmp_path, f"metrics_listen=127.0.0.1:{metrics}") as broker:
        await _publish(broker.url)
        logs = [tmp_path / f"member-{n}.log" for n in range(3)]
        members = [_start(broker.url, logs[n], ack_wait=500) for n in range(3)]

        def covered() -> set[int]:
            """Settled for sure, or received by the stopped member (which
            may have sent its settle as it stopped)."""
            return _all_acked(logs) | {offset for offset, _ in _read(logs[0])[0]}

        try:
            with trio.fail_after(TIMEOUT * 4):
                while True:  # (stopped while it holds a record, however fast it runs)
                    await _until(lambda: bool(_read(logs[0])[0]))
                    os.kill(members[0].pid, signal.SIGSTOP)
                    received, acked = _read(logs[0])
                    if {offset for offset, _ in received} - acked:
                        break
                    os.kill(members[0].pid, signal.SIGCONT)
                    await trio.sleep(0.01)
                stopped_at = time.monotonic()
                await _until(lambda: len(covered()) >= RECORDS)
                # The broker's word: every record settled.
                await _until(lambda: _group_figures(metrics)["floor"] == RECORDS + 1)
                elapsed = time.monotonic() - stopped_at
        finally:
            for process in members:
                process.kill()
                process.wait(TIMEOUT)
    received, acked = _read(logs[0])
    held = {offset for offset, _ in received} - acked
    assert held  # it stopped holding records
    again = {offset for path in logs[1:] for offset, before in _read(path)[0] if before > 0}
    # What it held went to the others (but the one whose settle it may have
    # sent as it stopped: it takes one record at a time).
    assert len(held - again) <= 1
    assert covered() == set(range(1, RECORDS + 1))
    print(f"stopped member held {len(held)}; all {RECORDS} settled {elapsed:.1f} s after the stop")
