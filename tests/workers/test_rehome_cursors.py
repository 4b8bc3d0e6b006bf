"""Durable cursors survive a change of ``--workers``: one process, then two
workers, then one again, on one data directory; each cursor goes on after
the last message it took, whichever process owns its topic."""

from __future__ import annotations

from pathlib import Path

import trio

from broker.client import open_client

from ..server.helpers import running_broker, url
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
