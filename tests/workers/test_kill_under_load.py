"""A worker killed with SIGKILL while publishers it forwards for are
publishing flat out: the owner's log holds every publish exactly once, in
each publisher's order. Those in flight at the kill (stored by the owner,
not yet confirmed to their clients) come again after the clients resume,
and the owner knows them by their origin (``broker.server.cluster._origin_dedup``).

Each test makes that window certain: the owner (w1) is stopped while a
burst goes through the forwarder (w0); then the forwarder is stopped, the
owner continued (it stores the burst and confirms it to a forwarder that
never hears it) and the forwarder killed."""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import trio

from broker.client import open_client
from broker.workers._client import http_get
from broker.workers._supervisor import WorkerProcess
from tests.server.helpers import wait_until

from .test_supervisor import DEADLINE, running_workers, topics_of, worker_config

#: Publishes a burst carries through the forwarder while the owner is stopped.
BURST = 300
FORWARDED = "broker_forwarded_publishes_total"


@dataclass
class Pair:
    """The forwarder (w0) and the owner (w1) of ``topic``, and their addresses."""

    forwarder: WorkerProcess
    owner: WorkerProcess
    topic: str
    at_forwarder: str
    at_owner: str


@asynccontextmanager
async def forwarder_and_owner(tmp_path: Path) -> AsyncIterator[Pair]:
    async with running_workers(worker_config(tmp_path), 2) as supervisor:
        w0, w1 = supervisor.workers
        assert w0.pid is not None and w1.pid is not None
        yield Pair(
            w0,
            w1,
            topics_of("w1", ["w0", "w1"], 1)[0],
            f"127.0.0.1:{w0.direct.getsockname()[1]}",
            f"127.0.0.1:{w1.direct.getsockname()[1]}",
        )
        # The owner knew the burst again: at least that much was sent twice.
        assert await metric(w1.metrics, "broker_forwarded_duplicates_total") >= BURST
        assert w0.restarts == 1 and w0.last_exit == -signal.SIGKILL


async def metric(address: tuple[str, int] | None, name: str) -> float:
    """The sum of the samples of ``name`` in a worker's ``/metrics``."""
    assert address is not None
    status, body = await http_get(address, "/metrics")
    assert status == 200
    lines = body.decode().splitlines()
    return sum(float(line.rpartition(" ")[2]) for line in lines if line.startswith(name))


async def kill_once_forwarded(pair: Pair, forwarded: float) -> None:
    """Once the forwarder has sent ``forwarded`` publishes on its link in
    all: stop it, continue the owner, and kill the forwarder."""
    forwarder, owner = pair.forwarder, pair.owner
    assert forwarder.pid is not None and owner.pid is not None
    with trio.fail_after(DEADLINE):
        while True:
            if await metric(forwarder.metrics, FORWARDED) >= forwarded:
                break
            await trio.sleep(0.01)
    os.kill(forwarder.pid, signal.SIGSTOP)
    os.kill(owner.pid, signal.SIGCONT)
    await trio.sleep(0.2)
    os.kill(forwarder.pid, signal.SIGKILL)


async def stored(pair: Pair, count: int) -> list[bytes]:
    """The topic's first ``count`` records at the owner, and none after."""
    records: list[bytes] = []
    async with (
        open_client(pair.at_owner, name="reader") as reader,
        reader.subscribe(pair.topic, start="earliest") as subscription,
    ):
        with trio.fail_after(DEADLINE):
            while len(records) < count:
                records.append((await subscription.receive()).payload)
        with trio.move_on_after(0.5):
            extra = await subscription.receive()
            raise AssertionError(f"stored after the last publish: {extra.payload!r}")
    return records


async def test_a_forwarder_killed_mid_stream_loses_nothing_and_stores_nothing_twice(
    tmp_path: Path,
) -> None:
    count = 4000
    async with forwarder_and_owner(tmp_path) as pair:
        async with open_client(pair.at_forwarder, name="pub", reconnect=DEADLINE) as publisher:
            for n in range(count):
                await publisher.publish(pair.topic, b"%d" % n)
                if n == count // 2:
                    await wait_until(lambda: publisher.statistics()["confirmed"] >= count // 4)
                    assert pair.owner.pid is not None
                    os.kill(pair.owner.pid, signal.SIGSTOP)  # the burst waits at the link
                if n == count // 2 + BURST:
                    await kill_once_forwarded(pair, n + 1)
            with trio.fail_after(DEADLINE):
                await publisher.flush()
            statistics = publisher.statistics()
            assert statistics["sessions_lost"] == 0 and statistics["resumes"] >= 1
        records = await stored(pair, count)
    assert records == [b"%d" % n for n in range(count)]  # once each, in order


async def test_publishers_of_several_sessions_through_a_killed_forwarder_store_each_once(
    tmp_path: Path,
) -> None:
    """Three publishers' batches share the link's frames (one origin run
    each)."""
    names = [b"a", b"b", b"c"]
    each = 1500
    async with forwarder_and_owner(tmp_path) as pair:
        waiting: list[bytes] = []
        go_on = trio.Event()

        async def publish(name: bytes) -> None:
            async with open_client(pair.at_forwarder, name="pub", reconnect=DEADLINE) as client:
                for n in range(each):
                    await client.publish(pair.topic, b"%s %d" % (name, n))
                    if n == each // 3:
                        # Forwarded and confirmed a while: then the owner stops.
                        await wait_until(lambda: client.statistics()["confirmed"] > 0)
                        waiting.append(name)
                        await go_on.wait()
                with trio.fail_after(DEADLINE):
                    await client.flush()
                assert client.statistics()["sessions_lost"] == 0

        with trio.fail_after(DEADLINE):
            async with trio.open_nursery() as nursery:
                for name in names:
                    nursery.start_soon(publish, name)
                await wait_until(lambda: len(waiting) == len(names))
                assert pair.owner.pid is not None
                os.kill(pair.owner.pid, signal.SIGSTOP)  # the burst waits at the link
                before = await metric(pair.forwarder.metrics, FORWARDED)
                go_on.set()
                await kill_once_forwarded(pair, before + BURST)
        records = await stored(pair, len(names) * each)
    for name in names:
        mine = [record for record in records if record.startswith(name + b" ")]
        assert mine == [b"%s %d" % (name, n) for n in range(each)], name
