"""``broker serve --workers N`` end to end: a client that does not ask for
the membership, at the public address (an arbitrary worker), publishes to and
subscribes to topics of every worker; the workers forward to the owners."""

from __future__ import annotations

from pathlib import Path

import trio

from broker.client import open_client

from .test_supervisor import DEADLINE, running_workers, topics_of, worker_config


async def test_a_plain_client_at_the_public_address_uses_every_workers_topics(
    tmp_path: Path,
) -> None:
    ids = ["w0", "w1"]
    topics = topics_of("w0", ids, 2) + topics_of("w1", ids, 2)
    count = 200
    async with running_workers(worker_config(tmp_path), 2) as supervisor:
        host, port = supervisor.address
        public = f"{host}:{port}"
        async with (
            open_client(public, name="subscriber") as subscriber,
            open_client(public, name="publisher") as publisher,
        ):
            received: dict[str, list[bytes]] = {}

            async def consume(topic: str, ready: trio.Event) -> None:
                async with subscriber.subscribe(topic, start="earliest") as subscription:
                    ready.set()
                    got = received[topic] = []
                    while len(got) < count:
                        got.append((await subscription.receive()).payload)

            with trio.fail_after(DEADLINE):
                async with trio.open_nursery() as nursery:
                    for topic in topics:
                        ready = trio.Event()
                        nursery.start_soon(consume, topic, ready)
                        await ready.wait()
                    for n in range(count):
                        for topic in topics:
                            await publisher.publish(topic, b"%s %d" % (topic.encode(), n))
                    await publisher.flush()
        for topic in topics:
            assert received[topic] == [b"%s %d" % (topic.encode(), n) for n in range(count)]
