"""Durable cursors and sessions survive a change of ``--workers``: one
process, then two workers, then one again, on one data directory; each
cursor goes on after the last message it took, whichever process owns its
topic, and a client's session resumes with nothing lost or repeated."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import trio

from broker.client import open_client
from tests.server.helpers import running_broker, url

from .test_supervisor import DEADLINE, running_workers, topics_of, worker_config


async def take(address: str, topic: str, count: int) -> list[int | None]:
    """The offsets of the next ``count`` messages cursor ``c`` takes of ``topic``."""
    async with (
        open_client(address, name="reader") as reader,
        reader.subscribe(topic, start="earliest", cursor="c") as subscription,
    ):
        with trio.fail_after(DEADLINE):
            return [(await subscription.receive()).offset for _ in range(count)]


async def test_durable_cursors_follow_their_topics_when_the_worker_count_changes(
    tmp_path: Path,
) -> None:
    config = worker_config(tmp_path)
    topics = topics_of("w0", ["w0", "w1"], 1) + topics_of("w1", ["w0", "w1"], 1)
    async with running_broker(config) as broker, open_client(url(broker)) as publisher:
        for topic in topics:
            for n in range(30):
                await publisher.publish(topic, b"%d" % n)
        await publisher.flush()
        for topic in topics:
            assert await take(url(broker), topic, 10) == list(range(1, 11))

    async with running_workers(config, 2) as supervisor:
        for worker, topic in zip(supervisor.workers, topics, strict=True):
            direct = f"127.0.0.1:{worker.direct.getsockname()[1]}"  # (the owner)
            assert await take(direct, topic, 10) == list(range(11, 21))

    async with running_broker(config) as broker:
        for topic in topics:
            assert await take(url(broker), topic, 10) == list(range(21, 31))


class Held:
    """A broker (a context manager) served in a task of its own until :meth:`stop`."""

    def __init__(self, manager: AbstractAsyncContextManager[Any]) -> None:
        self.manager = manager
        self._stop, self._done = trio.Event(), trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[Any]) -> None:
        try:
            async with self.manager as served:
                task_status.started(served)
                await self._stop.wait()
        finally:
            self._done.set()

    async def stop(self) -> None:
        self._stop.set()
        await self._done.wait()


async def test_a_session_resumes_across_one_process_two_workers_and_one_again(
    tmp_path: Path,
) -> None:
    config = worker_config(tmp_path)
    topic = topics_of("w1", ["w0", "w1"], 1)[0]
    got: list[bytes] = []
    async with trio.open_nursery() as nursery:
        held = Held(running_broker(config))
        address = url(await nursery.start(held.run))
        async with (
            open_client(address, name="sub", reconnect=DEADLINE) as subscriber,
            subscriber.subscribe(topic) as subscription,
            open_client(address, name="pub", reconnect=DEADLINE) as publisher,
        ):

            async def publish_and_receive(start: int) -> None:
                with trio.fail_after(DEADLINE):
                    for n in range(start, start + 20):
                        await publisher.publish(topic, b"%d" % n)
                    await publisher.flush()
                    while len(got) < start + 20:
                        got.append((await subscription.receive()).payload)

            await publish_and_receive(0)
            await held.stop()
            moved = worker_config(tmp_path, listen=address)
            held = Held(running_workers(moved, 2))
            await nursery.start(held.run)
            await publish_and_receive(20)
            await held.stop()
            held = Held(running_broker(moved))
            await nursery.start(held.run)
            await publish_and_receive(40)
            statistics = [client.statistics() for client in (subscriber, publisher)]
        await held.stop()
    assert got == [b"%d" % n for n in range(60)]
    assert all(s["sessions_lost"] == 0 and s["resumes"] >= 2 for s in statistics)
