"""The codec's fast path for Publish, Deliver, DeliverMany, DeliverTimed,
Ack and IssueGuarantee agrees with the general decoder.

``FrameDecoder`` reads the usual shape of the message-carrying frames
directly. For any bytes, what it yields must be exactly what the general
(cbor2-based, strict) decoder yields: the same message, or the same refusal.
"""

from __future__ import annotations

import struct

import cbor2
import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.protocol import (
    U64_MAX,
    Ack,
    Channel,
    ChannelKind,
    Confirm,
    Deliver,
    DeliverMany,
    DeliverTimed,
    Entry,
    IssueGuarantee,
    LocalProtocolError,
    Message,
    Publish,
    RemoteProtocolError,
)
from broker.protocol.frames import (
    FrameDecoder,
    decode_body,
    encode,
    encode_deliver,
    encode_deliver_tail,
)
from broker.protocol.frames._decode_fast import _fast_message
from broker.protocol.frames._encode import (
    MAX_DELIVER_MANY,
    _fields,
    deliver_heads,
    deliver_many_head,
    deliver_many_head_size,
    encode_publish,
)

#: Sizes on both sides of every CBOR length boundary.
_edges = st.sampled_from([0, 1, 23, 24, 255, 256, 300, 65535, 65536])
_uints = st.one_of(
    st.integers(0, 30), st.sampled_from([23, 24, 255, 256, 65535, 65536, 2**32 - 1, 2**32, U64_MAX])
)
_blobs = st.one_of(st.binary(max_size=40), _edges.map(lambda n: b"p" * n))
_keys = st.none() | _blobs
#: DeliverMany entry counts: small ones, and both sides of the CBOR array
#: length boundaries (3 + 3N items: N=6 -> 21 items in the one-byte head,
#: N=7 -> 24 and N=84 -> 255 in a 0x98 head, N=85 -> 258 in a 0x99 head).
_counts = st.one_of(st.integers(1, 30), st.sampled_from([6, 7, 8, 84, 85]))
#: Entry payloads and keys: every blob head (short, 0x58 -- the commonest
#: entry has its own shortcut --, 0x59), kept small since entries are many.
_entry_blobs = st.one_of(
    st.binary(max_size=30), st.sampled_from([0, 1, 23, 24, 255, 256, 300]).map(lambda n: b"e" * n)
)
_plain_entries = st.tuples(_entry_blobs, st.none() | _entry_blobs, st.none())
#: Where a DeliverMany's sequence numbers start, as a gap below U64_MAX too.
_seq_bases = st.sampled_from([0, 23, 24, 70_000, 2**32])


@st.composite
def _deliver_manys(draw: st.DrawFn) -> DeliverMany:
    count = draw(_counts)
    entries = draw(st.lists(_plain_entries, min_size=count, max_size=count))
    first = draw(_uints | _seq_bases)
    first = min(first, U64_MAX - count + 1)  # the last entry's seq stays u64
    return DeliverMany(draw(_uints), first, entries)


#: Record times: real ones (9 bytes, often repeated), and every uint head.
_times = st.one_of(st.sampled_from([1_764_294_000_000, 1_764_294_000_001]), _uints)


@st.composite
def _deliver_timeds(draw: st.DrawFn) -> DeliverTimed:
    many = draw(_deliver_manys())
    times = draw(st.lists(_times, min_size=len(many.entries), max_size=len(many.entries)))
    return DeliverTimed(many.subscription, many.first_seq, many.entries, times)


_channels = st.one_of(
    st.sampled_from(
        [Channel(ChannelKind.TOPIC_BINDS, 0), Channel(ChannelKind.SUBSCRIPTION_BINDS, 0)]
    ),
    st.builds(Channel, st.sampled_from([ChannelKind.PUBLISH, ChannelKind.DELIVER]), _uints),
)

_messages = st.one_of(
    st.builds(Ack, _uints, _uints),
    st.builds(IssueGuarantee, _channels, _uints),
    st.builds(Publish, _uints, _blobs, _keys, st.none()),
    st.builds(Deliver, _uints, _uints, _blobs, _keys, st.none()),
    _deliver_manys(),
    _deliver_timeds(),
)


def _general(body: bytes) -> Message | str:
    """What the general decoder makes of ``body``: a message, or its refusal."""
    try:
        return decode_body(body)
    except RemoteProtocolError as error:
        return f"refused: {error}"


def _through_decoder(body: bytes) -> Message | str:
    decoder = FrameDecoder(max_frame=1 << 20)
    decoder.feed(struct.pack(">I", len(body)) + body)
    try:
        ((message, size),) = list(decoder.messages())
    except RemoteProtocolError as error:
        return f"refused: {error}"
    assert size == len(body) + 4
    return message


def _assert_read_alike(body: bytes) -> None:
    """The fast path, if it takes ``body``, reads what the general decoder
    reads, and the frame decoder (both ways together) agrees."""
    fast = _fast_message(body, 0, len(body))
    general = _general(body)
    if fast is not None:
        assert fast == general
    assert _through_decoder(body) == general


@given(_messages)
def test_fast_path_reads_what_the_general_decoder_reads(message: Message) -> None:
    body = cbor2.dumps(_fields(message))
    assert _fast_message(body, 0, len(body)) == message
    assert _general(body) == message
    assert encode(message, max_frame=1 << 20)[4:] == body


@given(_messages, st.data())
def test_damaged_frames_are_read_alike(message: Message, data: st.DataObject) -> None:
    body = bytearray(cbor2.dumps(_fields(message)))
    for _ in range(data.draw(st.integers(1, 3))):
        what = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        at = data.draw(st.integers(0, len(body)))
        if what == "flip" and at < len(body):
            body[at] = data.draw(st.integers(0, 255))
        elif what == "cut":
            del body[at:]
        else:
            body[at:at] = data.draw(st.binary(min_size=1, max_size=3))
    if not body:
        return
    damaged = bytes(body)
    _assert_read_alike(damaged)


@pytest.mark.parametrize(
    "body",
    [
        # Integers in longer forms than needed (CBOR allows them).
        bytes([0x85, 0x18, 0x20, 0x18, 0x05, 0x41, 0x61, 0xF6, 0xF6]),
        bytes([0x85, 0x18, 0x20, 0x19, 0x00, 0x05, 0x58, 0x01, 0x61, 0xF6, 0xF6]),
        bytes([0x86, 0x18, 0x21, 0x1A, 0, 0, 0, 1, 0x1B, 0, 0, 0, 0, 0, 0, 0, 2, 0x40, 0x40, 0xF6]),
        # With headers: the general way only.
        cbor2.dumps([32, 1, b"x", None, [["h", b"v"]]]),
        # A text payload, a negative handle, a trailing byte, a short frame.
        cbor2.dumps([32, 1, "x", None, None]),
        cbor2.dumps([32, -1, b"x", None, None]),
        cbor2.dumps([32, 1, b"x", None, None]) + b"\x00",
        bytes([0x85, 0x18, 0x20, 0x01, 0x45, 0x61]),
        # Ack and IssueGuarantee: longer integer forms, a channel kind or
        # bind channel index out of range, a negative or text field, a
        # trailing byte, cut short, a channel that is not a pair.
        bytes([0x83, 0x15, 0x18, 0x05, 0x19, 0x00, 0x07]),
        bytes([0x83, 0x0A, 0x82, 0x02, 0x18, 0x03, 0x1A, 0, 1, 0, 0]),
        cbor2.dumps([10, [4, 0], 5]),
        cbor2.dumps([10, [0, 1], 5]),
        cbor2.dumps([10, [1, 0], 5]),
        cbor2.dumps([21, -1, 2]),
        cbor2.dumps([21, 1, "2"]),
        cbor2.dumps([21, 1, 2]) + b"\x00",
        cbor2.dumps([10, [2, 1], 70_000])[:-1],
        cbor2.dumps([10, 2, 1]),
        cbor2.dumps([10, [2, 1, 3], 1]),
        cbor2.dumps([23, 1, 2]),
    ],
)
def test_edge_shapes_are_read_alike(body: bytes) -> None:
    _assert_read_alike(body)


@given(_deliver_manys(), st.data())
def test_damaged_deliver_many_heads_are_read_alike(
    message: DeliverMany, data: st.DataObject
) -> None:
    """Damage where a DeliverMany's fast reader does most of its checking:
    the array head, type code, handle and first sequence number, and the
    frame's end."""
    body = bytearray(cbor2.dumps(_fields(message)))
    for _ in range(data.draw(st.integers(1, 3))):
        what = data.draw(st.sampled_from(["flip", "cut", "insert", "count"]))
        at = data.draw(st.integers(0, min(len(body), 14)))
        if what == "flip" and at < len(body):
            body[at] = data.draw(st.integers(0, 255))
        elif what == "cut":
            del body[len(body) - data.draw(st.integers(0, min(len(body), 8))) :]
        elif what == "insert":
            body[at:at] = data.draw(st.binary(min_size=1, max_size=3))
        elif what == "count" and len(body) > 1:  # another item count in the same head
            if body[0] in (0x98, 0x99):
                body[1] = data.draw(st.integers(0, 255))
            elif body[0] >= 0x86:
                body[0] = data.draw(st.integers(0x80, 0x97))
    if not body:
        return
    damaged = bytes(body)
    _assert_read_alike(damaged)


def _many_body(head: bytes, *fields: object) -> bytes:
    """A DeliverMany-like body: the array head ``head`` as given (whatever
    item count it says), then type code 34 and ``fields``."""
    return head + b"".join(cbor2.dumps(f) for f in (34, *fields))


_A = (b"a", None, None)
_B = (b"b" * 30, b"k", None)


@pytest.mark.parametrize(
    "body",
    [
        # Non-minimal array heads: 0x98 and 0x99 with a small count, and 0x9A.
        _many_body(b"\x98\x06", 1, 5, *_A),
        _many_body(b"\x98\x09", 1, 5, *_A, *_B),
        _many_body(b"\x99\x00\x06", 1, 5, *_A),
        _many_body(b"\x99\x00\x09", 1, 5, *_A, *_B),
        _many_body(b"\x9a\x00\x00\x00\x06", 1, 5, *_A),
        # The shortest heads around the boundaries.
        cbor2.dumps(_fields(DeliverMany(1, 5, [_A] * 6))),
        cbor2.dumps(_fields(DeliverMany(1, 5, [_A] * 7))),
        cbor2.dumps(_fields(DeliverMany(1, 5, [_B] * 84))),
        cbor2.dumps(_fields(DeliverMany(1, 5, [_B] * 85))),
        # An entry with headers (empty or not): the general way only.
        cbor2.dumps([34, 1, 5, b"a", None, None, b"b", None, [["h", b"v"]]]),
        cbor2.dumps([34, 1, 5, b"a", None, []]),
        cbor2.dumps([34, 1, 5, b"a" * 30, None, []]),
        cbor2.dumps([34, 1, 5, b"a" * 30, None, [["h", b"v"]], b"b", None, None]),
        cbor2.dumps([34, 1, 5, b"a" * 30, None, [], b"b", None, None]),
        cbor2.dumps([34, 1, 5, b"a" * 30, b"k", []]),
        # Item counts that are not 3 + a multiple of 3, in every head form.
        cbor2.dumps([34, 1, 5, b"a", None, None, b"b"]),
        cbor2.dumps([34, 1, 5, b"a", None, None, b"b", None]),
        cbor2.dumps([34, 1, 5, b"a", None]),
        cbor2.dumps([34, 1, 5, *([b"a", None, None] * 8), b"x"]),
        _many_body(b"\x98\x07", 1, 5, *_A, b"x"),
        _many_body(b"\x99\x00\x08", 1, 5, *_A, b"x", None),
        # A head whose count runs beyond the frame, or stops before its end.
        _many_body(b"\x87", 1, 5, *_A),
        _many_body(b"\x88", 1, 5, *_A),
        _many_body(b"\x98\x07", 1, 5, *_A),
        _many_body(b"\x99\x00\x08", 1, 5, *_A),
        _many_body(b"\x8a", 1, 5, *_A, *_B),
        _many_body(b"\x98\x09", 1, 5, *_A),
        _many_body(b"\x98\x06", 1, 5, *_A, *_A),
        _many_body(b"\x98\xff", 1, 5, *_A),
        _many_body(b"\x99\xff\xff", 1, 5, *_A),
        # Sequence numbers: the last one at U64_MAX, and one past it.
        cbor2.dumps([34, 1, U64_MAX, b"a", None, None]),
        cbor2.dumps([34, 1, U64_MAX - 1, b"a", None, None, b"b", None, None]),
        cbor2.dumps([34, 1, U64_MAX, b"a", None, None, b"b", None, None]),
        cbor2.dumps([34, 1, U64_MAX - 1, *([b"a", None, None] * 3)]),
        cbor2.dumps([34, 1, U64_MAX + 1, b"a", None, None]),
        cbor2.dumps([34, U64_MAX + 1, 0, b"a", None, None]),
        # A trailing byte, a truncated last entry.
        cbor2.dumps([34, 1, 5, b"a", None, None, b"b", None, None]) + b"\x00",
        cbor2.dumps([34, 1, 5, b"a", None, None, b"b", None, None]) + b"\xf6",
        cbor2.dumps([34, 1, 5, b"a", None, None, b"b" * 30, None, None])[:-1],
        cbor2.dumps([34, 1, 5, b"a", None, None, b"b" * 30, None, None])[:-3],
        # Wrong field types: text payload or key, negative or text handle,
        # a non-null non-blob key, headers not an array.
        cbor2.dumps([34, 1, 5, "a", None, None]),
        cbor2.dumps([34, 1, 5, b"a" * 30, "k", None]),
        cbor2.dumps([34, -1, 5, b"a", None, None]),
        cbor2.dumps([34, 1, -5, b"a", None, None]),
        cbor2.dumps([34, "1", 5, b"a", None, None]),
        cbor2.dumps([34, 1, 5, b"a", 7, None]),
        cbor2.dumps([34, 1, 5, b"a", None, b"h"]),
        cbor2.dumps([34, 1, 5, b"a", None, False]),
        # Non-minimal integers (CBOR allows them).
        bytes([0x86, 0x18, 0x22, 0x19, 0x00, 0x01, 0x1B, *bytes(7), 5, 0x41, 0x61, 0xF6, 0xF6]),
        # Another type code where the fast reader looks for 34.
        cbor2.dumps([35, 1, 5, b"a", None, None]),
        bytes([0x86, 0x19, 0x00, 0x22, 0x01, 0x05, 0x41, 0x61, 0xF6, 0xF6]),
        # An indefinite-length array.
        b"\x9f" + cbor2.dumps([34, 1, 5, b"a", None, None])[1:] + b"\xff",
    ],
)
def test_deliver_many_edge_shapes_are_read_alike(body: bytes) -> None:
    _assert_read_alike(body)


@pytest.mark.parametrize(
    "body",
    [
        bytes([0x98, 0x03, 0x18, 0x22, 0x01, 0x18, 0x05]),
        bytes([0x99, 0x00, 0x03, 0x18, 0x22, 0x01, 0x05]),
        bytes([0x98, 0x00, 0x18, 0x22, 0x01, 0x18, 0x05]),
    ],
)
def test_a_deliver_many_head_without_entries_is_refused(body: bytes) -> None:
    assert isinstance(_general(body), str)  # the general decoder refuses it
    assert _fast_message(body, 0, len(body)) is None
    assert isinstance(_through_decoder(body), str)


def test_the_fast_path_takes_the_usual_frames() -> None:
    """Publish and Deliver without headers are read by the fast path (or the
    point of it is lost); a frame with headers is not."""
    publish = encode(Publish(3, b"x" * 100, b"k"))[4:]
    deliver = encode(Deliver(3, 1000, b"x" * 100))[4:]
    assert _fast_message(publish, 0, len(publish)) == Publish(3, b"x" * 100, b"k")
    assert _fast_message(deliver, 0, len(deliver)) == Deliver(3, 1000, b"x" * 100)
    with_headers = encode(Publish(3, b"x", None, [("a", b"b")]))[4:]
    assert _fast_message(with_headers, 0, len(with_headers)) is None
    for control in (Ack(3, 70_000), IssueGuarantee(Channel(ChannelKind.DELIVER, 3), 65_536)):
        body = encode(control)[4:]
        assert _fast_message(body, 0, len(body)) == control
    many = DeliverMany(3, 70_000, [(b"x" * 100, None, None), (b"y", b"k", None)] * 40)
    body = encode(many)[4:]
    assert _fast_message(body, 0, len(body)) == many
    many.entries[-1] = (b"y", b"k", [("a", b"b")])
    body = encode(many)[4:]
    assert _fast_message(body, 0, len(body)) is None
    assert _general(body) == many
    for count in (1, 80):
        entries: list[Entry] = [(b"x" * 100, None, None), (b"y", b"k", None)] * 40
        timed = DeliverTimed(
            3, 70_000, entries[:count], [1_764_294_000_000 + i // 7 for i in range(count)]
        )
        body = encode(timed)[4:]
        assert _fast_message(body, 0, len(body)) == timed


def test_the_largest_deliver_many_is_read_and_a_larger_one_not_written() -> None:
    """MAX_DELIVER_MANY entries take a 0x99 head (the longest the fast
    reader knows) and are read alike; one more, or none, cannot be encoded."""
    many = DeliverMany(1, 0, [(b"", None, None)] * MAX_DELIVER_MANY)
    body = encode(many)[4:]
    assert body[0] == 0x99
    assert _fast_message(body, 0, len(body)) == many
    assert _general(body) == many
    for entries in ([], [(b"", None, None)] * (MAX_DELIVER_MANY + 1)):
        with pytest.raises(LocalProtocolError, match="entries"):
            encode(DeliverMany(1, 0, entries))


@given(_uints, _blobs, _keys)
def test_the_direct_publish_encoder_writes_what_encode_writes(
    topic: int, payload: bytes, key: bytes | None
) -> None:
    frame = encode_publish(topic, payload, key, max_frame=1 << 20)
    assert frame == encode(Publish(topic, payload, key), max_frame=1 << 20)


@given(
    st.one_of(
        st.builds(Ack, _uints, _uints),
        st.builds(Confirm, _uints, _uints),
        st.builds(IssueGuarantee, _channels, _uints),
    )
)
def test_the_direct_notice_encoder_writes_what_the_generic_one_writes(
    message: Ack | Confirm | IssueGuarantee,
) -> None:
    assert encode(message)[4:] == cbor2.dumps(_fields(message))
    assert decode_body(encode(message)[4:]) == message


def test_a_notice_the_direct_encoder_does_not_take_is_encoded_as_before() -> None:
    """Fields out of the u64 range are the generic encoder's (and the
    peer's decoder refuses what it wrote)."""
    for wrong in (
        Ack(-1, 2),
        Confirm(1, U64_MAX + 1),
        IssueGuarantee(Channel(ChannelKind.PUBLISH, -3), 1),
    ):
        body = encode(wrong)[4:]
        assert body == cbor2.dumps(_fields(wrong))
        with pytest.raises(RemoteProtocolError):
            decode_body(body)


@given(_uints, _uints, st.lists(_blobs, max_size=5))
def test_deliver_heads_are_what_encode_deliver_writes(
    subscription: int, first: int, tails: list[bytes]
) -> None:
    first = min(first, U64_MAX - len(tails))
    heads = list(deliver_heads(subscription, first, tails))
    assert heads == [encode_deliver(subscription, first + i, t)[0] for i, t in enumerate(tails)]


def test_the_direct_publish_encoder_keeps_to_max_frame() -> None:
    with pytest.raises(LocalProtocolError, match="max_frame"):
        encode_publish(1, b"x" * 2000, None, max_frame=1024)


_head_entries = st.tuples(
    _entry_blobs,
    st.none() | _entry_blobs,
    st.none() | st.lists(st.tuples(st.text(max_size=5), st.binary(max_size=5)), max_size=2),
)


@given(
    _uints,
    st.lists(_head_entries, min_size=1, max_size=30)
    | _counts.map(lambda n: [(b"e", None, None)] * n),
    st.sampled_from([0, 23, 24, 70_000, 2**32, None]),
)
def test_deliver_many_head_and_tails_are_what_encode_writes(
    subscription: int, entries: list[Entry], base: int | None
) -> None:
    """A DeliverMany frame written as its head and the Deliver tails of its
    entries (from every sequence base; None: the last entry at U64_MAX)."""
    count = len(entries)
    first = U64_MAX - count + 1 if base is None else base
    tails = [encode_deliver_tail(*entry) for entry in entries]
    size = sum(len(tail) for tail in tails)
    head = deliver_many_head(subscription, first, count, size)
    frame = encode(DeliverMany(subscription, first, entries), max_frame=1 << 24)
    assert head + b"".join(tails) == frame
    assert len(head) == deliver_many_head_size(subscription, first, count) <= 27
    assert _through_decoder(frame[4:]) == DeliverMany(subscription, first, entries)


def test_the_longest_deliver_many_head_is_27_bytes() -> None:
    head = deliver_many_head(U64_MAX, U64_MAX - MAX_DELIVER_MANY + 1, MAX_DELIVER_MANY, 0)
    assert len(head) == 27
