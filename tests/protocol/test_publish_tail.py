"""Connection.publish_tail: a Deliver tail published as is (what a worker
forwarding a publish to a topic's owner sends), byte for byte the frame
publish() makes of the same message."""

from __future__ import annotations

import pytest

from broker.protocol import (
    Headers,
    LocalProtocolError,
    NoGuarantees,
    PublishReceived,
    encode_deliver_tail,
)

from .pair import ConnectionPair, of, split_frames

MESSAGES = [
    (b"hello", None, None),
    (b"x" * 300, b"key", None),
    (b"", None, [("h", b"1"), ("h", b"2")]),
    (b"\x00" * 70_000, b"k" * 30, [("trace", b"abc")]),
]


@pytest.mark.parametrize(("payload", "key", "headers"), MESSAGES)
def test_a_tail_makes_the_frame_publish_makes(
    payload: bytes, key: bytes | None, headers: Headers | None
) -> None:
    pair = ConnectionPair()
    topic = pair.client.bind_topic("t")
    pair.run()
    size = pair.client.publish(topic, payload, key=key, headers=headers)
    by_parts = split_frames(pair.client.data_to_send())
    tail = encode_deliver_tail(payload, key, headers)
    assert pair.client.publish_tail(topic, tail) == size
    by_tail = split_frames(pair.client.data_to_send())
    assert by_tail == by_parts
    events = pair.broker.receive_data(b"".join(by_parts + by_tail), now=0.0)
    received = [
        (e.message.payload, e.message.key, e.message.headers) for e in of(PublishReceived, events)
    ]
    assert received == [(payload, key, headers)] * 2


def test_it_refuses_what_publish_refuses() -> None:
    pair = ConnectionPair()
    with pytest.raises(LocalProtocolError):
        pair.client.publish_tail(7, encode_deliver_tail(b"x", None, None))
    topic = pair.client.bind_topic("t")
    pair.run()
    big = encode_deliver_tail(b"x" * (pair.client.peer_max_frame + 1), None, None)
    with pytest.raises(LocalProtocolError, match="exceeds max_frame"):
        pair.client.publish_tail(topic, big)
    while True:  # until the guarantees run out
        try:
            pair.client.publish_tail(topic, encode_deliver_tail(b"y" * 1000, None, None))
        except NoGuarantees:
            break
