"""The happy path end to end through two sans-IO endpoints."""

from __future__ import annotations

from broker.protocol import Channel, ChannelKind, DeliverReceived, PublishReceived

from .pair import ConnectionPair


def test_bind_subscribe_publish_deliver_ack_leaves_every_buffer_empty() -> None:
    pair = ConnectionPair()
    topic = pair.client.bind_topic("news")
    pair.run()
    sub = pair.client.subscribe(topic)
    pair.run()
    for i in range(3):
        pair.client.publish(topic, b"hello %d" % i)
    pair.run()
    published = [e for e in pair.broker_events if isinstance(e, PublishReceived)]
    assert [e.topic_name for e in published] == ["news"] * 3
    for seq, event in enumerate(published):
        pair.broker.deliver(sub, seq, event.message.payload)
        pair.broker.release(event)
    pair.run()
    delivered = [e for e in pair.client_events if isinstance(e, DeliverReceived)]
    assert [e.message.payload for e in delivered] == [b"hello 0", b"hello 1", b"hello 2"]
    for event in delivered:
        pair.client.release(event)
    pair.client.ack(sub, 2)
    pair.run()
    pair.assert_no_errors()
    assert pair.broker.receiver(Channel(ChannelKind.PUBLISH, topic)).buffered == 0
    assert pair.client.receiver(Channel(ChannelKind.DELIVER, sub)).buffered == 0
    # Every byte is accounted for: what the publisher may still send plus what the
    # broker may still promise is the whole buffer.
    channel = Channel(ChannelKind.PUBLISH, topic)
    receiver = pair.broker.receiver(channel)
    assert pair.client.room(channel) + receiver.issuable == receiver.capacity
