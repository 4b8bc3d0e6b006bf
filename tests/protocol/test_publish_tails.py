"""Connection.publish_tails: Deliver tails published as they are (what a
worker forwarding publishes to a topic's owner sends), byte for byte the
frames publish() makes of the same messages, as far as the guarantees go."""

from __future__ import annotations

import pytest

from broker.protocol import Headers, LocalProtocolError, NoGuarantees, PublishReceived
from broker.protocol.connection import _traffic
from broker.protocol.frames import encode_deliver_tail
from broker.protocol.frames._encode import encode_publish_tail, publish_tail_frames

from .pair import ConnectionPair, of, split_frames

MESSAGES: list[tuple[bytes, bytes | None, Headers | None]] = [
    (b"hello", None, None),
    (b"x" * 300, b"key", None),
    (b"", None, [("h", b"1"), ("h", b"2")]),
    (b"\x00" * 70_000, b"k" * 30, [("trace", b"abc")]),
    (b"p" * 40, None, None),
]


def test_tails_make_the_frames_publish_makes() -> None:
    pair = ConnectionPair()
    topic = pair.client.bind_topic("t")
    pair.run()
    sizes = [pair.client.publish(topic, p, key=k, headers=h) for p, k, h in MESSAGES]
    by_parts = split_frames(pair.client.data_to_send())
    tails = [encode_deliver_tail(*message) for message in MESSAGES]
    assert pair.client.publish_tails(topic, tails) == len(MESSAGES)
    by_tail = split_frames(pair.client.data_to_send())
    assert by_tail == by_parts
    assert [len(frame) for frame in by_tail] == sizes
    # From an index on: only those after it.
    assert pair.client.publish_tails(topic, tails, 3) == 2
    assert split_frames(pair.client.data_to_send()) == by_parts[3:]
    events = pair.broker.receive_data(b"".join(by_parts + by_tail), now=0.0)
    received = [
        (e.message.payload, e.message.key, e.message.headers) for e in of(PublishReceived, events)
    ]
    assert received == MESSAGES * 2
    assert pair.client.topics.bindings[topic].published == len(MESSAGES) * 2 + 2


def test_it_refuses_what_publish_refuses() -> None:
    pair = ConnectionPair()
    with pytest.raises(LocalProtocolError):
        pair.client.publish_tails(7, [encode_deliver_tail(b"x", None, None)])
    topic = pair.client.bind_topic("t")
    pair.run()
    big = encode_deliver_tail(b"x" * (pair.client.peer_max_frame + 1), None, None)
    small = encode_deliver_tail(b"s", None, None)
    assert pair.client.publish_tails(topic, [small, big]) == 1  # the one before it
    assert pair.client.topics.bindings[topic].published == 1
    with pytest.raises(LocalProtocolError, match="exceeds max_frame"):
        pair.client.publish_tails(topic, [small, big], 1)  # it comes first


def out_of_room(pair: ConnectionPair) -> tuple[int, bytes, int]:
    """Bind topic "t" and publish 1000-byte tails until the guarantees end:
    the topic handle, the tail and how many went."""
    topic = pair.client.bind_topic("t")
    pair.run()
    tail = encode_deliver_tail(b"y" * 1000, None, None)
    sent = pair.client.publish_tails(topic, [tail] * 10_000)
    assert 0 < sent < 10_000
    return topic, tail, sent


def test_it_stops_where_the_guarantees_end() -> None:
    pair = ConnectionPair()
    topic, tail, sent = out_of_room(pair)
    assert pair.client.topics.bindings[topic].published == sent
    assert pair.client.publish_tails(topic, [tail]) == 0  # still no room: nothing sent
    with pytest.raises(NoGuarantees):
        pair.client.publish(topic, b"y" * 1000)


@pytest.mark.parametrize("topic", [0, 23, 24, 255, 256, 70_000, 2**32])
def test_frames_in_one_go_are_those_of_one_tail_at_a_time(topic: int) -> None:
    tails = [encode_deliver_tail(*message) for message in MESSAGES]
    one_by_one = [encode_publish_tail(topic, tail, max_frame=1 << 20) for tail in tails]
    assert publish_tail_frames(topic, tails, 0, 1 << 20) == one_by_one
    assert publish_tail_frames(topic, tails, 2, 1 << 20) == one_by_one[2:]
    # As many as fit in the room, in order.
    room = sum(map(len, one_by_one[:3]))
    assert publish_tail_frames(topic, tails, 0, room) == one_by_one[:3]
    assert publish_tail_frames(topic, tails, 0, room - 1) == one_by_one[:2]
    assert publish_tail_frames(topic, tails, 0, 0) == []


def test_out_of_room_it_stops_without_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    pair = ConnectionPair()
    topic, tail, sent = out_of_room(pair)

    def no_decoding(body: bytes) -> None:
        raise AssertionError("a frame that cannot go was decoded")

    monkeypatch.setattr(_traffic, "decode_body", no_decoding)
    assert pair.client.publish_tails(topic, [tail] * 3) == 0
    assert pair.client.topics.bindings[topic].published == sent
