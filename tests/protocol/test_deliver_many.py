"""Connection.deliver_encoded_many: the batched form of deliver_encoded."""

from __future__ import annotations

import pytest

from broker.protocol import Channel, ChannelKind, Deliver, DeliverReceived, Gap, Policy
from broker.protocol.frames import encode, encode_deliver_tail

from .pair import ConnectionPair, of, split_frames


def subscribed_pair(deliver_capacity: int) -> tuple[ConnectionPair, int]:
    pair = ConnectionPair(client_policy=Policy(deliver_capacity=deliver_capacity))
    topic = pair.client.bind_topic("t")
    pair.run()
    subscription = pair.client.subscribe(topic)
    pair.run()
    pair.assert_no_errors()
    return pair, subscription


#: Sequence numbers from 1, and from where they take four bytes (the usual
#: case, which has a shorter path of its own).
BASES = pytest.mark.parametrize("base", [0, 70_000])


@BASES
def test_the_bytes_are_those_of_one_deliver_per_tail(base: int) -> None:
    pair, sub = subscribed_pair(10_000)
    payloads = [b"a", b"bb" * 50, b"ccc"]
    tails = [encode_deliver_tail(p, None, None) for p in payloads]
    assert pair.broker.deliver_encoded_many(sub, base + 7, tails) == 3
    frames = split_frames(pair.broker.data_to_send())
    expected = [encode(Deliver(sub, base + 7 + i, p, None, None)) for i, p in enumerate(payloads)]
    assert frames[-3:] == expected
    pair.wire_to_client.extend(frames)
    pair.run()
    received = of(DeliverReceived, pair.client_events)
    assert [e.message.payload for e in received] == payloads
    assert [e.message.seq for e in received] == [base + 7, base + 8, base + 9]
    pair.assert_no_errors()


@BASES
def test_it_stops_where_the_guarantees_end(base: int) -> None:
    pair, sub = subscribed_pair(100)
    tail = encode_deliver_tail(b"x" * 30, None, None)
    one = len(encode(Deliver(sub, base + 1, b"x" * 30, None, None)))
    fits = 100 // one
    before = pair.broker.statistics()
    assert pair.broker.deliver_encoded_many(sub, base + 1, [tail] * (fits + 2)) == fits
    after = pair.broker.statistics()
    assert after.frames_sent - before.frames_sent == fits
    assert pair.broker.room(Channel(ChannelKind.DELIVER, sub)) == 100 - fits * one
    assert pair.broker.deliver_encoded_many(sub, base + 1 + fits, [tail]) == 0
    pair.run()
    pair.assert_no_errors()  # the client saw nothing beyond its guarantees


@BASES
def test_an_oversize_frame_is_a_gap_to_a_client_that_takes_no_parts(base: int) -> None:
    """A client whose Hello gave no max_message cannot take a message larger
    than a frame: it is told of it by a Gap (first of a batch, the rest goes
    on after it), and the batch ends before it otherwise."""
    pair, sub = subscribed_pair(1_000_000)
    small = encode_deliver_tail(b"x", None, None)
    huge = encode_deliver_tail(b"x" * (pair.broker.peer_max_frame + 1), None, None)
    assert pair.broker.deliver_encoded_many(sub, base + 1, [small, huge, small]) == 1
    assert pair.broker.deliver_encoded_many(sub, base + 2, [huge, small]) == 2
    pair.run()
    pair.assert_no_errors()
    events = pair.client_events
    assert [d.message.seq for d in of(DeliverReceived, events)] == [base + 1, base + 3]
    assert [(g.first_seq, g.count) for g in of(Gap, events)] == [(base + 2, 1)]
