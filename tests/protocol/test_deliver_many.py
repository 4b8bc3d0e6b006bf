"""Connection.deliver_encoded_many: the batched form of deliver_encoded."""

from __future__ import annotations

import pytest

from broker.protocol import (
    Channel,
    ChannelKind,
    Deliver,
    DeliverReceived,
    LocalProtocolError,
    Policy,
    encode,
    encode_deliver_tail,
)

from .pair import ConnectionPair, of, split_frames


def subscribed_pair(deliver_capacity: int) -> tuple[ConnectionPair, int]:
    pair = ConnectionPair(client_policy=Policy(deliver_capacity=deliver_capacity))
    topic = pair.client.bind_topic("t")
    pair.run()
    subscription = pair.client.subscribe(topic)
    pair.run()
    pair.assert_no_errors()
    return pair, subscription


def test_the_bytes_are_those_of_one_deliver_per_tail() -> None:
    pair, sub = subscribed_pair(10_000)
    payloads = [b"a", b"bb" * 50, b"ccc"]
    tails = [encode_deliver_tail(p, None, None) for p in payloads]
    assert pair.broker.deliver_encoded_many(sub, 7, tails) == 3
    frames = split_frames(pair.broker.data_to_send())
    expected = [encode(Deliver(sub, 7 + i, p, None, None)) for i, p in enumerate(payloads)]
    assert frames[-3:] == expected
    pair.wire_to_client.extend(frames)
    pair.run()
    received = of(DeliverReceived, pair.client_events)
    assert [e.message.payload for e in received] == payloads
    assert [e.message.seq for e in received] == [7, 8, 9]
    pair.assert_no_errors()


def test_it_stops_where_the_guarantees_end() -> None:
    pair, sub = subscribed_pair(100)
    tail = encode_deliver_tail(b"x" * 30, None, None)
    one = len(encode(Deliver(sub, 1, b"x" * 30, None, None)))
    fits = 100 // one
    before = pair.broker.statistics()
    assert pair.broker.deliver_encoded_many(sub, 1, [tail] * (fits + 2)) == fits
    after = pair.broker.statistics()
    assert after.frames_sent - before.frames_sent == fits
    assert pair.broker.room(Channel(ChannelKind.DELIVER, sub)) == 100 - fits * one
    assert pair.broker.deliver_encoded_many(sub, 1 + fits, [tail]) == 0
    pair.run()
    pair.assert_no_errors()  # the client saw nothing beyond its guarantees


def test_an_oversize_frame_raises_first_and_ends_a_batch_later() -> None:
    pair, sub = subscribed_pair(1_000_000)
    small = encode_deliver_tail(b"x", None, None)
    huge = encode_deliver_tail(b"x" * (pair.broker.peer_max_frame + 1), None, None)
    with pytest.raises(LocalProtocolError):
        pair.broker.deliver_encoded_many(sub, 1, [huge, small])
    assert pair.broker.bytes_to_send == 0  # nothing half-done
    assert pair.broker.deliver_encoded_many(sub, 1, [small, huge, small]) == 1
    with pytest.raises(LocalProtocolError):
        pair.broker.deliver_encoded_many(sub, 2, [huge, small])
