"""Forwarding between workers under load and failures: resumed sessions
behind a forwarder, a slow subscriber behind a forwarder, both directions
saturated at once, and a link that breaks."""

from __future__ import annotations

import random
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
import trio

from broker.client import open_client
from broker.server import Broker
from tests.proxy import cut_on_progress, proxied

from .helpers import TIMEOUT, cut_links, wait_until
from .workers import owned_by, running_workers, url

IDS = ["w0", "w1"]


async def wait_for_subscriptions(owner: Broker, count: int) -> None:
    """Until ``owner`` has ``count`` subscriptions (forwarded ones made there)."""
    await wait_until(lambda: owner.statistics().subscriptions >= count, what="subscriptions")


@pytest.mark.parametrize("data", [False, True], ids=["memory-only", "topic-logs"])
async def test_a_subscriber_behind_a_forwarder_resumes_without_loss(
    tmp_path: Path, data: bool
) -> None:
    """A reliable subscription through the non-owner, its client cut at
    random moments (a proxy in front of the forwarder) and resuming its
    session: every message exactly once, in order (with logs: seq = offset)."""
    (topic,) = owned_by("w1", IDS, "resumed-")
    count = 2000
    rng = random.Random(20261128)
    received: list[int] = []
    seqs: list[int] = []
    async with (
        running_workers(tmp_path, data=data, heartbeat=0.5, lease=5.0) as (w0, w1),
        proxied(w0.address) as proxy,
    ):
        async with (
            open_client(url(w1), name="pub") as publisher,
            open_client(proxy.url, name="sub", reconnect=TIMEOUT) as subscriber,
            subscriber.subscribe(topic) as subscription,
        ):
            await wait_for_subscriptions(w1, 1)

            async def consume() -> None:
                with trio.fail_after(4 * TIMEOUT):
                    while len(received) < count:
                        message = await subscription.receive()
                        received.append(int(message.payload))
                        seqs.append(message.seq)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(consume)
                nursery.start_soon(
                    lambda: cut_on_progress(
                        proxy,
                        lambda: len(received),
                        lambda: len(received) >= count,
                        step=100,
                        pause=lambda: rng.uniform(0.0, 0.02),
                    )
                )
                with trio.fail_after(4 * TIMEOUT):
                    for n in range(count):
                        if n and n % (count // 4) == 0:
                            # Three cuts of its own, each once the subscriber
                            # has resumed from the one before.
                            before = proxy.connections
                            proxy.cut()
                            await wait_until(lambda b=before: proxy.connections > b, what="resume")
                        await publisher.publish(topic, b"%d" % n)
                    await publisher.flush()
            stats = subscriber.statistics()
        assert received == list(range(count))
        if data:
            assert seqs == list(range(1, count + 1))
        assert proxy.cuts >= 2
        assert stats["sessions_lost"] == 0 and stats["resumes"] >= 2


async def test_a_slow_subscriber_behind_a_forwarder_keeps_its_debt_bounded(
    tmp_path: Path,
) -> None:
    """A subscriber through the forwarder that reads nothing: what the
    forwarder holds for it stays within its watermark plus one link channel
    of deliveries, while another topic through the same link flows; then
    it reads everything, in order."""
    slow_topic, fast_topic = owned_by("w1", IDS, "flow-", 2)
    payload = b"x" * 1000
    fast_count = 3000
    async with running_workers(tmp_path, data=True) as (w0, w1):
        config = w0.config
        async with (
            open_client(url(w0), name="slow") as slow,
            open_client(url(w0), name="fast") as fast,
            open_client(url(w1), name="pub-slow") as pub_slow,
            open_client(url(w1), name="pub-fast") as pub_fast,
            slow.subscribe(slow_topic) as slow_sub,
            fast.subscribe(fast_topic) as fast_sub,
        ):
            await wait_for_subscriptions(w1, 2)
            published = 0

            async def publish_slow() -> None:
                nonlocal published
                while True:
                    await pub_slow.publish(slow_topic, payload)
                    published += 1

            async with trio.open_nursery() as nursery:
                nursery.start_soon(publish_slow)
                with trio.fail_after(4 * TIMEOUT):
                    for n in range(fast_count):
                        await pub_fast.publish(fast_topic, b"%d" % n)
                    got = [int((await fast_sub.receive()).payload) for _ in range(fast_count)]
                    assert got == list(range(fast_count))
                    # Far more than the slow path may hold:
                    await wait_until(lambda: published >= 5000, what="publishes")
                bound = config.channel_high_watermark + 2 * 256 * 1024
                forwarded = [
                    account for account in _forward_accounts(w0) if slow_topic in account.name
                ]
                assert len(forwarded) == 1
                assert 0 < forwarded[0].debt <= bound
                assert w0.account.debt < 4 * bound
                nursery.cancel_scope.cancel()
            with trio.fail_after(4 * TIMEOUT):
                first = await slow_sub.receive()
                last = first.seq
                for _ in range(published - 1):
                    message = await slow_sub.receive()
                    assert message.seq == last + 1
                    last = message.seq


def _forward_accounts(broker: Broker) -> list[object]:
    """The accounts of the forwarded subscriptions of ``broker``'s clients."""
    accounts = []
    for connection in broker.connections.values():
        for subscription in connection.subscriptions.values():
            account = getattr(subscription, "account", None)
            if account is not None and subscription.topic.forwarded:
                accounts.append(account)
    return accounts


async def test_forwarding_saturated_both_ways_completes(tmp_path: Path) -> None:
    """w0 publishes flat out to topics w1 owns while w1 publishes flat out to
    topics w0 owns, each side subscribing through the other: every message
    arrives, in order (no deadlock, no starvation)."""
    to_w1 = owned_by("w1", IDS, "east-", 2)
    to_w0 = owned_by("w0", IDS, "west-", 2)
    count = 3000
    payload = b"y" * 200
    async with running_workers(tmp_path, data=True) as (w0, w1):
        async with (
            open_client(url(w0), name="pub-east") as pub_east,
            open_client(url(w1), name="pub-west") as pub_west,
            open_client(url(w1), name="sub-east") as sub_east,  # behind w1: w0's link
            open_client(url(w0), name="sub-west") as sub_west,  # behind w0: w1's link
        ):
            received: dict[str, list[int]] = {}

            async def consume(client_topic: tuple[object, str]) -> None:
                client, topic = client_topic
                async with client.subscribe(topic) as subscription:  # type: ignore[attr-defined]
                    ready.append(topic)
                    got = received[topic] = []
                    while len(got) < count:
                        got.append(int((await subscription.receive()).payload[200:]))

            async def publish(client: object, topics: list[str]) -> None:
                for n in range(count):
                    for topic in topics:
                        await client.publish(topic, payload + b"%d" % n)  # type: ignore[attr-defined]
                await client.flush()  # type: ignore[attr-defined]

            ready: list[str] = []
            with trio.fail_after(8 * TIMEOUT):
                async with trio.open_nursery() as nursery:
                    for topic in to_w1:
                        nursery.start_soon(consume, (sub_east, topic))
                    for topic in to_w0:
                        nursery.start_soon(consume, (sub_west, topic))
                    # Through both forwarders, made at the owners.
                    await wait_for_subscriptions(w1, 2)
                    await wait_for_subscriptions(w0, 2)
                    nursery.start_soon(publish, pub_east, to_w1)
                    nursery.start_soon(publish, pub_west, to_w0)
        for topic in [*to_w1, *to_w0]:
            assert received[topic] == list(range(count)), topic
        assert [link.owner for link in w0.link_statistics()] == ["w1"]
        assert [link.owner for link in w1.link_statistics()] == ["w0"]


@pytest.mark.parametrize("data", [False, True], ids=["memory-only", "topic-logs"])
async def test_a_broken_link_is_reopened_and_nothing_confirmed_is_lost(
    tmp_path: Path, data: bool
) -> None:
    """The owner's side of the link is cut three times while a client
    publishes through the forwarder: the link reopens, unconfirmed publishes
    are sent again (at least once at the hop), flush succeeds, and the owner
    has every message, the first copies in order. With logs, a subscription
    through the forwarder continues after its last offset: every record once."""
    (topic,) = owned_by("w1", IDS, "cut-")
    count = 3000
    async with (
        # (A lease longer than any wait here: a session left detached would stay.)
        running_workers(tmp_path, data=data, lease=4 * TIMEOUT) as (w0, w1),
        open_client(url(w1), name="at-owner") as at_owner,
        open_client(url(w0), name="via-w0") as via_w0,
        open_client(url(w0), name="publisher") as publisher,
        at_owner.subscribe(topic) as direct,
        via_w0.subscribe(topic) as forwarded,
    ):
        await wait_for_subscriptions(w1, 2)
        cuts = 0
        with trio.fail_after(4 * TIMEOUT):
            for n in range(count):
                await publisher.publish(topic, b"%d" % n)
                if n in (500, 1500, 2500):
                    await publisher.flush()
                    cuts += cut_links(w1)
            await publisher.flush()
            seen: list[int] = []
            while len(set(seen)) < count:
                seen.append(int((await direct.receive()).payload))
        assert cuts == 3
        firsts = list(dict.fromkeys(seen))
        assert firsts == list(range(count))
        (link,) = w0.link_statistics()
        assert link.connects >= 4 and link.publishes_in_flight == 0
        # A broken link's session ended with it: only the new one's subscription is left.
        await wait_until(lambda: w1.statistics().subscriptions == 2, what="old sessions gone")
        assert len(w1.sessions.sessions) == 2  # its client's and the link's
        if data:
            with trio.fail_after(4 * TIMEOUT):
                records = [await forwarded.receive() for _ in range(len(seen))]
            assert [int(r.payload) for r in records] == seen
            assert [r.seq for r in records] == list(range(1, len(seen) + 1))


async def test_subscriptions_whose_topic_handles_were_freed_are_made_again_after_a_break(
    tmp_path: Path,
) -> None:
    """30 forwarded subscriptions on one link, publishes through the
    forwarder to each (the owner withholds channels; the link frees the
    handles the made subscriptions no longer need); then the link is cut:
    every subscription is made again and gets what is published next."""
    topics = owned_by("w1", IDS, "freed-", 30)
    async with (
        running_workers(tmp_path, data=True, lease=4 * TIMEOUT) as (w0, w1),
        open_client(url(w0), name="holder") as holder,
        AsyncExitStack() as held,
    ):
        subscriptions = [await held.enter_async_context(holder.subscribe(t)) for t in topics]
        await wait_for_subscriptions(w1, len(topics))
        for round_, via in ((b"before", w0), (b"after", w1)):
            async with open_client(url(via), name="publisher") as publisher:
                for topic in topics:
                    await publisher.publish(topic, round_)
                with trio.fail_after(TIMEOUT):
                    await publisher.flush()
            for subscription in subscriptions:
                with trio.fail_after(TIMEOUT):
                    assert (await subscription.receive()).payload == round_
            if round_ == b"before":
                assert cut_links(w1) == 1
                await wait_until(
                    lambda: (
                        w0.link_statistics()[0].connects >= 2  # type: ignore[index]
                        and w1.statistics().subscriptions == len(topics)
                    ),
                    what="the link reopened and every subscription made again",
                )
