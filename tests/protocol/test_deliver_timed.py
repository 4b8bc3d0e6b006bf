"""DeliverTimed: deliveries that carry their records' receive times, for a
subscription that asked for them. The bytes the broker sends, how the
client accounts for them (like a DeliverMany: one frame, one reference per
entry), and the strict refusal of malformed ones."""

from __future__ import annotations

import cbor2
import pytest

from broker.protocol import (
    U64_MAX,
    DeliverMany,
    DeliverManyReceived,
    DeliverTimed,
    GoodbyeCode,
    LocalProtocolError,
    RemoteProtocolError,
)
from broker.protocol._types import LENGTH_PREFIX
from broker.protocol.frames import FrameDecoder, decode_body, encode, encode_deliver_tail

from .pair import split_frames
from .test_deliver_many_frames import (
    closed,
    deliver_channel,
    entries_of,
    frame,
    subscribed_pair,
    tails_of,
)

#: A plausible receive time (2025-11-28, ms since the epoch), and later ones.
T0 = 1_764_294_000_000


@pytest.mark.parametrize("deliver_many", [False, True])
@pytest.mark.parametrize("base", [0, 70_000])
def test_the_broker_sends_the_times_and_the_client_reads_them(
    deliver_many: bool, base: int
) -> None:
    pair, sub = subscribed_pair(deliver_many=deliver_many)
    entries = entries_of([b"a", b"bb" * 50, b"", b"e" * 300], keyed=True)
    entries.append((b"with headers", b"k", [("h", b"v")]))
    times = [T0, T0, T0 + 1, T0 + 1000, U64_MAX]
    sender = pair.broker.sender(deliver_channel(sub))
    before = sender.statistics()
    assert pair.broker.deliver_timed(sub, base, tails_of(entries), times) == 5
    frames = split_frames(pair.broker.data_to_send())
    # One frame whatever the Hello said: the subscription asked for times.
    assert frames == [encode(DeliverTimed(sub, base, entries, times))]
    assert sender.statistics().sent_bytes == before.sent_bytes + len(frames[0])

    pair.wire_to_client.extend(frames)
    (event,) = pair.to_client()
    assert isinstance(event, DeliverManyReceived)
    assert isinstance(event.message, DeliverTimed)
    assert event.message.times == times
    assert event.message.entries == entries
    assert event.size == len(frames[0])
    assert pair.client.subscriptions.references(sub) == 5
    assert pair.client.release(event) == []
    assert pair.client.subscriptions.references(sub) == 0
    pair.run()
    pair.assert_no_errors()


def test_a_single_delivery_is_a_deliver_timed_of_one_entry() -> None:
    pair, sub = subscribed_pair()
    assert pair.broker.deliver_timed(sub, 7, [encode_deliver_tail(b"hello", None, None)], [T0]) == 1
    (only,) = split_frames(pair.broker.data_to_send())
    assert only == encode(DeliverTimed(sub, 7, [(b"hello", None, None)], [T0]))
    # 4-byte prefix, array of 7, type 35, subscription, seq, time (9 bytes), the tail.
    assert only[LENGTH_PREFIX : LENGTH_PREFIX + 4] == bytes([0x87, 0x18, 0x23, sub])


def test_it_stops_where_the_guarantees_end() -> None:
    pair, sub = subscribed_pair(capacity=400)
    entries = entries_of([b"x" * 100] * 10)
    times = [T0 + i for i in range(10)]
    sent = pair.broker.deliver_timed(sub, 1, tails_of(entries), times)
    assert 1 <= sent < 10
    frames = split_frames(pair.broker.data_to_send())
    assert sum(map(len, frames)) <= 400
    got = [decode_body(f[LENGTH_PREFIX:]) for f in frames]
    assert all(isinstance(m, DeliverTimed) for m in got)
    assert [t for m in got for t in m.times] == times[:sent]  # type: ignore[attr-defined]
    assert pair.broker.deliver_timed(sub, 1 + sent, tails_of(entries[sent:]), times[sent:]) == 0


def test_the_times_must_match_the_deliveries() -> None:
    pair, sub = subscribed_pair()
    with pytest.raises(LocalProtocolError):
        pair.broker.deliver_timed(sub, 1, tails_of(entries_of([b"a", b"b"])), [T0])
    with pytest.raises(LocalProtocolError):
        encode(DeliverTimed(sub, 1, entries_of([b"a", b"b"]), [T0]))
    with pytest.raises(LocalProtocolError):
        encode(DeliverTimed(sub, 1, [], []))


def test_a_deliver_timed_to_the_broker_closes_with_protocol_error() -> None:
    pair, sub = subscribed_pair()
    pair.wire_to_broker.append(frame(DeliverTimed(sub, 0, entries_of([b"a"]), [T0])))
    end = closed(pair.to_broker())
    assert end.code == GoodbyeCode.PROTOCOL_ERROR
    assert pair.broker.closed


def test_a_deliver_timed_on_an_unbound_subscription_closes() -> None:
    pair, sub = subscribed_pair()
    pair.wire_to_client.append(frame(DeliverTimed(sub + 5, 0, entries_of([b"a"]), [T0])))
    assert closed(pair.to_client()).code == GoodbyeCode.PROTOCOL_ERROR


def test_it_is_not_a_deliver_many() -> None:
    timed = DeliverTimed(0, 1, entries_of([b"a"]), [T0])
    assert timed != DeliverMany(0, 1, entries_of([b"a"]))
    assert timed.deliveries() == DeliverMany(0, 1, entries_of([b"a"])).deliveries()


MALFORMED = {
    "no entry": [35, 0, 1],
    "an entry without its headers": [35, 0, 1, T0, b"a", None],
    "an entry too many fields": [35, 0, 1, T0, b"a", None, None, None],
    "a negative time": [35, 0, 1, -1, b"a", None, None],
    "a time too large": [35, 0, 1, U64_MAX + 1, b"a", None, None],
    "a float time": [35, 0, 1, 1.5, b"a", None, None],
    "a bool time": [35, 0, 1, True, b"a", None, None],
    "a null time": [35, 0, 1, None, b"a", None, None],
    "a text time": [35, 0, 1, "1", b"a", None, None],
    "a text payload": [35, 0, 1, T0, "a", None, None],
    "a second entry's bad time": [35, 0, 1, T0, b"a", None, None, -5, b"b", None, None],
    "seq beyond u64": [35, 0, U64_MAX, T0, b"a", None, None, T0, b"b", None, None],
    "a negative subscription": [35, -1, 1, T0, b"a", None, None],
}


@pytest.mark.parametrize("fields", MALFORMED.values(), ids=list(MALFORMED))
def test_malformed_deliver_timed_is_a_protocol_error(fields: list[object]) -> None:
    body = cbor2.dumps(fields)
    with pytest.raises(RemoteProtocolError) as info:
        decode_body(body)
    assert info.value.code == GoodbyeCode.PROTOCOL_ERROR
    decoder = FrameDecoder()
    decoder.feed(len(body).to_bytes(4, "big") + body)
    with pytest.raises(RemoteProtocolError):
        list(decoder.messages())


def test_a_malformed_one_closes_the_client_with_a_goodbye() -> None:
    pair, sub = subscribed_pair()
    pair.wire_to_client.append(frame([35, sub, 1, -1, b"a", None, None]))
    end = closed(pair.to_client())
    assert end.code == GoodbyeCode.PROTOCOL_ERROR
    assert "time" in end.reason


def test_every_cut_of_a_deliver_timed_is_refused_cleanly() -> None:
    """Cut anywhere (in a time's eight bytes too), a DeliverTimed is a
    protocol error: never another exception, never a message."""
    body = encode(DeliverTimed(0, 1, entries_of([b"x" * 30, b"y"]), [T0, T0 + 1]))[LENGTH_PREFIX:]
    for cut in range(1, len(body)):
        with pytest.raises(RemoteProtocolError):
            decode_body(body[:cut])
        decoder = FrameDecoder()
        decoder.feed(cut.to_bytes(4, "big") + body[:cut])
        with pytest.raises(RemoteProtocolError):
            list(decoder.messages())
