"""``broker serve --workers N`` end to end: a client that does not ask for
the membership, at the public address (an arbitrary worker), publishes to and
subscribes to topics of every worker; the workers forward to the owners."""

from __future__ import annotations

from pathlib import Path

import trio

from broker.client import open_client
from broker.workers._client import http_get

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


async def test_forwarded_traffic_is_counted_once_in_the_workers_metrics(tmp_path: Path) -> None:
    """The owner used to count another worker's link as a client connection,
    and what it carried as messages received and sent: the merged metrics of
    ``--workers 2`` said 2,000 messages in and out for 1,000, two
    connections, topics and subscriptions for one of each."""
    ids = ["w0", "w1"]
    topic = topics_of("w0", ids, 1)[0]
    count = 300
    async with running_workers(worker_config(tmp_path), 2) as supervisor:
        w0, w1 = supervisor.workers
        at_w1 = f"127.0.0.1:{w1.direct.getsockname()[1]}"  # (w0 owns the topic)
        async with (
            open_client(at_w1, name="subscriber") as subscriber,
            subscriber.subscribe(topic) as subscription,
            open_client(at_w1, name="publisher") as publisher,
        ):
            for n in range(count):
                await publisher.publish(topic, b"%d" % n)
            await publisher.flush()
            with trio.fail_after(DEADLINE):
                for _ in range(count):
                    await subscription.receive()
            totals: dict[str, float] = {}
            for worker in (w0, w1):
                assert worker.metrics is not None
                status, body = await http_get(worker.metrics, "/metrics")
                assert status == 200
                for line in body.decode().splitlines():
                    name, _, value = line.partition(" ")
                    if name in SUMMED:
                        totals[name] = totals.get(name, 0.0) + float(value)
        assert totals == {
            "broker_connections_open": 2.0,
            "broker_received_messages_total": count,
            "broker_sent_messages_total": count,
            "broker_topics": 1.0,
            "broker_subscriptions": 1.0,
            'broker_sessions{state="connected"}': 2.0,
            "broker_sessions_created_total": 2.0,
        }


SUMMED = {
    "broker_connections_open",
    "broker_received_messages_total",
    "broker_sent_messages_total",
    "broker_topics",
    "broker_subscriptions",
    'broker_sessions{state="connected"}',
    "broker_sessions_created_total",
}
