"""Clients that ignore flow control: publishing beyond guarantees, never
reading, binding without end. The broker buffers no more than it promised,
charges the slowness to the channel that causes it, and keeps serving the rest."""

from __future__ import annotations

import pytest
import trio

from broker.client import open_client
from broker.config import KiB, MiB
from broker.protocol import (
    OPTIMISM_FRAMES,
    TOPIC_BINDS,
    AnnounceDropping,
    BindTopic,
    Channel,
    ChannelKind,
    Goodbye,
    GoodbyeCode,
    IssueGuarantee,
    Policy,
    Publish,
)
from broker.protocol.frames import encode

from .helpers import (
    DEAF_CONFIG,
    EVENT_COST,
    assert_round_trip,
    connection_named,
    frame_ends,
    number_of,
    numbered,
    publish_until_throttled,
    raw_client,
    running_broker,
    subscribe_deaf,
    url,
    wait_idle,
    wait_subscribed,
    wait_until,
)

PUBLISH_0 = Channel(ChannelKind.PUBLISH, 0)
PAYLOAD = b"x" * 1000


# ==================================================================== beyond guarantees

FLOOD = {
    "max_frame": 4 * KiB,
    "publish_capacity": 16 * KiB,
    "channel_high_watermark": 8 * KiB,
    "channel_low_watermark": 4 * KiB,
}


async def test_publishing_beyond_guarantees_is_dropped_per_protocol() -> None:
    """A raw publisher ignores its guarantees on [2, 0] while the only
    subscriber is slow. The broker never buffers beyond the channel's
    capacity, announces the drop, accepts exactly the frames it confirmed
    before the announcement, and delivers all of them and nothing else."""
    async with running_broker(**FLOOD) as broker:
        slow_policy = Policy(deliver_capacity=4 * KiB)
        async with (
            open_client(url(broker), name="slow", policy=slow_policy) as subscriber,
            subscriber.subscribe("flood") as sub,
            raw_client(broker, background=True) as raw,
        ):
            await wait_subscribed(broker, "flood")
            await raw.handshake("flooder")
            await raw.send(BindTopic("flood"))
            first = await raw.wait_for_guarantee(PUBLISH_0)
            assert first.amount == FLOOD["publish_capacity"]
            connection = connection_named(broker, "flooder")
            receiver = connection.protocol.receiver(PUBLISH_0)

            frames = [encode(Publish(0, numbered(i))) for i in range(120)]
            # One write per frame, each processed by the broker before the
            # next: frames beyond the guarantees arrive both while the channel
            # drains and after its account blocked it.
            for frame in frames:
                await raw.send(frame)
                await wait_until(lambda: connection.counters.bytes_in == raw.bytes_sent)
                assert receiver.buffered <= receiver.capacity
                assert connection.buffer_reserved <= broker.config.connection_budget

            announcement = await raw.wait_for(
                lambda m: isinstance(m, AnnounceDropping) and m.channel == PUBLISH_0
            )
            # We never apologised: the channel stays dropping, one announcement.
            assert len(raw.announcements(PUBLISH_0)) == 1
            assert raw.goodbyes() == [], "frames beyond guarantees are dropped, not fatal"
            guaranteed = raw.guarantees(PUBLISH_0, before=announcement)
            accepted = sum(end <= guaranteed for end in frame_ends(frames))
            assert 0 < accepted < len(frames)
            assert connection.protocol.publishes_received[0] == accepted
            assert receiver.buffered <= receiver.capacity

            # The subscriber catches up: every accepted frame, in order, and no more.
            with trio.fail_after(10):
                for index in range(accepted):
                    message = await sub.receive()
                    assert number_of(message.payload) == index
                async with open_client(url(broker), name="sentinel") as sentinel:
                    await sentinel.publish("flood", b"sentinel")
                message = await sub.receive()
            assert message.payload == b"sentinel"
            with pytest.raises(trio.WouldBlock):
                sub.receive_nowait()
            assert connection.protocol.publishes_received[0] == accepted
            await assert_round_trip(broker)
            await raw.close_gracefully()
        await wait_idle(broker)


# ==================================================================== a subscriber that never reads

#: What one publish of PAYLOAD can add to a debt: its own loan while routed
#: and one Deliver loan per subscriber (generous: frame heads included).
FAN_OUT = 2 * (len(PAYLOAD) + 64 + EVENT_COST)


@pytest.mark.parametrize("grant", [0, 64 * MiB], ids=["no-guarantees", "guarantees-unread"])
async def test_subscriber_that_never_reads_throttles_its_publisher(grant: int) -> None:
    async with running_broker(**DEAF_CONFIG) as broker:
        async with raw_client(broker) as deaf:
            await subscribe_deaf(deaf, grant)
            await wait_until(lambda: broker.statistics().subscriptions == 1)
            async with (
                open_client(url(broker), name="publisher") as publisher,
                open_client(url(broker), name="bystander") as bystander,
                bystander.subscribe("quiet") as quiet,
            ):
                await wait_subscribed(broker, "quiet")
                sent = await publish_until_throttled(publisher, "busy", PAYLOAD)
                assert sent > 0
                channel = connection_named(broker, "publisher").channels[0]
                assert channel.account.blocked

                # Debt stayed bounded all along: the channel's by its watermark
                # (plus what one publish fans out), the broker's by the
                # connection backstop.
                assert channel.account.statistics().peak_debt <= (
                    DEAF_CONFIG["channel_high_watermark"] + FAN_OUT
                )
                assert broker.account.statistics().peak_debt <= (
                    DEAF_CONFIG["connection_high_watermark"] + FAN_OUT
                )

                # The same publisher's other topic, and other clients, still flow.
                with trio.fail_after(5):
                    for index in range(20):
                        await publisher.publish("quiet", numbered(index, 100))
                        assert number_of((await quiet.receive()).payload) == index
                await assert_round_trip(broker, topic="elsewhere")
                assert channel.account.blocked

                # The deaf client leaves politely: it reads until the broker closes.
                await deaf.send(Goodbye(int(GoodbyeCode.NORMAL), "bye"))
                await deaf.read_until_eof()
                # Its queued deliveries are repaid, and the publisher flows again.
                with trio.fail_after(10):
                    await publisher.publish("busy", PAYLOAD)
                    await publisher.flush()
                assert Channel(ChannelKind.PUBLISH, 0) not in publisher.throttled
        await wait_idle(broker)


async def test_subscriber_vanishing_with_unread_deliveries() -> None:
    """A subscriber that granted plenty but never read disappears (its kernel
    resets the connection, data unread) while the broker is blocked writing to it.

    Its session waits one lease for a resume, its deliveries (and the
    publisher's debt for them) kept; then it expires and everything is freed.
    """
    async with running_broker(**DEAF_CONFIG, heartbeat=0.2, lease=0.6) as broker:
        async with open_client(url(broker), name="publisher") as publisher:
            async with raw_client(broker) as deaf:
                await subscribe_deaf(deaf, 64 * MiB)
                await wait_until(lambda: broker.statistics().subscriptions == 1)
                await publish_until_throttled(publisher, "busy", PAYLOAD)
                deaf_connection = connection_named(broker, "deaf")
            # raw_client closed the socket with data unread: a reset.
            with trio.fail_after(5):
                await deaf_connection.closed.wait()
            assert broker.sessions.detached == 1
            assert broker.statistics().subscriptions == 1  # still queueing for a resume
            with pytest.raises(trio.WouldBlock):
                publisher.publish_nowait("busy", PAYLOAD)
            with trio.fail_after(10):
                await publisher.publish("busy", PAYLOAD)
                await publisher.flush()
            assert broker.sessions.expired_total == 1
            assert broker.sessions.detached == 0
            await assert_round_trip(broker)
        await wait_idle(broker)


# ==================================================================== thousands of binds

BINDS = {
    "max_frame": 1024,
    "publish_capacity": 8 * KiB,
    "bind_capacity": 16 * KiB,
    "connection_budget": 128 * KiB,
}


async def test_a_client_that_floods_a_dropping_channel_is_cut_off() -> None:
    """Publishes that go on after the broker announced the drop, with no
    Apologise: the broker used to read and drop them at full speed for as
    long as the client went on (250 MB/s, a core, for good). Past what a
    client that heeds the announcement can have sent (its guarantees, at
    most connection_budget, and its optimism, at most 16 frames) it ends the
    connection with Goodbye 3; others go on."""
    async with (
        running_broker(**FLOOD, connection_budget=256 * KiB) as broker,
        open_client(url(broker), name="slow", policy=Policy(deliver_capacity=4 * KiB)) as sub,
        sub.subscribe("flood"),
        raw_client(broker, background=True) as raw,
    ):
        await wait_subscribed(broker, "flood")
        await raw.handshake("flooder")
        await raw.send(BindTopic("flood"))
        await raw.wait_for_guarantee(PUBLISH_0)
        frame = encode(Publish(0, b"x" * 4000))
        bound = 256 * KiB + OPTIMISM_FRAMES * (FLOOD["max_frame"] + 4)
        with trio.fail_after(10):
            for _ in range(2 * bound // len(frame) + FLOOD["publish_capacity"] // len(frame)):
                if raw.goodbyes():
                    break
                await raw.send(frame)
        goodbye = await raw.wait_for(lambda m: isinstance(m, Goodbye))
        assert isinstance(goodbye, Goodbye)
        assert goodbye.code == GoodbyeCode.LIMIT_EXCEEDED
        assert "after the channel began dropping (no Apologise)" in goodbye.reason
        await assert_round_trip(broker)


async def test_thousands_of_binds_stay_within_budgets() -> None:
    async with running_broker(**BINDS) as broker:
        async with raw_client(broker, background=True) as raw:
            await raw.handshake("binder")
            frames = [encode(BindTopic(f"topic-{i:05d}")) for i in range(3000)]
            await raw.send(*frames)
            connection = connection_named(broker, "binder")
            announcement = await raw.wait_for(
                lambda m: isinstance(m, AnnounceDropping) and m.channel == TOPIC_BINDS
            )
            await wait_until(lambda: connection.counters.bytes_in == raw.bytes_sent)

            # The bind channel's guarantees bound the handles: exactly the
            # binds confirmed before the announcement were bound.
            guaranteed = raw.guarantees(TOPIC_BINDS, before=announcement)
            bound = sum(end <= guaranteed for end in frame_ends(frames))
            assert 0 < bound < len(frames)
            protocol = connection.protocol
            assert len(protocol.topics) == bound
            assert len(broker.topics) == bound
            assert sorted(broker.topics) == [f"topic-{i:05d}" for i in range(bound)]
            binds = protocol.receiver(TOPIC_BINDS)
            assert binds.buffered <= binds.capacity == BINDS["bind_capacity"]

            # Every channel's buffer together stays within the connection budget.
            capacities = [protocol.receiver(c).capacity for c in protocol.receiving_channels]
            assert sum(capacities) <= BINDS["connection_budget"]
            assert connection.buffer_reserved <= BINDS["connection_budget"]
            assert broker.buffer_reserved <= broker.config.global_budget
            # ...and the guarantees the client holds are within that too.
            granted = sum(
                m.amount
                for m in raw.frames
                if isinstance(m, IssueGuarantee) and m.channel.kind == ChannelKind.PUBLISH
            )
            assert granted <= BINDS["connection_budget"]
            assert raw.goodbyes() == []

            await assert_round_trip(broker)
            await raw.close_gracefully()
        await wait_idle(broker)


async def test_starved_topic_is_funded_once_idle_channels_shrink() -> None:
    """Budget for three publish channels; a fourth topic must still get
    guarantees once the idle ones have been shrunk (by Plead/Absolve) to fund it."""
    budget = 2 * 1024 + 3 * 8 * KiB
    config = {
        "max_frame": 1024,
        "publish_capacity": 8 * KiB,
        "bind_capacity": 1024,
        "connection_budget": budget,
    }
    async with running_broker(**config) as broker:
        async with open_client(url(broker), name="four") as client:
            for index in range(4):
                with trio.fail_after(3):
                    await client.publish(f"topic-{index}", b"x")
                    await client.flush()
            protocol = connection_named(broker, "four").protocol
            capacities = [protocol.receiver(c).capacity for c in protocol.receiving_channels]
            assert sum(capacities) <= budget
        await wait_idle(broker)
