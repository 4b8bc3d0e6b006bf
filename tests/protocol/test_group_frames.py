"""The consumer-group frames: DeliverGroup (code 38), deliveries with each
record's offset and how often it was delivered before, and Settle (code
39), a client's word on deliveries it names by number. What the broker
sends and the client accounts for (like a DeliverTimed), what the client
sends and the broker passes on (like an Ack), the helpers that make a
Settle's ranges, the fast decoder's agreement with the general one, and the
strict refusal of malformed or misdirected frames."""

from __future__ import annotations

import struct
from itertools import pairwise

import cbor2
import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.protocol import (
    LENGTH_PREFIX,
    SUBSCRIPTION_BINDS,
    TOPIC_BINDS,
    U64_MAX,
    Connection,
    DeliverGroup,
    DeliverMany,
    DeliverManyReceived,
    DeliverTimed,
    Entry,
    FramePart,
    GoodbyeCode,
    LocalProtocolError,
    Message,
    RemoteProtocolError,
    Role,
    Settle,
    SettleOutcome,
)
from broker.protocol.frames import (
    MAX_DELIVER_GROUP,
    MAX_SETTLE_REASON,
    FrameDecoder,
    decode_body,
    deliver_group_head,
    encode,
    encode_body,
    encode_deliver_tail,
    max_settle_ranges,
    settle_ranges,
)
from broker.protocol.frames._decode_fast import _fast_message

from .pair import of, split_frames
from .test_deliver_many_frames import (
    closed,
    deliver_channel,
    entries_of,
    frame,
    subscribed_pair,
    tails_of,
)
from .test_frame_parts import PAYLOAD, large_pair

# ==================================================================== DeliverGroup: codec

_uints = st.one_of(
    st.integers(0, 30), st.sampled_from([23, 24, 255, 256, 65535, 65536, 2**32 - 1, 2**32, U64_MAX])
)
_entry_blobs = st.one_of(
    st.binary(max_size=30), st.sampled_from([0, 1, 23, 24, 255, 256, 300]).map(lambda n: b"e" * n)
)
_plain_entries = st.tuples(_entry_blobs, st.none() | _entry_blobs, st.none())
_headers = st.none() | st.lists(st.tuples(st.text(max_size=5), st.binary(max_size=5)), max_size=2)
_any_entries = st.tuples(_entry_blobs, st.none() | _entry_blobs, _headers)
#: Entry counts: small ones, and both sides of the CBOR array length
#: boundaries (3 + 5N items: N=4 -> 23 in the one-byte head, N=5 -> 28 in a
#: 0x98 head, N=50 -> 253 and N=51 -> 258 in a 0x99 head).
_counts = st.one_of(st.integers(1, 12), st.sampled_from([4, 5, 50, 51]))


@st.composite
def _groups(draw: st.DrawFn, entries: st.SearchStrategy[Entry] = _plain_entries) -> DeliverGroup:
    count = draw(_counts)
    first = min(draw(_uints), U64_MAX - count + 1)  # the last entry's number stays u64
    return DeliverGroup(
        draw(_uints),
        first,
        draw(st.lists(entries, min_size=count, max_size=count)),
        draw(st.lists(_uints, min_size=count, max_size=count)),
        draw(st.lists(_uints, min_size=count, max_size=count)),
    )


def _general(body: bytes) -> Message | str:
    try:
        return decode_body(body)
    except RemoteProtocolError as error:
        return f"refused: {error}"


@given(_groups(_any_entries))
def test_a_deliver_group_round_trips(message: DeliverGroup) -> None:
    data = encode(message)
    assert decode_body(data[LENGTH_PREFIX:]) == message
    decoder = FrameDecoder()
    decoder.feed(data)
    assert list(decoder.messages()) == [(message, len(data))]


@given(_groups())
def test_the_fast_path_reads_a_deliver_group_as_the_general_decoder_does(
    message: DeliverGroup,
) -> None:
    body = encode(message)[LENGTH_PREFIX:]
    fast = _fast_message(body, 0, len(body))
    assert fast == message == decode_body(body)
    assert type(fast) is DeliverGroup


@given(_groups(), st.data())
def test_fast_and_general_agree_on_damaged_deliver_groups(
    message: DeliverGroup, data: st.DataObject
) -> None:
    """A byte changed or the frame cut short: the fast path reads the same
    message as the general decoder, or leaves the frame to it."""
    body = bytearray(encode(message)[LENGTH_PREFIX:])
    where = data.draw(st.integers(0, len(body) - 1))
    if data.draw(st.booleans()):
        body[where] = data.draw(st.integers(0, 255))
    else:
        del body[where:]
    if not body:
        return
    fast = _fast_message(bytes(body), 0, len(body))
    if fast is not None:
        assert fast == _general(bytes(body))


def test_the_fast_path_takes_the_usual_deliver_group() -> None:
    entries: list[Entry] = [(b"x" * 100, None, None), (b"y", b"k", None)] * 40
    for count in (1, 80):
        group = DeliverGroup(3, 70_000, entries[:count], list(range(5, 5 + count)), [0] * count)
        body = encode(group)[LENGTH_PREFIX:]
        assert _fast_message(body, 0, len(body)) == group
    with_headers = DeliverGroup(3, 1, [(b"x", None, [("a", b"b")])], [5], [0])
    body = encode(with_headers)[LENGTH_PREFIX:]
    assert _fast_message(body, 0, len(body)) is None
    assert decode_body(body) == with_headers


def test_the_largest_deliver_group_is_read_and_a_larger_one_not_written() -> None:
    count = MAX_DELIVER_GROUP
    group = DeliverGroup(1, 1, [(b"", None, None)] * count, list(range(count)), [0] * count)
    body = encode(group)[LENGTH_PREFIX:]
    assert body[0] == 0x99
    assert _fast_message(body, 0, len(body)) == group == decode_body(body)
    more = count + 1
    with pytest.raises(LocalProtocolError, match="entries"):
        encode(DeliverGroup(1, 1, [(b"", None, None)] * more, [0] * more, [0] * more))


def test_the_offsets_and_counts_must_match_the_entries() -> None:
    for offsets, delivered in (([1], [0, 0]), ([1, 2], [0]), ([], [])):
        with pytest.raises(LocalProtocolError):
            encode(DeliverGroup(0, 1, entries_of([b"a", b"b"]), offsets, delivered))
    with pytest.raises(LocalProtocolError):
        encode(DeliverGroup(0, 1, [], [], []))


def test_the_head_is_what_encode_writes() -> None:
    group = DeliverGroup(300, 70_000, entries_of([b"a", b"bb"]), [7, 2**40], [0, 3])
    data = encode(group)
    entries = b"".join(
        cbor2.dumps(offset) + cbor2.dumps(before) + encode_deliver_tail(*entry)
        for offset, before, entry in zip(group.offsets, group.delivered, group.entries, strict=True)
    )
    head = deliver_group_head(300, 70_000, 2, len(entries))
    assert head + entries == data
    assert len(deliver_group_head(U64_MAX, U64_MAX, MAX_DELIVER_GROUP, 0)) == 27


MALFORMED_GROUP = {
    "no entry": [38, 0, 1],
    "an entry without its headers": [38, 0, 1, 7, 0, b"a", None],
    "an entry without its delivered count": [38, 0, 1, 7, b"a", None, None],
    "an entry a field too many": [38, 0, 1, 7, 0, b"a", None, None, None],
    "a negative offset": [38, 0, 1, -1, 0, b"a", None, None],
    "an offset too large": [38, 0, 1, U64_MAX + 1, 0, b"a", None, None],
    "a float offset": [38, 0, 1, 1.5, 0, b"a", None, None],
    "a bool offset": [38, 0, 1, True, 0, b"a", None, None],
    "a null offset": [38, 0, 1, None, 0, b"a", None, None],
    "a negative delivered count": [38, 0, 1, 7, -1, b"a", None, None],
    "a text delivered count": [38, 0, 1, 7, "0", b"a", None, None],
    "a null delivered count": [38, 0, 1, 7, None, b"a", None, None],
    "a text payload": [38, 0, 1, 7, 0, "a", None, None],
    "a second entry's bad offset": [38, 0, 1, 7, 0, b"a", None, None, -5, 0, b"b", None, None],
    "seq beyond u64": [38, 0, U64_MAX, 7, 0, b"a", None, None, 8, 0, b"b", None, None],
    "a negative subscription": [38, -1, 1, 7, 0, b"a", None, None],
}


def _assert_refused(fields: list[object]) -> RemoteProtocolError:
    """Both decoders (the frame decoder tries the fast path first) refuse
    ``fields`` as a protocol error; the general decoder's error."""
    body = cbor2.dumps(fields)
    with pytest.raises(RemoteProtocolError) as info:
        decode_body(body)
    assert info.value.code == GoodbyeCode.PROTOCOL_ERROR
    decoder = FrameDecoder()
    decoder.feed(struct.pack(">I", len(body)) + body)
    with pytest.raises(RemoteProtocolError) as framed:
        list(decoder.messages())
    assert framed.value.code == GoodbyeCode.PROTOCOL_ERROR
    return info.value


@pytest.mark.parametrize("fields", MALFORMED_GROUP.values(), ids=list(MALFORMED_GROUP))
def test_a_malformed_deliver_group_is_a_protocol_error(fields: list[object]) -> None:
    _assert_refused(fields)


# ==================================================================== DeliverGroup: on the wire


@pytest.mark.parametrize("deliver_many", [False, True])
@pytest.mark.parametrize("base", [1, 70_000])
def test_the_broker_sends_a_deliver_group_and_the_client_accounts_for_it(
    deliver_many: bool, base: int
) -> None:
    pair, sub = subscribed_pair(deliver_many=deliver_many)
    entries = entries_of([b"a", b"bb" * 50, b"", b"e" * 300], keyed=True)
    entries.append((b"with headers", b"k", [("h", b"v")]))
    offsets = [10, 11, 13, 70_000, U64_MAX]
    delivered = [0, 0, 1, 24, U64_MAX]
    sender = pair.broker.sender(deliver_channel(sub))
    before = sender.statistics()
    assert pair.broker.deliver_group(sub, base, tails_of(entries), offsets, delivered) == 5
    frames = split_frames(pair.broker.data_to_send())
    # One frame whatever the Hello said: a group subscription gets nothing else.
    assert frames == [encode(DeliverGroup(sub, base, entries, offsets, delivered))]
    assert sender.statistics().sent_bytes == before.sent_bytes + len(frames[0])

    pair.wire_to_client.extend(frames)
    (event,) = pair.to_client()
    assert isinstance(event, DeliverManyReceived)
    assert isinstance(event.message, DeliverGroup)
    assert event.message.offsets == offsets
    assert event.message.delivered == delivered
    assert event.message.entries == entries
    assert event.size == len(frames[0])
    assert pair.client.subscriptions.references(sub) == 5
    assert pair.client.release(event) == []
    assert pair.client.subscriptions.references(sub) == 0
    pair.run()
    pair.assert_no_errors()


def test_a_single_delivery_is_a_deliver_group_of_one_entry() -> None:
    pair, sub = subscribed_pair(deliver_many=False)
    tail = encode_deliver_tail(b"hello", None, None)
    assert pair.broker.deliver_group(sub, 1, [tail], [7], [0]) == 1
    (only,) = split_frames(pair.broker.data_to_send())
    assert only == encode(DeliverGroup(sub, 1, [(b"hello", None, None)], [7], [0]))
    # 4-byte prefix, array of 8, type 38, subscription, seq, offset, delivered, the tail.
    assert only[LENGTH_PREFIX:] == bytes([0x88, 0x18, 0x26, sub, 1, 7, 0]) + tail


def test_it_stops_where_the_guarantees_end() -> None:
    pair, sub = subscribed_pair(capacity=400)
    entries = entries_of([b"x" * 100] * 10)
    offsets = [100 + i for i in range(10)]
    delivered = [i % 3 for i in range(10)]
    sent = pair.broker.deliver_group(sub, 1, tails_of(entries), offsets, delivered)
    assert 1 <= sent < 10
    frames = split_frames(pair.broker.data_to_send())
    assert sum(map(len, frames)) <= 400
    got = [decode_body(f[LENGTH_PREFIX:]) for f in frames]
    assert all(isinstance(m, DeliverGroup) for m in got)
    assert [o for m in got for o in m.offsets] == offsets[:sent]  # type: ignore[attr-defined]
    assert [d for m in got for d in m.delivered] == delivered[:sent]  # type: ignore[attr-defined]
    assert got[0].first_seq == 1  # type: ignore[union-attr]
    rest = pair.broker.deliver_group(
        sub, 1 + sent, tails_of(entries[sent:]), offsets[sent:], delivered[sent:]
    )
    assert rest == 0


def test_a_long_batch_goes_in_several_frames_within_max_frame() -> None:
    pair, sub = subscribed_pair(broker_max_frame=1024)
    entries = entries_of([b"p" * 200] * 12)
    offsets = list(range(1, 13))
    assert pair.broker.deliver_group(sub, 1, tails_of(entries), offsets, [0] * 12) == 12
    frames = split_frames(pair.broker.data_to_send())
    assert len(frames) > 1
    assert all(len(f) <= LENGTH_PREFIX + pair.broker.peer_max_frame for f in frames)
    got = [decode_body(f[LENGTH_PREFIX:]) for f in frames]
    seqs = [m.first_seq + i for m in got for i in range(len(m.entries))]  # type: ignore[union-attr]
    assert seqs == list(range(1, 13))
    assert [o for m in got for o in m.offsets] == offsets  # type: ignore[union-attr]


def test_the_broker_checks_what_it_is_asked_to_send() -> None:
    pair, sub = subscribed_pair()
    tails = tails_of(entries_of([b"a", b"b"]))
    for offsets, delivered in (([1], [0, 0]), ([1, 2], [0]), ([-1, 2], [0, 0]), ([1, 2], [0, -1])):
        with pytest.raises(LocalProtocolError):
            pair.broker.deliver_group(sub, 1, tails, offsets, delivered)
    with pytest.raises(LocalProtocolError):
        pair.broker.deliver_group(sub, U64_MAX, tails, [1, 2], [0, 0])
    with pytest.raises(LocalProtocolError):
        pair.client.deliver_group(sub, 1, tails, [1, 2], [0, 0])
    assert pair.broker.bytes_to_send == 0


def test_a_deliver_group_to_the_broker_closes_with_protocol_error() -> None:
    pair, sub = subscribed_pair()
    pair.wire_to_broker.append(frame(DeliverGroup(sub, 1, entries_of([b"a"]), [7], [0])))
    end = closed(pair.to_broker())
    assert end.code == GoodbyeCode.PROTOCOL_ERROR
    assert "DeliverGroup is sent by the broker" in end.reason
    assert pair.broker.closed


def test_a_deliver_group_on_an_unbound_subscription_closes() -> None:
    pair, sub = subscribed_pair()
    pair.wire_to_client.append(frame(DeliverGroup(sub + 5, 1, entries_of([b"a"]), [7], [0])))
    assert closed(pair.to_client()).code == GoodbyeCode.PROTOCOL_ERROR


def test_a_malformed_one_closes_the_client_with_a_goodbye() -> None:
    pair, sub = subscribed_pair()
    pair.wire_to_client.append(frame([38, sub, 1, -1, 0, b"a", None, None]))
    end = closed(pair.to_client())
    assert end.code == GoodbyeCode.PROTOCOL_ERROR
    assert "offset" in end.reason


def test_it_is_neither_a_deliver_many_nor_a_deliver_timed() -> None:
    group = DeliverGroup(0, 1, entries_of([b"a"]), [7], [0])
    assert group != DeliverMany(0, 1, entries_of([b"a"]))
    assert group != DeliverTimed(0, 1, entries_of([b"a"]), [7])
    assert group.deliveries() == DeliverMany(0, 1, entries_of([b"a"])).deliveries()


# ==================================================================== Settle: codec


@st.composite
def _settles(draw: st.DrawFn) -> Settle:
    seqs = draw(st.lists(st.integers(1, 200) | st.sampled_from([2**32, U64_MAX]), min_size=1))
    outcome = draw(st.sampled_from(SettleOutcome))
    detail: int | str | None = None
    if outcome is SettleOutcome.RETRY:
        detail = draw(_uints)
    elif outcome is SettleOutcome.REJECT:
        detail = draw(st.text(max_size=40))
    return Settle(draw(_uints), outcome, settle_ranges(seqs), detail)


@given(_settles())
def test_a_settle_round_trips(message: Settle) -> None:
    data = encode(message)
    got = decode_body(data[LENGTH_PREFIX:])
    assert got == message
    assert isinstance(got, Settle) and type(got.outcome) is SettleOutcome
    assert encode(got) == data


MALFORMED_SETTLE = {
    "a field short": [39, 0, 0, [1, 1]],
    "a field too many": [39, 0, 0, [1, 1], None, None],
    "an unknown outcome": [39, 0, 4, [1, 1], None],
    "a negative outcome": [39, 0, -1, [1, 1], None],
    "a text outcome": [39, 0, "done", [1, 1], None],
    "no range": [39, 0, 0, [], None],
    "ranges not an array": [39, 0, 0, {1: 1}, None],
    "ranges null": [39, 0, 0, None, None],
    "an odd number of range fields": [39, 0, 0, [1, 1, 5], None],
    "ranges as nested pairs": [39, 0, 0, [[1, 1]], None],
    "first 0": [39, 0, 0, [0, 1], None],
    "count 0": [39, 0, 0, [1, 0], None],
    "a negative first": [39, 0, 0, [-1, 1], None],
    "a first too large": [39, 0, 0, [U64_MAX + 1, 1], None],
    "a float count": [39, 0, 0, [1, 1.0], None],
    "a bool count": [39, 0, 0, [1, True], None],
    "a last delivery beyond u64": [39, 0, 0, [U64_MAX, 2], None],
    "ranges descending": [39, 0, 0, [5, 1, 1, 1], None],
    "ranges overlapping": [39, 0, 0, [1, 5, 5, 1], None],
    "a range repeated": [39, 0, 0, [3, 1, 3, 1], None],
    "done with a detail": [39, 0, 0, [1, 1], 0],
    "in_progress with a detail": [39, 0, 3, [1, 1], "busy"],
    "retry without a delay": [39, 0, 1, [1, 1], None],
    "retry with a negative delay": [39, 0, 1, [1, 1], -1],
    "retry with a text delay": [39, 0, 1, [1, 1], "5000"],
    "retry with a float delay": [39, 0, 1, [1, 1], 5000.0],
    "reject without a reason": [39, 0, 2, [1, 1], None],
    "reject with bytes": [39, 0, 2, [1, 1], b"bad"],
    "reject with a reason too long": [39, 0, 2, [1, 1], "é" * 513],
    "a negative subscription": [39, -1, 0, [1, 1], None],
}


@pytest.mark.parametrize("fields", MALFORMED_SETTLE.values(), ids=list(MALFORMED_SETTLE))
def test_a_malformed_settle_is_a_protocol_error(fields: list[object]) -> None:
    _assert_refused(fields)


def test_a_reason_of_1024_bytes_is_taken() -> None:
    reason = "é" * (MAX_SETTLE_REASON // 2)
    message = Settle(0, SettleOutcome.REJECT, [(1, 1)], reason)
    assert decode_body(encode(message)[LENGTH_PREFIX:]) == message


def test_adjacent_ranges_are_well_formed() -> None:
    """Strictly ascending and not overlapping: a range may start right where
    the one before it ends (settle_ranges would have merged them)."""
    message = Settle(0, SettleOutcome.DONE, [(1, 2), (3, 1), (U64_MAX, 1)], None)
    assert decode_body(encode(message)[LENGTH_PREFIX:]) == message


# ==================================================================== Settle: on the wire


def test_a_client_settles_and_the_broker_passes_it_on() -> None:
    pair, sub = subscribed_pair()
    pair.client.settle(sub, SettleOutcome.DONE, [(1, 32), (40, 1)])
    pair.client.settle(sub, SettleOutcome.RETRY, [(3, 1)], 5000)
    pair.client.settle(sub, SettleOutcome.REJECT, [(41, 2)], "cannot parse")
    pair.client.settle(sub, SettleOutcome.IN_PROGRESS, [(50, 1)])
    pair.run()
    pair.assert_no_errors()
    assert of(Settle, pair.broker_events) == [
        Settle(sub, SettleOutcome.DONE, [(1, 32), (40, 1)], None),
        Settle(sub, SettleOutcome.RETRY, [(3, 1)], 5000),
        Settle(sub, SettleOutcome.REJECT, [(41, 2)], "cannot parse"),
        Settle(sub, SettleOutcome.IN_PROGRESS, [(50, 1)], None),
    ]


def test_a_settle_is_a_control_message() -> None:
    """Outside every channel's guarantees: it is sent with no room left."""
    pair, sub = subscribed_pair()
    senders = [pair.client.sender(channel) for channel in (TOPIC_BINDS, SUBSCRIPTION_BINDS)]
    before = [sender.statistics() for sender in senders]
    pair.client.settle(sub, SettleOutcome.DONE, [(1, 1)])
    assert [sender.statistics() for sender in senders] == before
    assert split_frames(pair.client.data_to_send()) == [
        encode(Settle(sub, SettleOutcome.DONE, [(1, 1)]))
    ]


BAD_SETTLES: dict[str, tuple[object, object, object]] = {
    "an unknown outcome": (4, [(1, 1)], None),
    "a bool outcome": (True, [(1, 1)], None),
    "no range": (SettleOutcome.DONE, [], None),
    "ranges not a list": (SettleOutcome.DONE, {1: 1}, None),
    "a range not a pair": (SettleOutcome.DONE, [(1, 1, 1)], None),
    "a range of text": (SettleOutcome.DONE, [("1", 1)], None),
    "first 0": (SettleOutcome.DONE, [(0, 1)], None),
    "count 0": (SettleOutcome.DONE, [(1, 0)], None),
    "a last delivery beyond u64": (SettleOutcome.DONE, [(U64_MAX, 2)], None),
    "ranges descending": (SettleOutcome.DONE, [(5, 1), (1, 1)], None),
    "ranges overlapping": (SettleOutcome.DONE, [(1, 5), (5, 1)], None),
    "done with a detail": (SettleOutcome.DONE, [(1, 1)], 0),
    "in_progress with a detail": (SettleOutcome.IN_PROGRESS, [(1, 1)], "busy"),
    "retry without a delay": (SettleOutcome.RETRY, [(1, 1)], None),
    "retry with a negative delay": (SettleOutcome.RETRY, [(1, 1)], -5),
    "retry with a bool delay": (SettleOutcome.RETRY, [(1, 1)], True),
    "reject without a reason": (SettleOutcome.REJECT, [(1, 1)], None),
    "reject with a reason too long": (SettleOutcome.REJECT, [(1, 1)], "x" * 1025),
    "reject with a reason not UTF-8": (SettleOutcome.REJECT, [(1, 1)], "\udc80"),
}


@pytest.mark.parametrize("args", BAD_SETTLES.values(), ids=list(BAD_SETTLES))
def test_the_client_refuses_what_the_broker_would(args: tuple[object, object, object]) -> None:
    pair, sub = subscribed_pair()
    with pytest.raises(LocalProtocolError) as info:
        pair.client.settle(sub, *args)  # type: ignore[arg-type]
    assert "\n" not in str(info.value)
    assert pair.client.bytes_to_send == 0


def test_the_client_settles_only_its_own_bound_subscriptions() -> None:
    pair, sub = subscribed_pair()
    with pytest.raises(LocalProtocolError, match="not bound"):
        pair.client.settle(sub + 1, SettleOutcome.DONE, [(1, 1)])
    with pytest.raises(LocalProtocolError, match="client"):
        pair.broker.settle(sub, SettleOutcome.DONE, [(1, 1)])
    idle = Connection(Role.CLIENT)
    with pytest.raises(LocalProtocolError, match="not open"):
        idle.settle(0, SettleOutcome.DONE, [(1, 1)])


def test_a_settle_larger_than_the_brokers_max_frame_is_refused() -> None:
    pair, sub = subscribed_pair(broker_max_frame=1024)
    ranges = [(2**40 + 2**34 * i, 2**33) for i in range(100)]  # 18 bytes each
    with pytest.raises(LocalProtocolError, match="max_frame"):
        pair.client.settle(sub, SettleOutcome.DONE, ranges)
    assert pair.client.bytes_to_send == 0
    fits = ranges[: (1024 - 20) // 18]
    pair.client.settle(sub, SettleOutcome.DONE, fits)
    pair.run()
    pair.assert_no_errors()
    assert of(Settle, pair.broker_events) == [Settle(sub, SettleOutcome.DONE, fits, None)]


def test_a_settle_of_an_unbound_subscription_closes_the_broker() -> None:
    pair, sub = subscribed_pair()
    pair.wire_to_broker.append(frame([39, sub + 5, 0, [1, 1], None]))
    end = closed(pair.to_broker())
    assert end.code == GoodbyeCode.PROTOCOL_ERROR
    assert "Settle references unbound subscription handle" in end.reason


def test_a_settle_to_the_client_closes_with_protocol_error() -> None:
    pair, sub = subscribed_pair()
    pair.wire_to_client.append(frame([39, sub, 0, [1, 1], None]))
    end = closed(pair.to_client())
    assert end.code == GoodbyeCode.PROTOCOL_ERROR
    assert "Settle is sent by the client" in end.reason


def test_a_malformed_settle_closes_the_broker_with_a_goodbye() -> None:
    pair, sub = subscribed_pair()
    pair.wire_to_broker.append(frame([39, sub, 0, [5, 1, 1, 1], None]))
    end = closed(pair.to_broker())
    assert end.code == GoodbyeCode.PROTOCOL_ERROR
    assert "ascend" in end.reason
    assert not of(Settle, pair.broker_events)


# ==================================================================== Settle: its ranges


def test_settle_ranges_makes_ascending_pairs_of_runs() -> None:
    assert settle_ranges([]) == []
    assert settle_ranges([1]) == [(1, 1)]
    assert settle_ranges(range(1, 33)) == [(1, 32)]
    assert settle_ranges([40, *range(32, 0, -1)]) == [(1, 32), (40, 1)]
    assert settle_ranges([9, 3, 4, 3, 1]) == [(1, 1), (3, 2), (9, 1)]
    assert settle_ranges([U64_MAX, U64_MAX - 1]) == [(U64_MAX - 1, 2)]
    for bad in ([0], [U64_MAX + 1], [-3, 4]):
        with pytest.raises(ValueError, match="delivery number"):
            settle_ranges(bad)


@given(st.sets(st.integers(1, 300), min_size=1))
def test_settle_ranges_name_exactly_the_numbers_given(seqs: set[int]) -> None:
    ranges = settle_ranges(reversed(sorted(seqs)))
    named = [first + i for first, count in ranges for i in range(count)]
    assert named == sorted(seqs)
    # Maximal runs: one range never ends where the next starts.
    assert all(a + n < b for (a, n), (b, _) in pairwise(ranges))
    message = Settle(0, SettleOutcome.DONE, ranges, None)
    assert decode_body(encode(message)[LENGTH_PREFIX:]) == message


@pytest.mark.parametrize("max_frame", [1100, 4096, 65_536, 1 << 20, 1 << 24])
def test_max_settle_ranges_fit_whatever_the_fields(max_frame: int) -> None:
    most = max_settle_ranges(max_frame)
    assert most >= 1
    # The worst case: every uint 9 bytes, the longest reason.
    ranges = [(2**63 + 2**33 * i, 2**32) for i in range(most)]
    worst = Settle(U64_MAX, SettleOutcome.REJECT, ranges, "é" * (MAX_SETTLE_REASON // 2))
    body = len(encode(worst, max_frame=max_frame)) - LENGTH_PREFIX
    assert body <= max_frame
    assert max_frame - body < 18 + 4  # one range more would not fit (or barely)


def test_max_settle_ranges_is_zero_for_a_tiny_frame() -> None:
    assert max_settle_ranges(64) == 0
    assert max_settle_ranges(0) == 0


# ==================================================================== in parts


@pytest.mark.parametrize("kind", ["group", "timed"])
def test_a_record_larger_than_a_frame_reaches_the_client_in_parts(kind: str) -> None:
    """A DeliverGroup (or DeliverTimed) of one record too large for a frame
    goes as FrameParts and arrives as that one-entry message, accounted as
    one delivery; the records after it follow as usual. (The client used to
    refuse it: its parts made no Deliver.)"""
    pair = large_pair()
    topic = pair.client.bind_topic("t")
    pair.run()
    sub = pair.client.subscribe(topic, "reliable")
    pair.run()
    big: Entry = (PAYLOAD, b"k", [("h", b"v")])
    tails = tails_of([big, (b"x", None, None)])
    calls = 0
    while not (
        pair.broker.deliver_group(sub, 1, tails, [7, 8], [2, 0])
        if kind == "group"
        else pair.broker.deliver_timed(sub, 1, tails, [70, 80])
    ):
        calls += 1
        pair.run()
        assert calls < 1000
    pair.run()
    pair.assert_no_errors()
    got = of(DeliverManyReceived, pair.client_events)
    assert len(got) == 2
    whole, small = got[0].message, got[1].message
    assert whole.entries == [big] and small.entries == [(b"x", None, None)]
    assert (whole.first_seq, small.first_seq) == (1, 2)
    if kind == "group":
        assert isinstance(whole, DeliverGroup) and isinstance(small, DeliverGroup)
        assert (whole.offsets, whole.delivered) == ([7], [2])
    else:
        assert isinstance(whole, DeliverTimed) and whole.times == [70]
    assert pair.client.subscriptions.references(sub) == 2
    assert pair.client.reassembling == 0
    for event in got:
        assert pair.client.release(event) == []
    assert pair.client.subscriptions.references(sub) == 0


def test_parts_of_a_deliver_group_of_two_entries_close_the_client() -> None:
    pair = large_pair()
    topic = pair.client.bind_topic("t")
    pair.run()
    sub = pair.client.subscribe(topic, "reliable")
    pair.run()
    two = DeliverGroup(sub, 1, entries_of([b"a", b"b"]), [1, 2], [0, 0])
    channel = deliver_channel(sub)
    pair.wire_to_client.append(encode(FramePart(channel, 0xC0, encode_body(two))))
    end = closed(pair.to_client())
    assert end.code == GoodbyeCode.PROTOCOL_ERROR
    assert "of one entry" in end.reason
