"""Per-handle state: one object per handle holds its binding, its channel's
guarantee state and its session data; deleting the binding deletes it all."""

from __future__ import annotations

from broker.protocol import Channel, ChannelKind, HandleType, PublishReceived, Role
from broker.protocol.connection import Binding, HandleTable
from broker.protocol.connection._handle_state import SubscriptionState, TopicState
from broker.protocol.connection._session import SubscriptionInfo

from .pair import ConnectionPair, of


def test_a_topic_state_retains_frames_until_confirmed() -> None:
    topic = TopicState("t")
    assert topic.published == 0 and topic.retained is None
    for frame in (b"a", b"b", b"c"):
        topic.retain(frame)
    assert topic.published == 3
    assert topic.confirm(2)
    assert (topic.retained_base, list(topic.retained or ())) == (2, [b"c"])
    assert topic.confirm(2)  # a repeat changes nothing
    assert topic.published == 3


def test_a_topic_state_refuses_a_confirm_going_back_or_beyond_what_was_sent() -> None:
    topic = TopicState("t")
    topic.retain(b"a")
    assert topic.confirm(1)
    assert not topic.confirm(0)
    assert not topic.confirm(2)
    assert (topic.retained_base, topic.published) == (1, 1)


def test_a_subscription_state_starts_with_nothing_processed() -> None:
    state = SubscriptionState(SubscriptionInfo(0, "t", "reliable", {}))
    assert (state.processed, state.receiver, state.sender, state.bind_size) == (0, None, None, None)
    assert isinstance(state, Binding)


def test_a_handle_table_makes_its_bindings_and_keeps_one_mapping() -> None:
    plain = HandleTable(HandleType.TOPIC, created_here=True)
    assert type(plain.get(plain.bind("a"))) is Binding
    table = HandleTable(HandleType.TOPIC, created_here=False, make=TopicState)
    view = table.bindings
    table.restore({0: "a", 2: "c"}, 3)
    assert table.bindings is view
    assert sorted(view) == [0, 2]
    assert all(type(state) is TopicState for state in view.values())
    assert view[2].value == "c"


def test_each_side_keeps_its_channel_state_in_the_handle_state() -> None:
    pair = ConnectionPair()
    topic = pair.client.bind_topic("t")
    pair.run()
    sub = pair.client.subscribe(topic)
    pair.run()
    client_topic = pair.client.topics.bindings[topic]
    broker_topic = pair.broker.topics.bindings[topic]
    publish = Channel(ChannelKind.PUBLISH, topic)
    assert client_topic.receiver is None and client_topic.sender is pair.client.sender(publish)
    assert broker_topic.sender is None and broker_topic.receiver is pair.broker.receiver(publish)
    deliver = Channel(ChannelKind.DELIVER, sub)
    assert pair.client.subscriptions.bindings[sub].receiver is pair.client.receiver(deliver)
    assert pair.broker.subscriptions.bindings[sub].sender is pair.broker.sender(deliver)
    assert broker_topic.bind_size is not None and client_topic.bind_size is None


def test_counts_live_in_the_handle_state_and_the_old_views_show_them() -> None:
    pair = ConnectionPair()
    topic = pair.client.bind_topic("t")
    pair.run()
    sub = pair.client.subscribe(topic)
    pair.run()
    for _ in range(3):
        pair.client.publish(topic, b"x")
    pair.run()
    assert pair.broker.topics.bindings[topic].received == 3
    assert pair.broker.publishes_received == {topic: 3}
    assert pair.client.publishes_received == {}
    assert pair.client.topics.bindings[topic].published == 3
    pair.client.ack(sub, 7)
    assert pair.client.subscriptions.bindings[sub].processed == 7
    assert pair.client.processed == {sub: 7}
    assert pair.broker.processed == {}


def test_freeing_a_handle_deletes_its_state_and_channels() -> None:
    pair = ConnectionPair()
    topic = pair.client.bind_topic("t")
    pair.run()
    pair.client.publish(topic, b"x")
    pair.run()
    for event in of(PublishReceived, pair.broker_events):
        pair.broker.release(event)
    pair.broker.confirm(topic, 1)
    pair.run()
    pair.client.free_handle(HandleType.TOPIC, topic)
    pair.run()
    publish = Channel(ChannelKind.PUBLISH, topic)
    for side in (pair.client, pair.broker):
        assert topic not in side.topics.bindings
        assert publish not in side.receiving_channels + side.sending_channels
    assert pair.broker.publishes_received == {}
    pair.assert_no_errors()


def test_the_views_are_snapshots_for_either_role() -> None:
    pair = ConnectionPair()
    topic = pair.client.bind_topic("t")
    pair.run()
    snapshot = pair.broker.publishes_received
    snapshot[topic] = 99
    assert pair.broker.publishes_received == {topic: 0}
    assert pair.broker.role is Role.BROKER
