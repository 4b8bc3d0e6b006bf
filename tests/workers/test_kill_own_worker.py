"""Clients of ``broker serve --workers 2`` (a real process, a data
directory, 127.0.0.1) never raise while the worker that holds their
connection is killed with SIGKILL, again and again, under load: the first
time while the broker is still starting (the clients connected meanwhile),
then once they publish and receive flat out.

Each kill takes the client's own worker (found in the supervisor's
``/stat.json``, where each connection carries its client's name and worker).
A worker killed before it had said it was up used to stop the whole broker
("worker w0 did not start (exit status -9)"): every client then raised,
refused (3 of 3 runs)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from broker.bench._procs import free_port
from broker.client import BlockingClient, open_client, open_cluster_client
from tests.cli.helpers import broker_command
from tests.server.helpers import wait_until

from .test_served_workers import POLL, accepts, workers_of

pytestmark = pytest.mark.slow

#: Kills once the clients are under way (besides the one while the broker starts).
KILLS = 4
#: Seconds any client may take to go on after a kill (a hang guard: each
#: takes one to a few seconds, the time a worker takes to start again).
DEADLINE = 60.0
#: The clients' reconnect budget.
RECONNECT = 60.0
NAMES = ("tpub", "tsub", "bpub", "cpub")


@contextmanager
def supervisor(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str, str]]:
    """``broker serve --workers 2`` with a data directory: the process, the
    client address and the metrics base URL (not waited for)."""
    client, metrics = free_port(), free_port()
    process = subprocess.Popen(
        broker_command(
            "--log-level", "WARNING", "serve", "--workers", "2",
            "--data-dir", str(tmp_path / "data"),
            "--listen", f"127.0.0.1:{client}", "--metrics-listen", f"127.0.0.1:{metrics}",
        ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        yield process, f"127.0.0.1:{client}", f"http://127.0.0.1:{metrics}"
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=DEADLINE)
        assert process.returncode == 0, stderr.decode()
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate(timeout=DEADLINE)


def own_worker(metrics: str, name: str) -> int | None:
    """The pid of the worker that holds client ``name``'s connection (a
    cluster client's: the one its topic's owner holds, they all have the
    name), from the supervisor's ``/stat.json``; None if it is not listed now
    (reconnecting)."""
    with urllib.request.urlopen(metrics + "/stat.json", timeout=DEADLINE) as answer:
        document: dict[str, Any] = json.load(answer)
    holders = {c["worker"] for c in document["connections"] if c.get("client") == name}
    pids = [w["pid"] for w in document["workers"] if w["id"] in holders and w["up"]]
    return pids[0] if pids else None


async def own_worker_soon(metrics: str, name: str) -> int:
    """:func:`own_worker`, once the document lists the client (a worker's
    part of it may be up to a second old)."""
    with trio.fail_after(DEADLINE):
        while True:
            pid = await trio.to_thread.run_sync(own_worker, metrics, name)
            if pid is not None:
                return pid
            await trio.sleep(0.1)


class Clients:
    """What each client did, and what any raised."""

    def __init__(self) -> None:
        self.done = {name: 0 for name in NAMES}
        self.raised: list[str] = []
        self.stop = False

    def all_beyond(self, before: dict[str, int], more: int) -> bool:
        return all(self.done[name] >= before[name] + more for name in NAMES)

    def check(self) -> None:
        assert not self.raised, self.raised


async def run_clients(address: str, clients: Clients, nursery: trio.Nursery) -> None:
    """A publisher and a subscriber (trio), a blocking publisher and a
    cluster client publishing: each counts what it did, and records what it
    raised, if anything."""

    def guarded(name: str, work: Callable[[], Any]) -> Callable[[], Any]:
        async def run() -> None:
            try:
                await work()
            except Exception as error:  # what the test is about
                clients.raised.append(f"{name}: {error!r}")

        return run

    async def tpub() -> None:
        async with open_client(address, name="tpub", reconnect=RECONNECT) as client:
            while not clients.stop:
                await client.publish("news", b"%d" % clients.done["tpub"])
                clients.done["tpub"] += 1
                if clients.done["tpub"] % 50 == 0:
                    await trio.sleep(0.001)  # (the others get a turn)

    async def tsub() -> None:
        async with (
            open_client(address, name="tsub", reconnect=RECONNECT) as client,
            client.subscribe("news") as subscription,
        ):
            async for _ in subscription:
                clients.done["tsub"] += 1
                if clients.stop:
                    return

    async def cpub() -> None:
        async with open_cluster_client(address, name="cpub", reconnect=RECONNECT) as client:
            while not clients.stop:
                await client.publish("weather", b"%d" % clients.done["cpub"])
                clients.done["cpub"] += 1
                if clients.done["cpub"] % 50 == 0:
                    await trio.sleep(0.001)

    def bpub() -> None:
        with BlockingClient(address, name="bpub", reconnect=RECONNECT) as client:
            while not clients.stop:
                client.publish("sports", b"%d" % clients.done["bpub"])
                clients.done["bpub"] += 1

    for name, work in [("tpub", tpub), ("tsub", tsub), ("cpub", cpub)]:
        nursery.start_soon(guarded(name, work))
    nursery.start_soon(guarded("bpub", lambda: trio.to_thread.run_sync(bpub)))


async def test_clients_never_raise_while_their_own_worker_is_killed(tmp_path: Path) -> None:
    clients = Clients()
    with supervisor(tmp_path) as (process, address, metrics):
        deadline = time.monotonic() + DEADLINE
        while not accepts(int(address.rpartition(":")[2])):
            assert process.poll() is None and time.monotonic() < deadline
            await trio.sleep(POLL)
        async with trio.open_nursery() as nursery:
            await run_clients(address, clients, nursery)
            # While the broker starts: a worker killed before it is up.
            while not (starting := workers_of(process.pid)):
                assert process.poll() is None and time.monotonic() < deadline
                await trio.sleep(POLL)
            os.kill(starting[0], signal.SIGKILL)
            start = dict.fromkeys(NAMES, 0)
            await wait_until(lambda: clients.all_beyond(start, 100) or bool(clients.raised))
            clients.check()
            killed = []
            for n in range(KILLS):
                name = NAMES[n % len(NAMES)]
                pid = await own_worker_soon(metrics, name)
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                before = dict(clients.done)
                await wait_until(
                    lambda: clients.all_beyond(before, 100) or bool(clients.raised),  # noqa: B023
                    what=f"every client going on after the kill of {name}'s worker",
                )
                clients.check()
            clients.stop = True
            # (The subscriber may wait for a message that never comes once the
            # publishers stop: end the trio clients; the blocking publisher's
            # thread ends at its next publish, which the nursery waits for.)
            nursery.cancel_scope.cancel()
        clients.check()
    assert len(set(killed)) == KILLS  # a new process each time
