"""PublishMany: many publishes on one topic handle in one frame, from a
client whose Hello asked for it and whose Welcome allowed it (what a
worker's link forwards publishes to a topic's owner with)."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.protocol import (
    ConnectionClosed,
    GoodbyeCode,
    Headers,
    LocalProtocolError,
    PublishMany,
    PublishManyReceived,
    PublishReceived,
    RemoteProtocolError,
    Stage,
)
from broker.protocol.frames import (
    FrameDecoder,
    decode_body,
    encode,
    encode_deliver_tail,
    publish_many_head,
)
from broker.protocol.frames._decode_fast import _fast_message

from .pair import ConnectionPair, of, split_frames

Entry = tuple[bytes, bytes | None, Headers | None]

MESSAGES: list[Entry] = [
    (b"hello", None, None),
    (b"x" * 300, b"key", None),
    (b"", None, [("h", b"1"), ("h", b"2")]),
    (b"p" * 40, None, None),
    (b"q" * 30, b"", None),
]


def tails_of(entries: list[Entry]) -> list[bytes]:
    return [encode_deliver_tail(*entry) for entry in entries]


def opened(
    *, publish_many: bool = True, max_frame: int | None = None
) -> tuple[ConnectionPair, int]:
    pair = ConnectionPair(publish_many=publish_many, broker_max_frame=max_frame)
    topic = pair.client.bind_topic("t")
    pair.run()
    return pair, topic


def received(events: list[object]) -> list[bytes]:
    """The tails of the publishes in ``events``, one or many a frame."""
    tails: list[bytes] = []
    for event in events:
        if isinstance(event, PublishManyReceived):
            tails += event.message.entries
        elif isinstance(event, PublishReceived):
            message = event.message
            tails.append(encode_deliver_tail(message.payload, message.key, message.headers))
    return tails


def test_the_welcome_allows_it_and_one_frame_carries_them_all() -> None:
    pair, topic = opened()
    assert pair.client.publish_many and pair.broker.publish_many
    tails = tails_of(MESSAGES)
    assert pair.client.publish_many_tails(topic, tails) == len(tails)
    frames = split_frames(pair.client.data_to_send())
    assert len(frames) == 1
    events = pair.broker.receive_data(frames[0], now=0.0)
    (event,) = of(PublishManyReceived, events)
    assert event.message.entries == tails
    assert event.message.keys == [key for _, key, _ in MESSAGES]
    assert event.size == len(frames[0])
    # Each entry counts as one publish: Confirm and the received count.
    state = pair.client.topics.bindings[topic]
    assert state.published == len(tails)
    assert pair.broker.topics.bindings[topic].received == len(tails)
    assert pair.broker.release(event) == []
    pair.broker.confirm(topic, len(tails))
    pair.run()
    pair.assert_no_errors()
    assert state.published == state.retained_base == len(tails)


def test_without_asking_it_sends_publish_frames() -> None:
    pair, topic = opened(publish_many=False)
    assert not pair.client.publish_many and not pair.broker.publish_many
    tails = tails_of(MESSAGES)
    assert pair.client.publish_many_tails(topic, tails) == len(tails)
    events = pair.broker.receive_data(pair.client.data_to_send(), now=0.0)
    assert len(of(PublishReceived, events)) == len(tails)
    assert received(events) == tails


def test_a_broker_that_did_not_allow_it_says_goodbye() -> None:
    pair, topic = opened(publish_many=False)
    tails = tails_of(MESSAGES[:2])
    frame = publish_many_head(topic, 2, sum(map(len, tails))) + b"".join(tails)
    events = pair.broker.receive_data(frame, now=0.0)
    (closed,) = of(ConnectionClosed, events)
    assert closed.code == GoodbyeCode.PROTOCOL_ERROR
    assert pair.broker.topics.bindings[topic].received == 0


def test_a_client_receiving_one_says_goodbye() -> None:
    pair, topic = opened()
    tails = tails_of(MESSAGES[:1])
    frame = publish_many_head(topic, 1, len(tails[0])) + tails[0]
    (closed,) = of(ConnectionClosed, pair.client.receive_data(frame, now=0.0))
    assert closed.code == GoodbyeCode.PROTOCOL_ERROR


def test_it_stops_where_the_guarantees_end_and_goes_on_later() -> None:
    pair, topic = opened()
    tail = encode_deliver_tail(b"y" * 1000, None, None)
    tails = [tail] * 1000
    sent = pair.client.publish_many_tails(topic, tails)
    assert 0 < sent < 1000
    assert pair.client.publish_many_tails(topic, tails, sent) == 0  # still no room
    events = pair.to_broker(100)
    assert received(events) == tails[:sent]
    for event in of(PublishManyReceived, events):
        pair.broker.release(event)
    pair.run()  # guarantees issued again
    more = pair.client.publish_many_tails(topic, tails, sent)
    assert more > 0
    assert received(pair.to_broker(100)) == tails[sent : sent + more]
    pair.assert_no_errors()


def test_frames_keep_within_max_frame() -> None:
    pair, topic = opened(max_frame=4096)
    tails = [encode_deliver_tail(bytes([i]) * 100, None, None) for i in range(100)]
    assert pair.client.publish_many_tails(topic, tails) == 100
    frames = split_frames(pair.client.data_to_send())
    assert len(frames) > 1
    assert all(len(frame) - 4 <= pair.client.peer_max_frame for frame in frames)
    events = pair.broker.receive_data(b"".join(frames), now=0.0)
    assert received(events) == tails
    pair.assert_no_errors()


def test_a_resumed_session_sends_the_unconfirmed_again_as_publishes() -> None:
    pair, topic = opened()
    tails = tails_of(MESSAGES)
    pair.client.publish_many_tails(topic, tails)
    retained = pair.client.topics.bindings[topic].retained
    assert retained is not None
    # Kept as Publish frames of their own, what a resume sends again.
    decoded = [decode_body(frame[4:]) for frame in retained]
    assert [encode(message) for message in decoded] == list(retained)
    assert [encode_deliver_tail(m.payload, m.key, m.headers) for m in decoded] == tails  # type: ignore[union-attr]


def test_on_a_staged_handle_it_sends_publish_frames_and_the_broker_refuses_many() -> None:
    pair = ConnectionPair(publish_many=True)
    topic = pair.client.bind_topic("t", Stage("batch", "m"))
    pair.run()
    tails = tails_of(MESSAGES[:2])
    assert pair.client.publish_many_tails(topic, tails) == 2
    events = pair.broker.receive_data(pair.client.data_to_send(), now=0.0)
    assert len(of(PublishReceived, events)) == 2
    frame = publish_many_head(topic, 2, sum(map(len, tails))) + b"".join(tails)
    (closed,) = of(ConnectionClosed, pair.broker.receive_data(frame, now=0.0))
    assert closed.code == GoodbyeCode.PROTOCOL_ERROR


entries = st.lists(
    st.tuples(
        st.binary(max_size=300),
        st.none() | st.binary(max_size=40),
        st.none() | st.lists(st.tuples(st.text(max_size=5), st.binary(max_size=5)), max_size=2),
    ),
    min_size=1,
    max_size=40,
)


@given(st.integers(0, 2**64 - 1), entries)
def test_the_fast_way_reads_what_the_general_way_reads(topic: int, items: list[Entry]) -> None:
    message = PublishMany(topic, tails_of(items), [key for _, key, _ in items])
    frame = encode(message)
    assert decode_body(frame[4:]) == message
    fast = _fast_message(frame, 4, len(frame))
    assert fast is None or fast == message  # (None: headers, read the general way)
    decoder = FrameDecoder()
    decoder.feed(frame)
    assert list(decoder.messages()) == [(message, len(frame))]


@given(entries, st.data())
def test_a_damaged_frame_gets_a_goodbye_never_a_traceback(
    items: list[Entry], data: st.DataObject
) -> None:
    pair, topic = opened()
    tails = tails_of(items)
    frame = bytearray(publish_many_head(topic, len(tails), sum(map(len, tails))) + b"".join(tails))
    for _ in range(data.draw(st.integers(1, 4))):
        index = data.draw(st.integers(4, len(frame) - 1))
        frame[index] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        cut = data.draw(st.integers(5, len(frame)))
        frame = frame[:cut]
        frame[:4] = struct.pack(">I", cut - 4)
    events = pair.broker.receive_data(bytes(frame), now=0.0)
    closed = of(ConnectionClosed, events)
    for event in closed:
        assert isinstance(event.error, RemoteProtocolError)
    if not closed:
        pair.broker.data_to_send()  # (whatever it says, it is a protocol answer)


def test_a_client_that_never_resumes_keeps_nothing_but_counts() -> None:
    pair = ConnectionPair(handshake=False)
    pair.client.hello("link", publish_many=True, keep_unconfirmed=False)
    pair.to_broker()
    pair.broker.welcome(session=bytes(16), epoch=b"e")
    pair.run()
    topic = pair.client.bind_topic("t")
    pair.run()
    tails = tails_of(MESSAGES)
    pair.client.publish(topic, b"one")
    assert pair.client.publish_tails(topic, tails[:2]) == 2
    assert pair.client.publish_many_tails(topic, tails) == len(tails)
    state = pair.client.topics.bindings[topic]
    assert not state.retained
    assert state.published == 3 + len(tails)
    pair.run()
    pair.broker.confirm(topic, 4)
    pair.run()
    pair.assert_no_errors()
    assert (state.retained_base, state.published) == (4, 3 + len(tails))
    # A Confirm beyond what was sent is still refused.
    pair.broker.confirm(topic, 4 + len(tails))
    pair.run()
    (closed,) = of(ConnectionClosed, pair.client_events)
    assert closed.code == GoodbyeCode.PROTOCOL_ERROR and not closed.by_peer
    with pytest.raises(LocalProtocolError):
        pair.client.session_state()
