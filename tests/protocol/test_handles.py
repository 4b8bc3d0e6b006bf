"""Data handles over a real pair of endpoints: binding, optimism, freeing."""

from __future__ import annotations

import pytest

from broker.protocol import (
    TOPIC_BINDS,
    BindTopic,
    Channel,
    ChannelKind,
    ConnectionClosed,
    DeliverReceived,
    DropAnnounced,
    FreeHandle,
    GoodbyeCode,
    HandleDeleted,
    HandleFreeProposed,
    HandleType,
    LocalProtocolError,
    NoGuarantees,
    Policy,
    Publish,
    PublishReceived,
    Subscribed,
    TopicBound,
)
from broker.protocol.frames import encode

from .pair import ConnectionPair, of


def test_binds_are_consecutive_from_zero_per_type() -> None:
    pair = ConnectionPair()
    topics = [pair.client.bind_topic(name) for name in ("a", "b", "c")]
    pair.run()
    subs = [pair.client.subscribe(t) for t in topics]
    pair.run()
    assert topics == [0, 1, 2] and subs == [0, 1, 2]
    assert [(e.handle, e.name) for e in of(TopicBound, pair.broker_events)] == [
        (0, "a"),
        (1, "b"),
        (2, "c"),
    ]
    assert [(e.handle, e.topic_name) for e in of(Subscribed, pair.broker_events)] == [
        (0, "a"),
        (1, "b"),
        (2, "c"),
    ]


def test_a_bind_within_guarantees_is_processed_before_the_next_frame() -> None:
    pair = ConnectionPair()
    topic = pair.client.bind_topic("t")
    assert pair.client.confirmed(HandleType.TOPIC, topic)  # covered by guarantees
    sub = pair.client.subscribe(topic)  # so it may be referenced at once
    assert sub == 0
    # The topic's own channel has no guarantees until the broker processed the bind.
    with pytest.raises(NoGuarantees):
        pair.client.publish(topic, b"x")
    pair.run()
    assert pair.client.room(Channel(ChannelKind.PUBLISH, topic)) > 0
    pair.client.publish(topic, b"x")


def test_deferred_binds_are_processed_when_a_publish_references_them() -> None:
    pair = ConnectionPair(
        client_policy=Policy(optimism=1000),
        broker_policy=Policy(process_binds_on_arrival=False),
    )
    topic = pair.client.bind_topic("later")
    pair.client.publish(topic, b"optimistic")  # no guarantees on [2,t]: optimistic
    pair.to_broker(1)
    assert of(TopicBound, pair.broker_events) == []  # buffered, not processed
    pair.to_broker(1)
    kinds = [type(e) for e in pair.broker_events]
    # The reference processed the pending bind first, then the publish.
    assert kinds[-2:] == [TopicBound, PublishReceived]
    pair.run()
    pair.assert_no_errors()


def test_process_binds_drains_deferred_binds_on_request() -> None:
    pair = ConnectionPair(broker_policy=Policy(process_binds_on_arrival=False))
    pair.client.bind_topic("x")
    pair.client.bind_topic("y")
    pair.run()
    assert of(TopicBound, pair.broker_events) == []
    events = pair.broker.process_binds()
    assert [e.name for e in of(TopicBound, events)] == ["x", "y"]


def test_a_publish_on_a_dropped_bind_is_discarded_and_retransmitted_after_the_bind() -> None:
    # One bind fits the broker's bind channel; the second is sent optimistically and dropped.
    bind_size = len(encode(BindTopic("aa")))
    pair = ConnectionPair(
        client_policy=Policy(optimism=10_000),
        broker_policy=Policy(bind_capacity=bind_size),
    )
    first = pair.client.bind_topic("aa")
    second = pair.client.bind_topic("bb")  # beyond the guarantees
    pair.client.publish(second, b"m1")
    pair.client.publish(second, b"m2")
    pair.run()
    # The bind of "bb" was dropped; its publishes were discarded without a word...
    assert pair.broker.discarded_frames == 2
    announced = of(DropAnnounced, pair.client_events)
    assert [(e.channel, e.frames) for e in announced] == [
        (TOPIC_BINDS, 1),
        (Channel(ChannelKind.PUBLISH, second), 2),
    ]
    # ...and everything waits for room on the bind channel: freeing "aa" makes it.
    pair.client.free_handle(HandleType.TOPIC, first)
    pair.run()
    pair.assert_no_errors()
    bound = of(TopicBound, pair.broker_events)
    assert [(e.handle, e.name) for e in bound] == [(0, "aa"), (1, "bb")]
    received = of(PublishReceived, pair.broker_events)
    assert [e.message.payload for e in received] == [b"m1", b"m2"]
    assert all(e.message.topic == second for e in received)


def test_three_step_free_started_by_the_client() -> None:
    pair = ConnectionPair()
    topic = pair.client.bind_topic("t")
    pair.run()
    pair.client.free_handle(HandleType.TOPIC, topic)
    with pytest.raises(LocalProtocolError):
        pair.client.publish(topic, b"after proposing")
    pair.to_broker(1)
    assert of(HandleFreeProposed, pair.broker_events)[-1].handle == topic
    assert of(HandleDeleted, pair.broker_events)[-1].handle == topic  # nothing buffered
    pair.run()
    assert of(HandleDeleted, pair.client_events)[-1].handle == topic
    assert topic not in pair.client.topics and topic not in pair.broker.topics
    # The bind's bytes came back to the broker's bind channel, to be promised again.
    binds = pair.broker.receiver(TOPIC_BINDS)
    assert binds.buffered == 0
    assert pair.client.room(TOPIC_BINDS) + binds.issuable == pair.broker.policy.bind_capacity


def test_three_step_free_started_by_the_broker_waits_for_buffered_deliveries() -> None:
    pair = ConnectionPair()
    topic = pair.client.bind_topic("t")
    pair.run()
    sub = pair.client.subscribe(topic)
    pair.run()
    pair.broker.deliver(sub, 1, b"one")
    pair.broker.free_handle(HandleType.SUBSCRIPTION, sub)
    with pytest.raises(LocalProtocolError):
        pair.broker.deliver(sub, 2, b"after proposing")
    pair.run()
    delivered = of(DeliverReceived, pair.client_events)
    assert len(delivered) == 1
    assert of(HandleFreeProposed, pair.client_events)[-1].handle == sub
    # The client marked the handle but a buffered Deliver still references it.
    binding = pair.client.subscriptions.get(sub)
    assert binding is not None and binding.references == 1
    assert of(HandleDeleted, pair.client_events) == []
    events = pair.client.release(delivered[0])
    assert events == [HandleDeleted(int(HandleType.SUBSCRIPTION), sub)]
    assert sub not in pair.client.subscriptions
    assert of(HandleDeleted, pair.broker_events)[-1].handle == sub
    pair.assert_no_errors()


def test_concurrent_free_proposals_confirm_each_other() -> None:
    pair = ConnectionPair()
    topic = pair.client.bind_topic("t")
    pair.run()
    sub = pair.client.subscribe(topic)
    pair.run()
    pair.client.free_handle(HandleType.SUBSCRIPTION, sub)
    pair.broker.free_handle(HandleType.SUBSCRIPTION, sub)
    pair.run()
    pair.assert_no_errors()
    for events in (pair.client_events, pair.broker_events):
        assert of(HandleFreeProposed, events) == []  # each saw a confirmation, not a proposal
        assert of(HandleDeleted, events)[-1].handle == sub
    # Exactly one FreeHandle went each way.
    assert pair.client.subscriptions.next_handle == 1
    assert sub not in pair.client.subscriptions and sub not in pair.broker.subscriptions


def test_publishes_buffered_at_the_broker_keep_a_freed_topic_alive() -> None:
    pair = ConnectionPair()
    topic = pair.client.bind_topic("t")
    pair.run()
    pair.client.publish(topic, b"1")
    pair.client.publish(topic, b"2")
    pair.run()
    pair.client.free_handle(HandleType.TOPIC, topic)
    pair.run()
    received = of(PublishReceived, pair.broker_events)
    assert pair.broker.topics.get(topic) is not None  # marked, still referenced twice
    assert pair.broker.release(received[0]) == []
    assert pair.broker.release(received[1]) == [HandleDeleted(int(HandleType.TOPIC), topic)]
    assert Channel(ChannelKind.PUBLISH, topic) not in pair.broker.receiving_channels


def test_dropped_frames_leave_no_reference_counts() -> None:
    pair = ConnectionPair(
        client_policy=Policy(optimism=10_000), broker_policy=Policy(publish_capacity=40)
    )
    topic = pair.client.bind_topic("t")
    pair.run()
    for i in range(6):
        pair.client.publish(topic, b"%d" % i * 8)
    pair.to_broker(10)
    receiver = pair.broker.receiver(Channel(ChannelKind.PUBLISH, topic))
    received = of(PublishReceived, pair.broker_events)
    assert receiver.dropped_frames > 0
    binding = pair.broker.topics.get(topic)
    assert binding is not None and binding.references == len(received)


def test_referencing_a_deleted_handle_is_a_protocol_error() -> None:
    pair = ConnectionPair()
    topic = pair.client.bind_topic("t")
    pair.run()
    pair.client.free_handle(HandleType.TOPIC, topic)
    pair.run()
    events = pair.broker.receive_data(encode(Publish(topic, b"zombie")), 0.0)
    closed = of(ConnectionClosed, events)
    assert closed and closed[0].code == GoodbyeCode.PROTOCOL_ERROR
    assert "freed" in closed[0].reason


def test_referencing_a_handle_after_proposing_to_free_it_is_a_protocol_error() -> None:
    pair = ConnectionPair()
    topic = pair.client.bind_topic("t")
    pair.run()
    pair.client.publish(topic, b"buffered")
    pair.run()
    pair.client.free_handle(HandleType.TOPIC, topic)
    pair.to_broker(1)
    # Still bound at the broker (a buffered publish references it), but the
    # client promised not to use it any more.
    assert pair.broker.topics.get(topic) is not None
    events = pair.broker.receive_data(encode(Publish(topic, b"broken promise")), 0.0)
    closed = of(ConnectionClosed, events)
    assert closed and "after proposing" in closed[0].reason


def test_free_handle_with_the_wrong_mine_flag_is_a_protocol_error() -> None:
    pair = ConnectionPair()
    topic = pair.client.bind_topic("t")
    pair.run()
    # The client created every handle, so its FreeHandle must say mine=True.
    events = pair.broker.receive_data(encode(FreeHandle(0, topic, False)), 0.0)
    assert of(ConnectionClosed, events)[0].code == GoodbyeCode.PROTOCOL_ERROR


def test_subscribe_to_an_unconfirmed_topic_is_refused_locally() -> None:
    pair = ConnectionPair(
        client_policy=Policy(optimism=10_000), broker_policy=Policy(bind_capacity=10)
    )
    topic = pair.client.bind_topic("optimistic")  # beyond the 10-byte guarantee
    assert not pair.client.confirmed(HandleType.TOPIC, topic)
    with pytest.raises(LocalProtocolError, match="not confirmed"):
        pair.client.subscribe(topic)
    with pytest.raises(LocalProtocolError, match="not confirmed"):
        pair.client.free_handle(HandleType.TOPIC, topic)


def test_a_plead_crossing_a_topic_free_gets_no_absolve() -> None:
    pair = ConnectionPair(broker_policy=Policy(publish_capacity=100))
    topic = pair.client.bind_topic("t")
    pair.run()
    channel = Channel(ChannelKind.PUBLISH, topic)
    pair.client.free_handle(HandleType.TOPIC, topic)  # crosses...
    pair.broker.set_capacity(channel, 10)  # ...the broker's Plead
    pair.run()
    pair.assert_no_errors()
    assert topic not in pair.client.topics and topic not in pair.broker.topics


def test_a_plead_crossing_a_subscription_free_gets_no_absolve() -> None:
    pair = ConnectionPair()
    topic = pair.client.bind_topic("t")
    pair.run()
    sub = pair.client.subscribe(topic)
    pair.run()
    pair.broker.free_handle(HandleType.SUBSCRIPTION, sub)  # crosses...
    pair.client.set_capacity(Channel(ChannelKind.DELIVER, sub), 10)  # ...the client's Plead
    pair.run()
    pair.assert_no_errors()
    assert sub not in pair.client.subscriptions and sub not in pair.broker.subscriptions


def test_no_publish_while_the_topics_dropped_bind_waits_to_be_resent() -> None:
    bind_size = len(encode(BindTopic("aa")))
    pair = ConnectionPair(
        client_policy=Policy(optimism=10_000),
        broker_policy=Policy(bind_capacity=bind_size),
    )
    first = pair.client.bind_topic("aa")
    second = pair.client.bind_topic("bb")  # optimistic, will be dropped
    pair.run()
    assert of(DropAnnounced, pair.client_events)
    # The broker would discard this publish unannounced: the client must not send it.
    assert pair.client.room(Channel(ChannelKind.PUBLISH, second)) == 0
    with pytest.raises(NoGuarantees):
        pair.client.publish(second, b"would be lost")
    pair.client.free_handle(HandleType.TOPIC, first)
    pair.run()
    assert pair.client.confirmed(HandleType.TOPIC, second)
    pair.client.publish(second, b"kept")  # the bind went again: optimism is safe now
    pair.run()
    pair.assert_no_errors()
    assert [e.message.payload for e in of(PublishReceived, pair.broker_events)] == [b"kept"]


def test_releasing_frames_together_frees_a_freed_topic_like_one_by_one() -> None:
    pair = ConnectionPair()
    topic = pair.client.bind_topic("t")
    pair.run()
    for payload in (b"1", b"22", b"333"):
        pair.client.publish(topic, payload)
    pair.run()
    pair.client.free_handle(HandleType.TOPIC, topic)
    pair.run()
    received = of(PublishReceived, pair.broker_events)
    channel = Channel(ChannelKind.PUBLISH, topic)
    with pytest.raises(LocalProtocolError):
        pair.broker.release_frames(channel, received[0].size, 0)
    with pytest.raises(LocalProtocolError):  # more frames than reference the handle
        pair.broker.release_frames(channel, sum(e.size for e in received), 4)
    assert pair.broker.release_frames(channel, received[0].size + received[1].size, 2) == []
    assert pair.broker.topics.get(topic) is not None  # the third still references it
    assert pair.broker.release(received[2]) == [HandleDeleted(int(HandleType.TOPIC), topic)]


def test_releasing_frames_together_issues_guarantees_once() -> None:
    pair = ConnectionPair(broker_policy=Policy(publish_capacity=1000, issue_fraction=0.0))
    topic = pair.client.bind_topic("t")
    pair.run()
    for _ in range(5):
        pair.client.publish(topic, b"x" * 50)
    pair.run()
    received = of(PublishReceived, pair.broker_events)
    channel = Channel(ChannelKind.PUBLISH, topic)
    before = pair.broker.statistics().frames_sent
    pair.broker.release_frames(channel, sum(event.size for event in received), len(received))
    assert pair.broker.statistics().frames_sent == before + 1  # one IssueGuarantees
    pair.run()
    assert pair.client.room(channel) == 1000  # every byte promised again
