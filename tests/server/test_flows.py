"""Publish/subscribe through a real broker with the trio client: order,
fan-out, isolation of a slow topic, and a client that reads what it writes."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import trio

from broker.client import Client, ConnectionLost, Message, Subscription, open_client
from broker.config import KiB
from broker.protocol import Channel, ChannelKind, GoodbyeCode, Headers, Policy
from broker.server.connection._admission import Admission

from .helpers import (
    DEAF_CONFIG,
    TIMEOUT,
    assert_round_trip,
    connection_named,
    number_of,
    numbered,
    publish_until_throttled,
    running_broker,
    url,
    wait_idle,
    wait_subscribed,
)

#: Small enough that guarantees run out and are renewed many times per test.
SMALL = {
    "max_frame": 4 * KiB,
    "publish_capacity": 16 * KiB,
    "channel_high_watermark": 32 * KiB,
    "channel_low_watermark": 16 * KiB,
    "connection_high_watermark": 128 * KiB,
    "connection_low_watermark": 64 * KiB,
}


def headers_of(index: int) -> Headers | None:
    """None, an empty list and repeated names are all distinct values."""
    if index % 3 == 0:
        return None
    if index % 3 == 1:
        return []
    return [("n", str(index).encode()), ("n", b"again"), ("other", b"")]


def key_of(index: int) -> bytes | None:
    return None if index % 2 else f"key-{index}".encode()


async def publish_numbered(client: Client, topic: str, count: int, *, size: int = 200) -> None:
    for index in range(count):
        await client.publish(
            topic, numbered(index, size), key=key_of(index), headers=headers_of(index)
        )


async def receive_numbered(subscription: Subscription, count: int) -> list[Message]:
    messages = [await subscription.receive() for _ in range(count)]
    for index, message in enumerate(messages):
        assert number_of(message.payload) == index, "out of order or lost"
        assert message.key == key_of(index)
        assert message.headers == headers_of(index)
        assert message.topic == subscription.topic
    seqs = [message.seq for message in messages]
    assert seqs == sorted(set(seqs)), "sequence numbers must increase"
    return messages


async def test_one_to_one_in_order_with_keys_and_headers() -> None:
    count = 600
    async with running_broker(**SMALL) as broker:
        async with (
            open_client(url(broker), name="sub", policy=Policy(deliver_capacity=8 * KiB)) as sub,
            sub.subscribe("orders") as subscription,
            open_client(url(broker), name="pub") as pub,
        ):
            await wait_subscribed(broker, "orders")
            with trio.fail_after(20):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(publish_numbered, pub, "orders", count)
                    messages = await receive_numbered(subscription, count)
                await pub.flush()
            assert len(messages) == count
            assert pub.statistics()["confirmed"] == count
            with pytest.raises(trio.WouldBlock):
                subscription.receive_nowait()
        await wait_idle(broker)


async def test_fan_out_to_three_subscribers() -> None:
    count = 300
    async with running_broker(**SMALL) as broker:
        async with (
            open_client(url(broker), name="pub") as pub,
            open_client(url(broker), name="a") as a,
            open_client(url(broker), name="b", policy=Policy(deliver_capacity=4 * KiB)) as b,
            open_client(url(broker), name="c") as c,
            a.subscribe("fan") as sub_a,
            b.subscribe("fan") as sub_b,
            c.subscribe("fan") as sub_c,
        ):
            await wait_subscribed(broker, "fan", 3)
            received: dict[str, int] = {}

            async def consume(name: str, subscription: Subscription) -> None:
                received[name] = len(await receive_numbered(subscription, count))

            with trio.fail_after(20):
                async with trio.open_nursery() as nursery:
                    for name, subscription in (("a", sub_a), ("b", sub_b), ("c", sub_c)):
                        nursery.start_soon(consume, name, subscription)
                    await publish_numbered(pub, "fan", count)
                    await pub.flush()
            assert received == {"a": count, "b": count, "c": count}
            for subscription in (sub_a, sub_b, sub_c):
                with pytest.raises(trio.WouldBlock):
                    subscription.receive_nowait()
        await wait_idle(broker)


async def test_slow_topic_does_not_hold_up_another_topic_of_the_same_publisher() -> None:
    """Topic A's only subscriber does not consume; topic B's does. On one
    publisher connection, A is throttled while B flows promptly; once A's
    subscriber consumes, everything published to A arrives, nothing lost."""
    async with running_broker(**DEAF_CONFIG) as broker:
        slow = Policy(deliver_capacity=4 * KiB)
        async with (
            open_client(url(broker), name="pub") as pub,
            open_client(url(broker), name="slow", policy=slow) as slow_client,
            open_client(url(broker), name="fast") as fast_client,
            slow_client.subscribe("A") as sub_a,
            fast_client.subscribe("B") as sub_b,
        ):
            await wait_subscribed(broker, "A")
            await wait_subscribed(broker, "B")
            payload = b"a" * 1000
            # "A" is the publisher's first topic: channel [2, 0].
            published_a = await publish_until_throttled(pub, "A", payload)
            channel_a = Channel(ChannelKind.PUBLISH, 0)
            channel_b = Channel(ChannelKind.PUBLISH, 1)
            assert channel_a in pub.throttled
            throttled_b = False

            # B flows while A stays throttled: each message arrives before the next is sent.
            with trio.fail_after(10):
                for index in range(200):
                    await pub.publish("B", numbered(index, 500))
                    throttled_b |= channel_b in pub.throttled
                    assert number_of((await sub_b.receive()).payload) == index
            assert not throttled_b
            assert channel_a in pub.throttled
            assert connection_named(broker, "pub").channels[0].account.blocked
            with pytest.raises(trio.WouldBlock):
                pub.publish_nowait("A", payload)

            # A's subscriber catches up, while more is published to A: nothing is lost.
            more = 100
            with trio.fail_after(20):
                async with trio.open_nursery() as nursery:

                    async def publish_more() -> None:
                        for _ in range(more):
                            await pub.publish("A", payload)

                    nursery.start_soon(publish_more)
                    for _ in range(published_a + more):
                        assert (await sub_a.receive()).payload == payload
                await pub.flush()
            assert channel_a not in pub.throttled
            with pytest.raises(trio.WouldBlock):
                sub_a.receive_nowait()
            assert pub.statistics()["confirmed"] == published_a + more + 200
        await wait_idle(broker)


@pytest.mark.parametrize(
    "backstop",
    [False, True],
    ids=["channel-watermark", "connection-watermark-first"],
)
async def test_client_subscribed_to_its_own_topic(backstop: bool) -> None:
    """A client publishes to a topic it subscribes to, with budgets far below
    what it publishes. With the connection's watermark below the channel's,
    the broker's reader must keep reading the client's guarantees: no deadlock."""
    config = dict(SMALL)
    if backstop:
        config |= {
            "connection_high_watermark": 8 * KiB,
            "connection_low_watermark": 4 * KiB,
        }
    count = 1500
    async with running_broker(**config) as broker:
        async with (
            open_client(url(broker), name="echo", policy=Policy(deliver_capacity=8 * KiB)) as c,
            c.subscribe("echo") as subscription,
        ):
            with trio.fail_after(30):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(
                        functools.partial(publish_numbered, c, "echo", count, size=500)
                    )
                    await receive_numbered(subscription, count)
                await c.flush()
            connection = connection_named(broker, "echo")
            peak = connection.account.statistics().peak_debt
            assert peak > 0
            assert peak <= config["channel_high_watermark"] + 4 * KiB
            await assert_round_trip(broker)
        await wait_idle(broker)


async def test_a_confirm_noted_just_before_the_client_left_does_not_crash_the_broker() -> None:
    """The writer used to send pending Confirms even after the client's Goodbye
    had closed the protocol: a LocalProtocolError that took the broker down."""
    async with running_broker() as broker:
        with trio.fail_after(TIMEOUT):
            async with open_client(url(broker), name="leaving") as client:
                await client.publish("t", b"x")
                await client.flush()
                connection = connection_named(broker, "leaving")
                (handle,) = connection.channels
                state = connection.channels[handle]
                state.confirmed -= 1  # a routing noted, its Confirm not sent yet...
                connection.publishing.confirm_dirty.add(handle)
                connection.protocol.goodbye(GoodbyeCode.NORMAL, "bye")  # ...then the close
                connection.wake_writer()
                await connection.closed.wait()
        await assert_round_trip(broker)


async def test_an_internal_error_ends_one_connection_not_the_broker(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real = Admission.hello

    def failing(self: Admission, event: Any, connection: Any) -> None:
        if event.hello.client == "boom":
            raise RuntimeError("a bug")
        real(self, event, connection)

    monkeypatch.setattr(Admission, "hello", failing)
    async with running_broker() as broker:
        with trio.fail_after(TIMEOUT), pytest.raises(ConnectionLost):
            async with open_client(url(broker), name="boom"):
                pass  # pragma: no cover
        await wait_idle(broker)
        assert broker.internal_errors == 1
        assert "ended by an internal error" in caplog.text and "a bug" in caplog.text
        await assert_round_trip(broker)
