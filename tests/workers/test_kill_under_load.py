"""A worker killed with SIGKILL while a publisher it forwards for is
publishing flat out: the owner's log holds every publish exactly once, in
the publisher's order. Those in flight at the kill (stored by the owner, not
yet confirmed to the client) come again after the client resumes, and the
owner knows them by their origin (``broker.server._seen``)."""

from __future__ import annotations

import os
import signal
from collections import Counter
from pathlib import Path

import trio

from broker.client import open_client
from broker.workers._client import http_get

from ..server.helpers import wait_until
from .test_supervisor import DEADLINE, running_workers, topics_of, worker_config

#: Messages published; the kill comes at the middle one, and a burst after.
COUNT = 4000
BURST = 300


async def metric(address: tuple[str, int] | None, name: str) -> float:
    """The sum of the samples of ``name`` in a worker's ``/metrics``."""
    assert address is not None
    status, body = await http_get(address, "/metrics")
    assert status == 200
    lines = body.decode().splitlines()
    return sum(float(line.rpartition(" ")[2]) for line in lines if line.startswith(name))


async def test_a_forwarder_killed_mid_stream_loses_nothing_and_stores_nothing_twice(
    tmp_path: Path,
) -> None:
    config = worker_config(tmp_path)
    async with running_workers(config, 2) as supervisor:
        w0, w1 = supervisor.workers
        assert w0.pid is not None and w1.pid is not None
        topic = topics_of("w1", ["w0", "w1"], 1)[0]  # owned by w1, published at w0
        url0 = f"127.0.0.1:{w0.direct.getsockname()[1]}"
        url1 = f"127.0.0.1:{w1.direct.getsockname()[1]}"
        async with open_client(url0, name="pub", reconnect=DEADLINE) as publisher:
            confirmed_at_kill = -1
            for n in range(COUNT):
                await publisher.publish(topic, b"%d" % n)
                if n == COUNT // 2:
                    await wait_until(lambda: publisher.statistics()["confirmed"] >= COUNT // 4)
                    # The owner pauses: what the forwarder sends it now waits.
                    os.kill(w1.pid, signal.SIGSTOP)
                if n == COUNT // 2 + BURST:
                    # The burst is on its way to the owner. The forwarder
                    # stops, the owner stores the burst and confirms it, and
                    # the forwarder dies without hearing those Confirms: it
                    # never counted the burst as routed, and its client
                    # sends it again once its session resumes.
                    forwarded = "broker_forwarded_publishes_total"
                    with trio.fail_after(DEADLINE):
                        while True:
                            if await metric(w0.metrics, forwarded) > COUNT // 2 + BURST:
                                break
                            await trio.sleep(0.01)
                    confirmed_at_kill = publisher.statistics()["confirmed"]
                    os.kill(w0.pid, signal.SIGSTOP)
                    os.kill(w1.pid, signal.SIGCONT)
                    await trio.sleep(0.2)
                    os.kill(w0.pid, signal.SIGKILL)
            with trio.fail_after(DEADLINE):
                await publisher.flush()
            statistics = publisher.statistics()
            assert statistics["sessions_lost"] == 0 and statistics["resumes"] >= 1
        assert w0.restarts == 1 and w0.last_exit == -signal.SIGKILL
        assert COUNT // 4 <= confirmed_at_kill <= COUNT // 2 + 1
        # The owner knew them again: the burst at least was sent twice.
        assert await metric(w1.metrics, "broker_forwarded_duplicates_total") >= BURST

        stored: list[int] = []
        async with (
            open_client(url1, name="reader") as reader,
            reader.subscribe(topic, start="earliest") as subscription,
        ):
            with trio.fail_after(DEADLINE):
                while not stored or stored[-1] != COUNT - 1:
                    stored.append(int((await subscription.receive()).payload))
            # Nothing is stored after the last publish's first copy.
            with trio.move_on_after(0.5):
                extra = await subscription.receive()
                raise AssertionError(f"stored after the last publish: {extra.payload!r}")

    repeated = [n for n, copies in Counter(stored).items() if copies > 1]
    assert repeated == []
    assert stored == list(range(COUNT))  # none lost, in order


async def test_publishers_of_several_sessions_through_a_killed_forwarder_store_each_once(
    tmp_path: Path,
) -> None:
    """Three publishers' batches share the link's frames (one origin run
    each): after the same stop-and-kill as above, each publisher's messages
    are in the owner's log once each, in its order."""
    names = ["a", "b", "c"]
    each = 1500
    config = worker_config(tmp_path)
    async with running_workers(config, 2) as supervisor:
        w0, w1 = supervisor.workers
        assert w0.pid is not None and w1.pid is not None
        topic = topics_of("w1", ["w0", "w1"], 1)[0]  # owned by w1, published at w0
        url0 = f"127.0.0.1:{w0.direct.getsockname()[1]}"
        url1 = f"127.0.0.1:{w1.direct.getsockname()[1]}"
        forwarded = "broker_forwarded_publishes_total"
        waiting: list[str] = []
        go_on = trio.Event()

        async def publish(name: str) -> None:
            async with open_client(url0, name=name, reconnect=DEADLINE) as publisher:
                for n in range(each):
                    await publisher.publish(topic, b"%s %d" % (name.encode(), n))
                    if n == each // 3:
                        # Forwarded and confirmed a while: then the owner stops.
                        await wait_until(lambda: publisher.statistics()["confirmed"] > 0)
                        waiting.append(name)
                        await go_on.wait()
                with trio.fail_after(DEADLINE):
                    await publisher.flush()
                assert publisher.statistics()["sessions_lost"] == 0

        with trio.fail_after(DEADLINE):
            async with trio.open_nursery() as nursery:
                for name in names:
                    nursery.start_soon(publish, name)
                await wait_until(lambda: len(waiting) == len(names))
                os.kill(w1.pid, signal.SIGSTOP)  # the owner pauses
                before = await metric(w0.metrics, forwarded)
                go_on.set()
                while True:
                    if await metric(w0.metrics, forwarded) >= before + BURST:
                        break
                    await trio.sleep(0.01)
                os.kill(w0.pid, signal.SIGSTOP)
                os.kill(w1.pid, signal.SIGCONT)
                await trio.sleep(0.2)
                os.kill(w0.pid, signal.SIGKILL)
        assert w0.restarts == 1
        assert await metric(w1.metrics, "broker_forwarded_duplicates_total") >= BURST

        stored: dict[str, list[int]] = {name: [] for name in names}
        async with (
            open_client(url1, name="reader") as reader,
            reader.subscribe(topic, start="earliest") as subscription,
        ):
            with trio.fail_after(DEADLINE):
                while sum(map(len, stored.values())) < len(names) * each:
                    name, number = (await subscription.receive()).payload.split()
                    stored[name.decode()].append(int(number))
            with trio.move_on_after(0.5):
                extra = await subscription.receive()
                raise AssertionError(f"stored after the last publish: {extra.payload!r}")
    for name in names:
        assert stored[name] == list(range(each)), name
