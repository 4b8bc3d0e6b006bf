"""Lossy and latest subscriptions through a worker that does not own the
topic keep their dropping queue at the subscriber's worker, fed by the link:
a stalled subscriber holds neither the link nor the owner (each keeps at
most its ``max_queued``), and its numbering goes on across a broken link.
(The bounds and exact counts end to end, with worker processes:
``tests/workers/test_forwarded_dropping.py``.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from broker.client import Message, Subscription, open_client
from broker.protocol import Policy
from broker.server import Broker, DroppingSubscription
from broker.server.cluster import _link as link_module
from broker.server.cluster._link import Link, _LinkPolicy

from .helpers import TIMEOUT, cut_links, wait_until
from .workers import owned_by, running_workers, url

IDS = ["w0", "w1"]


def queue_of(broker: Broker, topic: str) -> DroppingSubscription:
    """The one dropping subscription to ``topic`` at ``broker``."""
    found = [
        subscription
        for connection in broker.connections.values()
        for subscription in connection.subscriptions.values()
        if subscription.topic.topic_name == topic
    ]
    assert len(found) == 1, found
    (subscription,) = found
    assert isinstance(subscription, DroppingSubscription)
    return subscription


async def drain(subscription: Subscription, total: int) -> list[Message]:
    messages: list[Message] = []
    with trio.fail_after(TIMEOUT):
        while len(messages) + subscription.missed < total:
            messages.append(await subscription.receive())
    return messages


@pytest.mark.parametrize("mode", ["lossy", "latest"])
async def test_a_stalled_subscriber_holds_neither_the_link_nor_the_owner(
    tmp_path: Path, mode: str
) -> None:
    (topic,) = owned_by("w1", IDS, "stalled-")
    published = 3000
    max_queued = 50
    async with (
        running_workers(tmp_path) as (w0, w1),
        open_client(url(w0), name="sub", policy=Policy(deliver_capacity=1024)) as subscriber,
        open_client(url(w1), name="pub") as publisher,
        subscriber.subscribe(topic, mode=mode, options={"max_queued": max_queued}) as sub,
    ):
        await wait_until(lambda: w1.statistics().subscriptions == 1, what="made at the owner")
        here, there = queue_of(w0, topic), queue_of(w1, topic)
        assert w0.topics[topic].forwarded and not w1.topics[topic].forwarded
        with trio.fail_after(TIMEOUT):
            for n in range(published):
                # (Distinct keys: latest replaces nothing, it drops the oldest as lossy does.)
                await publisher.publish(topic, b"%05d" % n + b"." * 200, key=b"%d" % n)
                assert here.queued <= max_queued and there.queued <= max_queued
            await publisher.flush()
        # The owner sends everything on (the link never withholds guarantees
        # for it): it is this worker that drops.
        # (What the owner sent may still be on its way over the link: wait
        # for the link to have relayed all of it, not only for the owner.)
        await wait_until(
            lambda: (
                not there.queued
                and w0.link_statistics()[0].deliveries_relayed == there.delivered
                and here.dropped_overflow > published // 2
            ),
            what="the owner's queue emptied into the subscriber's worker",
        )
        assert here.queued <= max_queued
        messages = await drain(sub, published)
        assert sub.missed == published - len(messages) > published // 2
        assert messages[-1].payload.startswith(b"%05d" % (published - 1))
    await wait_until(lambda: not w0.connections and w0.account.debt == 0, what="w0 idle")


@pytest.mark.parametrize("mode", ["lossy", "latest"])
async def test_numbering_goes_on_across_a_broken_link(tmp_path: Path, mode: str) -> None:
    """A subscriber that keeps up gets every message before and after the
    link is cut and made again, numbered on from where it was (the owner's
    new subscription numbers from 1 again)."""
    (topic,) = owned_by("w1", IDS, "cut-")
    async with (
        running_workers(tmp_path) as (w0, w1),
        open_client(url(w0), name="sub") as subscriber,
        open_client(url(w1), name="pub") as publisher,
        subscriber.subscribe(topic, mode=mode) as sub,
    ):
        got: list[Message] = []

        async def one_round(round_: int) -> None:
            await wait_until(lambda: w1.statistics().subscriptions == 1, what="made at the owner")
            with trio.fail_after(TIMEOUT):
                for n in range(100):
                    await publisher.publish(topic, b"%d %d" % (round_, n), key=b"%d" % n)
                await publisher.flush()
                while len(got) < 100 * (round_ + 1):
                    got.append(await sub.receive())

        await one_round(0)
        (link,) = w0.link_statistics()
        assert cut_links(w1) == 1
        await wait_until(
            lambda: w0.link_statistics()[0].connects > link.connects,  # type: ignore[index]
            what="the link made again",
        )
        await one_round(1)
        assert [m.payload for m in got] == [b"%d %d" % (r, n) for r in range(2) for n in range(100)]
        assert [m.seq for m in got] == list(range(1, 201))
        assert sub.missed == 0


class _NarrowLinkPolicy(_LinkPolicy):
    """A link policy with room for about four deliveries per subscription."""

    def __init__(self, link: Link) -> None:
        super().__init__(link)
        self.deliver_capacity = 1024


@pytest.mark.parametrize("mode", ["lossy", "latest"])
async def test_what_the_owner_drops_reaches_the_subscriber_as_gaps(
    tmp_path: Path, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A link that cannot keep up (a narrow window) makes the owner's own
    queue drop: its Gaps become holes in the forwarder's numbering,
    reported in order with the forwarder's own drops; deliveries plus Gaps
    are exactly what was published."""
    monkeypatch.setattr(link_module, "_LinkPolicy", _NarrowLinkPolicy)
    (topic,) = owned_by("w1", IDS, "narrow-")
    published = 3000
    async with (
        running_workers(tmp_path) as (w0, w1),
        open_client(url(w0), name="sub", policy=Policy(deliver_capacity=1024)) as subscriber,
        open_client(url(w1), name="pub") as publisher,
        subscriber.subscribe(topic, mode=mode, options={"max_queued": 50}) as sub,
    ):
        await wait_until(lambda: w1.statistics().subscriptions == 1, what="made at the owner")
        here, there = queue_of(w0, topic), queue_of(w1, topic)
        with trio.fail_after(TIMEOUT):
            for n in range(published):
                payload = b"%05d" % n + b"." * 200
                try:
                    # (Without yielding: the publishes go in writes as large as
                    # the guarantees allow, and the owner routes hundreds of
                    # them in one read, far more than its queue and the link's
                    # window hold together.)
                    publisher.publish_nowait(topic, payload, key=b"%d" % n)
                except trio.WouldBlock:
                    await publisher.publish(topic, payload, key=b"%d" % n)
            await publisher.flush()
        messages = await drain(sub, published)
        assert there.dropped_overflow > 0 and there.gaps_sent > 0  # (the owner dropped)
        assert len(messages) + sub.missed == published
        # Each missed one was dropped once: at the owner or at the forwarder.
        assert sub.missed == there.dropped + here.dropped
        seqs = [m.seq for m in messages]
        assert seqs == sorted(set(seqs)) and seqs[-1] <= published
        assert messages[-1].payload.startswith(b"%05d" % (published - 1))
