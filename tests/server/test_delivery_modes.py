"""Lossy and latest subscriptions, end to end over loopback: they drop instead
of slowing publishers, report exactly what they dropped (Gap), keep their
queues within their limits, and give everything back."""

from __future__ import annotations

import itertools

import trio

from broker.client import BlockingClient, ConnectionLost, Message, Subscription, open_client
from broker.metrics import stat_document
from broker.protocol import GoodbyeCode, Policy
from broker.server import Broker, DroppingSubscription

from .helpers import TIMEOUT, running_broker, url, wait_idle, wait_subscribed, wait_until

#: A subscriber that promises room for only ~8 small deliveries at a time.
SMALL_WINDOW = Policy(deliver_capacity=1024)
TWO_BIG = Policy(deliver_capacity=16 * 1024)


def dropping(broker: Broker, topic: str) -> DroppingSubscription:
    (subscription,) = broker.topics[topic].subscriptions
    assert isinstance(subscription, DroppingSubscription)
    return subscription


async def drain(subscription: Subscription, expected_total: int) -> list[Message]:
    """Receive until received + missed accounts for ``expected_total`` messages."""
    messages: list[Message] = []
    with trio.fail_after(TIMEOUT):
        while len(messages) + subscription.missed < expected_total:
            messages.append(await subscription.receive())
    return messages


def assert_gaps_match(messages: list[Message], missed: int) -> None:
    """Sequence numbers increase; the holes between them add up to ``missed``."""
    seqs = [m.seq for m in messages]
    assert seqs == sorted(set(seqs))
    holes = sum(b - a - 1 for a, b in itertools.pairwise(seqs)) + seqs[0] - 1
    assert holes == missed


async def test_a_stalled_lossy_subscriber_never_slows_the_publisher() -> None:
    published = 20_000
    payload = b"x" * 1000  # 20 MB in all: 20x the channel's high watermark
    async with running_broker() as broker:
        async with (
            open_client(url(broker), name="sub", policy=SMALL_WINDOW) as subscriber,
            open_client(url(broker), name="pub") as publisher,
            subscriber.subscribe("ticks", mode="lossy", options={"max_queued": 100}) as sub,
        ):
            await wait_subscribed(broker, "ticks")
            state = dropping(broker, "ticks")
            (channel,) = [c for conn in broker.connections.values() for c in conn.channels.values()]
            with trio.fail_after(TIMEOUT):
                for i in range(published):
                    await publisher.publish("ticks", i.to_bytes(4, "big") + payload)
                    assert state.queued <= 100
                    assert not channel.waiting  # never throttled
                await publisher.flush()
            # The publisher's channel paid only for routing, never for the queue.
            assert channel.account.statistics().peak_debt < broker.config.channel_high_watermark
            assert state.account.debt <= state.limits.max_queued_bytes
            messages = await drain(sub, published)
            assert sub.missed == state.dropped_overflow > published // 2
            assert_gaps_match(messages, sub.missed)
            # The newest messages are the ones kept.
            assert int.from_bytes(messages[-1].payload[:4], "big") == published - 1
        await wait_idle(broker)


async def test_latest_keeps_the_newest_value_of_every_key() -> None:
    keys = [f"k{i}".encode() for i in range(10)]
    rounds = 200
    async with running_broker() as broker:
        async with (
            open_client(url(broker), name="sub", policy=SMALL_WINDOW) as subscriber,
            open_client(url(broker), name="pub") as publisher,
            subscriber.subscribe("prices", mode="latest") as sub,
        ):
            await wait_subscribed(broker, "prices")
            for r in range(rounds):
                for key in keys:
                    await publisher.publish("prices", b"%s=%d" % (key, r), key=key)
            await publisher.flush()
            state = dropping(broker, "prices")
            await wait_until(lambda: state.queued <= len(keys), what="conflation")
            messages = await drain(sub, rounds * len(keys))
            assert_gaps_match(messages, sub.missed)
            assert sub.missed == state.dropped_replaced + state.dropped_overflow
            assert state.dropped_replaced > 0 and state.dropped_overflow == 0
            newest = {m.key: m.payload for m in messages}
            assert newest == {key: b"%s=%d" % (key, rounds - 1) for key in keys}
            document = stat_document(broker)
            (sub_doc,) = [s for c in document["connections"] for s in c["subscriptions"]]
            assert sub_doc["mode"] == "latest"
            assert sub_doc["dropped_replaced"] == state.dropped_replaced
        await wait_idle(broker)


async def test_a_byte_limit_bounds_a_lossy_queue() -> None:
    async with running_broker() as broker:
        async with (
            # Room for two deliveries at a time (a window smaller than one never gets any).
            open_client(
                url(broker), name="sub", policy=Policy(deliver_capacity=16 * 1024)
            ) as subscriber,
            open_client(url(broker), name="pub") as publisher,
            subscriber.subscribe(
                "big", mode="lossy", options={"max_queued": 1000, "max_queued_bytes": 64 * 1024}
            ) as sub,
        ):
            await wait_subscribed(broker, "big")
            state = dropping(broker, "big")
            window = 2 * (8004 + 64 + 128)  # what the writer may hold besides the queue
            for i in range(200):
                await publisher.publish("big", i.to_bytes(4, "big") + b"y" * 8000)
                assert state.account.debt <= 64 * 1024 + window
            await publisher.flush()
            assert state.queued <= 64 * 1024 // 8000
            messages = await drain(sub, 200)
            assert_gaps_match(messages, sub.missed)
        await wait_idle(broker)


async def test_a_reliable_subscriber_on_the_same_topic_still_gets_everything() -> None:
    async with running_broker() as broker:
        async with (
            open_client(url(broker), name="lossy", policy=SMALL_WINDOW) as slow,
            open_client(url(broker), name="reliable") as fast,
            open_client(url(broker), name="pub") as publisher,
            slow.subscribe("mixed", mode="lossy", options={"max_queued": 10}) as lossy,
            fast.subscribe("mixed") as reliable,
        ):
            await wait_subscribed(broker, "mixed", 2)
            async with trio.open_nursery() as nursery:

                async def consume() -> None:
                    for i in range(3000):
                        assert (await reliable.receive()).payload == b"%d" % i

                nursery.start_soon(consume)
                for i in range(3000):
                    await publisher.publish("mixed", b"%d" % i)
            messages = await drain(lossy, 3000)
            assert lossy.missed > 0
            assert_gaps_match(messages, lossy.missed)
        await wait_idle(broker)


async def test_bad_subscribe_options_are_refused_with_goodbye_1() -> None:
    async with running_broker() as broker:
        for mode, options in (
            ("lossy", {"max_queued": 0}),
            ("lossy", {"max_queued_bytes": 10}),
            ("latest", {"max_queued": "many"}),
            ("lossy", {"colour": "red"}),
            ("reliable", {"max_queued": 5}),
        ):
            with trio.fail_after(TIMEOUT):
                try:
                    async with (
                        open_client(url(broker)) as client,
                        client.subscribe("t", mode=mode, options=options) as subscription,
                    ):
                        await subscription.receive()
                    raise AssertionError(f"{mode} {options} was accepted")
                except ConnectionLost as error:
                    assert error.code == GoodbyeCode.PROTOCOL_ERROR, error
                    assert "Subscribe:" in error.reason
        await wait_idle(broker)


async def test_the_blocking_client_counts_what_it_missed() -> None:
    async with running_broker() as broker:

        def run() -> tuple[int, int, int]:
            with (
                BlockingClient(url(broker), policy=SMALL_WINDOW) as client,
                client.subscribe("b", mode="lossy", options={"max_queued": 5}) as sub,
                BlockingClient(url(broker)) as publisher,
            ):
                for i in range(500):
                    publisher.publish("b", b"%d" % i, timeout=TIMEOUT)
                publisher.flush(timeout=TIMEOUT)
                received = 0
                last = b""
                while received + sub.missed < 500:
                    last = sub.receive(timeout=TIMEOUT).payload
                    received += 1
                return received, sub.missed, int(last)

        received, missed, last = await trio.to_thread.run_sync(run)
        assert received + missed == 500 and missed > 0
        assert last == 499
        await wait_idle(broker)


async def test_a_connections_lossy_queues_together_stay_within_the_lossy_budget() -> None:
    budget = 64 * 1024
    async with running_broker(lossy_budget=budget) as broker:
        async with (
            open_client(url(broker), name="sub", policy=SMALL_WINDOW) as subscriber,
            open_client(url(broker), name="pub") as publisher,
            subscriber.subscribe("a", mode="lossy", options={"max_queued_bytes": 1 << 20}) as a,
            subscriber.subscribe("b", mode="latest", options={"max_queued_bytes": 1 << 20}) as b,
        ):
            await wait_subscribed(broker, "b")
            connection = next(c for c in broker.connections.values() if c.client_name == "sub")
            for i in range(300):
                await publisher.publish("a", b"%05d" % i + b"a" * 1000)
                await publisher.publish("b", b"%05d" % i + b"b" * 1000, key=b"%d" % i)
                assert connection.dropping_bytes <= budget
            await publisher.flush()
            for subscription in (a, b):
                messages = await drain(subscription, 300)
                assert subscription.missed > 0
                assert_gaps_match(messages, subscription.missed)
            assert connection.dropping_bytes == 0
        await wait_idle(broker)


async def test_a_full_sibling_queue_does_not_starve_a_prompt_subscriber() -> None:
    """The lossy budget is enforced on the connection's largest queue, and a
    delivery the subscriber has room for goes out before any limit applies."""
    budget = 64 * 1024
    async with (
        running_broker(lossy_budget=budget) as broker,
        open_client(url(broker), name="sub", policy=Policy(deliver_capacity=2048)) as client,
        open_client(url(broker), name="pub") as publisher,
        client.subscribe("slow", mode="lossy", options={"max_queued_bytes": 1 << 20}),
        client.subscribe("fast", mode="lossy") as fast,
        client.subscribe("big", mode="lossy", options={"max_queued_bytes": 1024}) as big,
    ):
        await wait_subscribed(broker, "big")
        for _ in range(200):  # "slow" is never read: it fills the budget
            await publisher.publish("slow", b"s" * 1000)
        await publisher.flush()
        with trio.fail_after(TIMEOUT):
            for i in range(50):  # "fast" is read as soon as it is published
                await publisher.publish("fast", b"f%04d" % i)
                assert (await fast.receive()).payload == b"f%04d" % i
            assert fast.missed == 0
            # A delivery larger than max_queued_bytes still goes to a subscriber with room.
            await publisher.publish("big", b"x" * 1500)
            assert len((await big.receive()).payload) == 1500


async def test_replaced_latest_entries_cannot_pile_up_behind_a_stalled_one() -> None:
    async with (
        running_broker() as broker,
        open_client(url(broker), name="sub", policy=SMALL_WINDOW) as client,
        open_client(url(broker), name="pub") as publisher,
        client.subscribe("ticker", mode="latest"),
    ):
        await wait_subscribed(broker, "ticker")
        state = dropping(broker, "ticker")
        for i in range(100):  # fill the window, then one key stalls at the head
            await publisher.publish("ticker", b"%d" % i, key=b"cold-%d" % i)
        for i in range(20_000):  # one hot key updated over and over
            await publisher.publish("ticker", b"%d" % i, key=b"hot")
        await publisher.flush()
        assert state.dropped_replaced >= 19_000
        assert len(state._entries) <= 2 * state.queued + 128


async def test_dropped_delivery_counters_survive_the_subscription() -> None:
    async with running_broker() as broker:
        async with (
            open_client(url(broker), name="sub", policy=SMALL_WINDOW) as client,
            open_client(url(broker), name="pub") as publisher,
        ):
            async with client.subscribe("c", mode="lossy", options={"max_queued": 2}):
                await wait_subscribed(broker, "c")
                # Far more than the window holds, even packed into DeliverMany frames.
                for i in range(1000):
                    await publisher.publish("c", b"%d" % i)
                await publisher.flush()
            connection = next(c for c in broker.connections.values() if c.client_name == "sub")
            await wait_until(lambda: not connection.subscriptions, what="the unsubscribe")
            assert connection.counters.deliveries_overflowed > 0
            document = stat_document(broker)
            (sub_doc,) = [c for c in document["connections"] if c["client"] == "sub"]
            assert sub_doc["counters"]["deliveries_overflowed"] > 0
        await wait_idle(broker)
