"""Forwarding between the workers of a multi-worker broker: a client that
did not ask for metadata publishes and subscribes to any topic through any
worker; the worker that does not own the topic forwards to the owner."""

from __future__ import annotations

from pathlib import Path

import trio

from broker.client import open_client
from broker.metrics import stat_document

from .helpers import TIMEOUT, wait_until
from .workers import owned_by, running_workers, url

IDS = ["w0", "w1"]


async def test_publish_through_a_non_owner_reaches_subscribers_of_both(tmp_path: Path) -> None:
    (topic,) = owned_by("w1", IDS, "news-")
    count = 500
    async with (
        running_workers(tmp_path) as (w0, w1),
        open_client(url(w1), name="at-owner") as at_owner,
        open_client(url(w0), name="via-w0") as via_w0,
        open_client(url(w0), name="publisher") as publisher,
        at_owner.subscribe(topic) as direct,
        via_w0.subscribe(topic) as forwarded,
    ):
        # (The forwarded one is made at the owner a round trip later.)
        await wait_until(lambda: w1.statistics().subscriptions == 2, what="subscriptions")
        with trio.fail_after(TIMEOUT):
            for n in range(count):
                await publisher.publish(topic, b"%d" % n)
            await publisher.flush()
            for subscription in (direct, forwarded):
                got = [int((await subscription.receive()).payload) for _ in range(count)]
                assert got == list(range(count))
        links = w0.link_statistics()
        assert links is not None and w1.link_statistics() == ()  # (w1 forwarded nothing)
        document = stat_document(w0)
        assert document["broker"]["links"][0]["owner"] == "w1"
        assert document["broker"]["links"][0]["publishes_forwarded"] == count
        assert [link.owner for link in links] == ["w1"]
        assert links[0].open and links[0].publishes_in_flight == 0
        assert links[0].publishes_forwarded == count
        assert links[0].subscriptions_forwarded == 1
        assert topic in w1.topics and not w1.topics[topic].forwarded
        assert w0.topics[topic].forwarded


async def test_a_publish_is_confirmed_only_once_the_owner_confirmed_it(tmp_path: Path) -> None:
    """While the link to the owner cannot be opened, publishes through the
    forwarder stay unconfirmed (flush waits) and charged to their publisher;
    once the link opens, the owner routes them, then the client's Confirm
    comes: when flush returns, the owner has every message."""
    (topic,) = owned_by("w1", IDS, "held-")
    count = 50
    async with running_workers(tmp_path, data=True) as (w0, w1):
        assert w0.worker is not None
        right = w0.worker.link_paths["w1"]
        w0.worker.link_paths["w1"] = str(tmp_path / "nowhere")  # type: ignore[index]
        async with open_client(url(w0), name="publisher") as publisher:
            for n in range(count):
                await publisher.publish(topic, b"%d" % n)
            with trio.move_on_after(0.5) as waited:
                await publisher.flush()
            assert waited.cancelled_caught  # no Confirm without the owner's
            (link,) = w0.link_statistics()
            assert not link.open and link.publishes_in_flight == count
            assert link.bytes_in_flight > 0
            assert w0.connections and any(c.account.debt > 0 for c in w0.connections.values())
            w0.links.links["w1"].path = right  # type: ignore[union-attr]
            with trio.fail_after(TIMEOUT):
                await publisher.flush()
            assert w1.topics[topic].messages_in == count  # routed (written) at the owner first
            (link,) = w0.link_statistics()
            assert link.open and link.publishes_in_flight == 0 and link.bytes_in_flight == 0
        async with (
            open_client(url(w1), name="reader") as reader,
            reader.subscribe(topic, start="earliest") as subscription,
        ):
            with trio.fail_after(TIMEOUT):
                got = [int((await subscription.receive()).payload) for _ in range(count)]
        assert got == list(range(count))


async def test_more_forwarded_topics_than_a_link_can_fund_at_once(tmp_path: Path) -> None:
    """A link is one connection to the owner, funded from one connection
    budget (here three topics' worth): twelve clients publishing at once to
    twelve topics through the forwarder all get everything confirmed (the
    link frees idle topics' handles when the owner withholds a channel), and
    the owner's logs hold every message, in order."""
    frame = 64 * 1024 + 64
    budget = 2 * 16 * 1024 + 3 * frame
    topics = owned_by("w1", IDS, "many-", 12)
    per_topic = 200
    async with running_workers(tmp_path, data=True, connection_budget=budget) as (w0, w1):
        flushed: list[str] = []

        async def publish(topic: str) -> None:
            async with open_client(url(w0), name=f"pub-{topic}") as publisher:
                for n in range(per_topic):
                    await publisher.publish(topic, b"%d" % n)
                await publisher.flush()
                flushed.append(topic)
                # Every publisher (so every forwarding topic) stays until all flushed.
                await wait_until(lambda: len(flushed) == len(topics), what="every flush")

        with trio.fail_after(4 * TIMEOUT):
            async with trio.open_nursery() as nursery:
                for topic in topics:
                    nursery.start_soon(publish, topic)
        (link,) = w0.link_statistics()
        assert link.publishes_forwarded >= len(topics) * per_topic
        assert link.publishes_in_flight == 0
        for topic in topics:
            async with (
                open_client(url(w1), name="reader") as reader,
                reader.subscribe(topic, start="earliest") as subscription,
            ):
                with trio.fail_after(TIMEOUT):
                    got = [int((await subscription.receive()).payload) for _ in range(per_topic)]
                assert got == list(range(per_topic)), topic
