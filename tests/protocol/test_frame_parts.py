"""Messages larger than a frame, sans-IO: FramePart frames each within the
frame limit and the channel's guarantees, reassembled into one message;
resent whole after a resume; delivered in parts to a client that takes
them. (On the base code such a publish raised "exceeds max_frame".)"""

from __future__ import annotations

from broker.protocol import (
    LENGTH_PREFIX,
    DeliverReceived,
    FramePart,
    HelloReceived,
    NoGuarantees,
    PublishReceived,
    WelcomeReceived,
)
from broker.protocol.connection import BrokerSessionState, ClientSessionState
from broker.protocol.frames import decode_body, encode_deliver_tail

from .pair import EPOCH, SESSION, ConnectionPair, of

MAX_FRAME = 1024
MAX_MESSAGE = 100_000
PAYLOAD = bytes(i % 253 for i in range(20_000))


def large_pair() -> ConnectionPair:
    pair = ConnectionPair(handshake=False, broker_max_frame=MAX_FRAME)
    pair.client.max_message = pair.broker.max_message = MAX_MESSAGE
    pair.handshake()
    assert pair.client.peer_max_message == pair.broker.peer_max_message == MAX_MESSAGE
    return pair


def publish(pair: ConnectionPair, topic: int, payload: bytes) -> int:
    """Publish, letting guarantees flow until the last part is out; the calls made."""
    calls = 1
    while True:
        try:
            pair.client.publish(topic, payload, key=b"k")
            return calls
        except NoGuarantees:
            pair.run()
            calls += 1


def test_a_publish_larger_than_a_frame_arrives_whole_once() -> None:
    pair = large_pair()
    topic = pair.client.bind_topic("t")
    pair.run()
    publish(pair, topic, PAYLOAD)
    pair.flush()
    frames = list(pair.wire_to_broker)
    parts = [decode_body(f[LENGTH_PREFIX:]) for f in frames]
    assert len(parts) >= 20 and all(type(p) is FramePart for p in parts)
    assert all(len(f) <= LENGTH_PREFIX + MAX_FRAME for f in frames)
    assert [p.flags for p in parts] == [0x80] + [0] * (len(parts) - 2) + [0x40]  # type: ignore[union-attr]
    pair.run()
    pair.assert_no_errors()
    (received,) = of(PublishReceived, pair.broker_events)
    assert received.message.payload == PAYLOAD and received.message.key == b"k"
    assert pair.broker.topics.bindings[topic].received == 1
    assert pair.broker.reassembling == 0


def test_a_message_cut_by_a_broken_connection_is_sent_again_whole() -> None:
    pair = large_pair()
    topic = pair.client.bind_topic("t")
    pair.run()
    publish(pair, topic, PAYLOAD)
    pair.to_broker(5)  # five parts arrive, the rest is lost with the connection
    pair.wire_to_broker.clear()
    assert pair.broker.reassembling > 0 and not of(PublishReceived, pair.broker_events)
    client_state = pair.client.session_state()
    broker_state = pair.broker.session_state()
    assert isinstance(client_state, ClientSessionState)
    assert isinstance(broker_state, BrokerSessionState)
    new = ConnectionPair(handshake=False, broker_max_frame=MAX_FRAME)
    new.client.max_message = new.broker.max_message = MAX_MESSAGE
    new.client.hello("test-client", resume=client_state)
    (hello,) = of(HelloReceived, new.to_broker())
    restore, _ = broker_state.for_resume(hello.hello.processed)
    new.broker.welcome(session=SESSION, epoch=EPOCH, restore=restore)
    new.run()
    new.assert_no_errors()
    (welcome,) = of(WelcomeReceived, new.client_events)
    assert welcome.resent == 1  # one publish, sent again in all its parts
    (received,) = of(PublishReceived, new.broker_events)
    assert received.message.payload == PAYLOAD
    assert new.broker.topics.bindings[topic].received == 1


def test_a_delivery_larger_than_a_frame_goes_in_parts_within_the_guarantees() -> None:
    pair = large_pair()
    topic = pair.client.bind_topic("t")
    pair.run()
    sub = pair.client.subscribe(topic, "reliable")
    pair.run()
    tail = encode_deliver_tail(PAYLOAD, b"k", [("h", b"v")])
    calls = 0
    small = encode_deliver_tail(b"x", None, None)
    while not pair.broker.deliver_encoded_many(sub, 1, [tail, small]):
        calls += 1
        pair.run()
        assert calls < 1000
    pair.run()
    pair.assert_no_errors()
    got = of(DeliverReceived, pair.client_events)
    assert [(d.message.seq, d.message.payload) for d in got] == [(1, PAYLOAD), (2, b"x")]
    assert got[0].message.headers == [("h", b"v")]
    assert pair.client.reassembling == 0
