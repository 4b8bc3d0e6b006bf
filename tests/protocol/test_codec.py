"""The frame codec: every message round-trips, every malformed frame is refused.

Decoding is strict: anything but exactly one well-formed message of a known
type becomes :class:`RemoteProtocolError` with the Goodbye code to send, and
never any other exception.
"""

from __future__ import annotations

import dataclasses
import struct
import tracemalloc
from typing import Any

import cbor2
import pytest
from cbor2 import CBORTag

from broker.protocol import (
    DEFAULT_MAX_FRAME,
    LENGTH_PREFIX,
    SUBSCRIPTION_BINDS,
    TOPIC_BINDS,
    U64_MAX,
    Abort,
    Absolve,
    Ack,
    Admin,
    AdminAnswer,
    AdminStatus,
    AnnounceDropping,
    Apologise,
    BindTopic,
    Channel,
    ChannelKind,
    Commit,
    Confirm,
    Deliver,
    DeliverGroup,
    DeliverMany,
    DeliverMatched,
    DeliverTimed,
    FramePart,
    FreeHandle,
    Gap,
    Goodbye,
    GoodbyeCode,
    Headers,
    Hello,
    IssueGuarantee,
    LimitReceiving,
    LimitSending,
    ListOffsets,
    LocalProtocolError,
    Matched,
    MatchedGap,
    Message,
    MessageType,
    Offsets,
    Outcome,
    OutcomeStatus,
    Ping,
    Plead,
    Pong,
    Publish,
    PublishMany,
    RemoteProtocolError,
    Settle,
    SettleOutcome,
    Stage,
    Subscribe,
    Throttled,
    Welcome,
)
from broker.protocol.frames import (
    FrameDecoder,
    decode_body,
    encode,
    encode_body,
    encode_deliver,
    encode_deliver_tail,
)

I64_MIN = -(1 << 63)
I64_MAX = (1 << 63) - 1
SESSION = bytes(range(16))

PUBLISH_TOPIC = Channel(ChannelKind.PUBLISH, 0)
DELIVER_MAX = Channel(ChannelKind.DELIVER, U64_MAX)

# --------------------------------------------------------------------------- samples

#: Every message type, with edge values of every field kind.
MESSAGES: list[Message] = [
    Hello(1, "client", None, {}),
    Hello(0, "", SESSION, {0: 0, 1: U64_MAX, U64_MAX: 7}),
    Hello(U64_MAX, "ünïcødé ✓", b"", {}),
    Hello(1, "c", b"\x00" * 40, {3: 4}),
    Hello(1, "link", None, {}, None, True, False, True),
    Welcome(1, SESSION, False, b"epoch", 15_000, 5_000, DEFAULT_MAX_FRAME, {}),
    Welcome(0, b"\xff" * 16, True, b"", 0, 0, 0, {0: 0, U64_MAX: U64_MAX}, (0, 0)),
    Welcome(U64_MAX, SESSION, True, b"e" * 300, U64_MAX, U64_MAX, U64_MAX, {5: 1}, (6, U64_MAX)),
    Welcome(1, SESSION, False, b"e", 1, 1, 64, {}, publish_many=True),
    Hello(1, "large", None, {}, max_message=8 * 1024 * 1024),
    Welcome(1, SESSION, False, b"e", 1, 1, 64, {}, max_message=U64_MAX),
    FramePart(Channel(ChannelKind.PUBLISH, 3), 0x80, b"first part"),
    FramePart(Channel(ChannelKind.DELIVER, U64_MAX), 0x40, b""),
    FramePart(Channel(ChannelKind.PUBLISH, 0), 0xC0, b"\x00" * 300),
    Ping(0),
    Ping(U64_MAX),
    Pong(0),
    Pong(U64_MAX),
    Goodbye(0, ""),
    Goodbye(int(GoodbyeCode.FRAME_TOO_LARGE), "too big"),
    Goodbye(U64_MAX, "r" * 1000),
    Throttled(PUBLISH_TOPIC, True),
    Throttled(Channel(ChannelKind.PUBLISH, U64_MAX), False),
    IssueGuarantee(TOPIC_BINDS, 0),
    IssueGuarantee(SUBSCRIPTION_BINDS, U64_MAX),
    IssueGuarantee(DELIVER_MAX, 1),
    Absolve(PUBLISH_TOPIC, 0),
    Absolve(DELIVER_MAX, U64_MAX),
    Plead(TOPIC_BINDS, 0),
    Plead(Channel(ChannelKind.DELIVER, 0), U64_MAX),
    LimitSending(SUBSCRIPTION_BINDS, 0),
    LimitSending(Channel(ChannelKind.PUBLISH, 2**32), U64_MAX),
    LimitReceiving(TOPIC_BINDS, U64_MAX),
    LimitReceiving(Channel(ChannelKind.DELIVER, 3), 0),
    AnnounceDropping(TOPIC_BINDS),
    AnnounceDropping(DELIVER_MAX),
    Apologise(SUBSCRIPTION_BINDS),
    Apologise(Channel(ChannelKind.PUBLISH, 65_536)),
    FreeHandle(0, 0, True),
    FreeHandle(1, U64_MAX, False),
    Ack(0, 0),
    Ack(U64_MAX, U64_MAX),
    Gap(0, 0, 0),
    Gap(U64_MAX, U64_MAX, U64_MAX),
    Confirm(0, 0),
    Confirm(U64_MAX, U64_MAX),
    BindTopic(""),
    BindTopic("news/ünïcødé/" + "x" * 500),
    BindTopic("t", Stage("b", "m")),
    BindTopic("events", Stage("query/" + "q" * 250, "ünï/0")),
    Commit(0, "b", []),
    Commit(U64_MAX, "job-1", [("0/0", 5), ("1/1", U64_MAX), ("2/0", 0)]),
    Abort(0, "b"),
    Abort(U64_MAX, "x" * 256),
    Outcome(0, 0, 0, ""),
    Outcome(U64_MAX, int(OutcomeStatus.REFUSED), U64_MAX, "member 0/0 staged 3, not 5"),
    ListOffsets(0, None),
    ListOffsets(U64_MAX, []),
    ListOffsets(7, ["events", "ünï.topic"]),
    Offsets(0, [], "this broker keeps no topic log"),
    Offsets(U64_MAX, [("a", 1, 1), ("events", 5, U64_MAX)]),
    Subscribe(0, "reliable", {}),
    Subscribe(U64_MAX, "lossy", {"none": None}),
    Subscribe(1, "latest", {"min": I64_MIN, "max": I64_MAX, "zero": 0}),
    Subscribe(2, "reliable", {"text": "", "more": "ünï", "yes": True, "no": False}),
    Subscribe(3, "nonsense mode", {"f": 1.5, "neg": -0.0, "big": 1e300, "tiny": 5e-324}),
    Subscribe(4, "", {"": 1, "a": None, "b": "x", "c": True, "d": 2.25}),
    Publish(0, b""),
    Publish(U64_MAX, b"\x00" * 100, b"", []),
    Publish(1, b"payload", None, None),
    Publish(2, b"p", b"key", [("h", b"v")]),
    Publish(3, b"p", None, [("dup", b"1"), ("dup", b"2"), ("", b""), ("dup", b"1")]),
    Deliver(0, 0, b""),
    Deliver(U64_MAX, U64_MAX, b"x" * 70_000, b"k" * 30, [("a", b"")]),
    Deliver(1, 2, b"p", None, []),
    Deliver(24, 2**32, b"p", b"", [("n", b"1"), ("n", b"2")]),
    DeliverMany(0, 0, [(b"", None, None)]),
    DeliverMany(U64_MAX, U64_MAX, [(b"x" * 70_000, b"k" * 30, [("a", b"")])]),
    DeliverMany(3, 2**32, [(b"p" * 100, None, None), (b"", b"", []), (b"q", None, [("n", b"1")])]),
    DeliverMany(24, U64_MAX - 99, [(bytes([i]) * i, None, None) for i in range(100)]),
    *(
        PublishMany(
            topic, [encode_deliver_tail(*entry) for entry in entries], [e[1] for e in entries]
        )
        for topic, entries in [
            (0, [(b"", None, None)]),
            (U64_MAX, [(b"x" * 70_000, b"k" * 30, [("a", b"")])]),
            (3, [(b"p" * 100, None, None), (b"", b"", []), (b"q", None, [("n", b"1")])]),
            (24, [(bytes([i]) * i, None, None) for i in range(100)]),
            (7, [(b"p" * 30, None, None), (b"k", b"key", None)]),
        ]
    ),
    DeliverTimed(0, 0, [(b"", None, None)], [0]),
    DeliverTimed(U64_MAX, U64_MAX, [(b"x" * 70_000, b"k" * 30, [("a", b"")])], [U64_MAX]),
    DeliverTimed(3, 2**32, [(b"p", None, None), (b"", b"", [])], [1_764_294_000_000, 23]),
    DeliverTimed(24, 7, [(bytes([i]) * i, None, None) for i in range(100)], list(range(100))),
    DeliverGroup(0, 1, [(b"", None, None)], [0], [0]),
    DeliverGroup(
        U64_MAX, U64_MAX, [(b"x" * 70_000, b"k" * 30, [("a", b"")])], [U64_MAX], [U64_MAX]
    ),
    DeliverGroup(3, 2**32, [(b"p", None, None), (b"", b"", [])], [70_000, 70_001], [0, 24]),
    DeliverGroup(
        24, 7, [(bytes([i]) * i, None, None) for i in range(100)], list(range(100)), [1] * 100
    ),
    Settle(0, SettleOutcome.DONE, [(1, 1)], None),
    Settle(U64_MAX, SettleOutcome.RETRY, [(1, 32), (40, 1), (U64_MAX, 1)], U64_MAX),
    Settle(3, SettleOutcome.REJECT, [(2**32, 2**40)], "poison: " + "é" * 508),
    Settle(24, SettleOutcome.IN_PROGRESS, [(i * 3 + 1, 2) for i in range(100)], None),
    Settle(5, SettleOutcome.REJECT, [(7, 1)], ""),
    Subscribe("orders.*", "reliable", {"from": -10, "cursor": "c"}),
    Subscribe(">", "lossy", {}),
    Matched(0, 0, "orders.eu"),
    Matched(U64_MAX, U64_MAX, None),
    Matched(3, 7, "ünï.topic"),
    MatchedGap(0, 0, 0, 0),
    MatchedGap(U64_MAX, U64_MAX, U64_MAX, U64_MAX),
    DeliverMatched(0, 1, [(b"", None, None)], [0], [1]),
    DeliverMatched(
        U64_MAX, U64_MAX, [(b"x" * 70_000, b"k" * 30, [("a", b"")])], [U64_MAX], [U64_MAX]
    ),
    DeliverMatched(3, 2**32, [(b"p", None, None), (b"", b"", [])], [0, 24], [70_000, 70_001]),
    Admin(0, "topics", {}),
    Admin(U64_MAX, "purge-topic", {"topic": "orders", "before": U64_MAX >> 1, "yes": True}),
    AdminAnswer(0, 0, [], None, ""),
    AdminAnswer(
        U64_MAX,
        0,
        [{"topic": "a", "first": 1, "end": 5, "open": False, "last_append_ms": None}],
        "a",
        "",
    ),
    AdminAnswer(7, int(AdminStatus.NOT_PERMITTED), [], None, "principal 'x' lacks admin"),
]


def _id(message: Message) -> str:
    return type(message).__name__


def _frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def _body(*items: Any) -> bytes:
    """A frame body holding the CBOR array of ``items``."""
    return cbor2.dumps(list(items))


def _decode_all(data: bytes, *, max_frame: int = DEFAULT_MAX_FRAME) -> list[tuple[Message, int]]:
    decoder = FrameDecoder(max_frame=max_frame)
    decoder.feed(data)
    out = list(decoder.messages())
    assert decoder.buffered == 0
    return out


# --------------------------------------------------------------------------- round trips


def test_the_samples_cover_every_message_type() -> None:
    assert {m.TYPE for m in MESSAGES} == set(MessageType)


def _assert_round_trips(message: Message) -> None:
    frame = encode(message)
    body = frame[LENGTH_PREFIX:]
    assert frame[:LENGTH_PREFIX] == len(body).to_bytes(4, "big")
    assert body == encode_body(message)
    assert cbor2.loads(body)[0] == int(message.TYPE)
    decoded = decode_body(body)
    assert decoded == message
    assert _decode_all(frame) == [(message, len(frame))]
    # The decoded message encodes to the very same bytes.
    assert encode(decoded) == frame
    # Field types are exact: a bool stays a bool, bytes stay bytes, a channel a Channel.
    assert type(decoded) is type(message)
    for field in dataclasses.fields(message):
        original, got = getattr(message, field.name), getattr(decoded, field.name)
        assert type(got) is type(original), field.name
        if isinstance(original, bool):
            assert got is original


def test_every_message_round_trips() -> None:
    for message in MESSAGES:
        _assert_round_trips(message)


def test_headers_keep_order_and_repeated_names() -> None:
    headers: Headers = [("b", b"2"), ("a", b"1"), ("b", b"3"), ("b", b"2")]
    decoded = decode_body(encode_body(Publish(0, b"", None, headers)))
    assert isinstance(decoded, Publish)
    assert decoded.headers == headers
    assert decoded.key is None


def test_headers_none_and_empty_are_distinct() -> None:
    none = decode_body(encode_body(Deliver(0, 0, b"", None, None)))
    empty = decode_body(encode_body(Deliver(0, 0, b"", None, [])))
    assert isinstance(none, Deliver) and isinstance(empty, Deliver)
    assert none.headers is None
    assert empty.headers == []
    empty_key = decode_body(encode_body(Deliver(0, 0, b"", b"", None)))
    assert isinstance(empty_key, Deliver)
    assert empty_key.key == b""


def test_decoded_channels_are_channels() -> None:
    decoded = decode_body(encode_body(IssueGuarantee(Channel(ChannelKind.DELIVER, 9), 1)))
    assert isinstance(decoded, IssueGuarantee)
    assert decoded.channel == Channel(ChannelKind.DELIVER, 9)
    assert isinstance(decoded.channel, Channel)
    assert decoded.channel.kind is ChannelKind.DELIVER


# --------------------------------------------------------------------------- streams


def _stream_messages() -> list[Message]:
    # Small frames only: the every-split test decodes the stream once per byte.
    return [m for m in MESSAGES if len(encode_body(m)) < 600]


def _expected(messages: list[Message]) -> list[tuple[Message, int]]:
    return [(m, LENGTH_PREFIX + len(encode_body(m))) for m in messages]


def test_stream_split_at_every_byte_boundary() -> None:
    messages = _stream_messages()
    stream = b"".join(encode(m) for m in messages)
    expected = _expected(messages)
    assert sum(size for _, size in expected) == len(stream)
    for cut in range(len(stream) + 1):
        decoder = FrameDecoder()
        decoder.feed(stream[:cut])
        got = list(decoder.messages())
        consumed = sum(size for _, size in got)
        assert consumed <= cut
        assert decoder.buffered == cut - consumed
        # Only whole frames came out, and every whole frame did.
        assert got == expected[: len(got)]
        if len(got) < len(expected):
            assert consumed + expected[len(got)][1] > cut
        decoder.feed(stream[cut:])
        got += decoder.messages()
        assert got == expected, f"split at byte {cut}"
        assert decoder.buffered == 0


def test_stream_fed_byte_by_byte() -> None:
    # Includes frames larger than any internal read buffer of the CBOR decoder.
    messages = [*MESSAGES, Publish(7, bytes(range(256)) * 40), Ping(1)]
    stream = b"".join(encode(m) for m in messages)
    decoder = FrameDecoder()
    got: list[tuple[Message, int]] = []
    for i in range(len(stream)):
        decoder.feed(stream[i : i + 1])
        got += decoder.messages()
    assert got == _expected(messages)
    assert decoder.buffered == 0


@pytest.mark.parametrize("chunk", [3, 7, 64, 4095, 4096, 4097, 100_000])
def test_stream_fed_in_chunks(chunk: int) -> None:
    messages = [*MESSAGES, Publish(7, b"\xa5" * 9000), *MESSAGES]
    stream = b"".join(encode(m) for m in messages)
    decoder = FrameDecoder()
    got: list[tuple[Message, int]] = []
    for i in range(0, len(stream), chunk):
        decoder.feed(memoryview(stream)[i : i + chunk])
        got += decoder.messages()
    assert got == _expected(messages)


def test_stopping_early_leaves_later_frames_buffered() -> None:
    frames = [encode(Ping(i)) for i in range(3)]
    decoder = FrameDecoder()
    decoder.feed(b"".join(frames))
    iterator = decoder.messages()
    assert next(iterator) == (Ping(0), len(frames[0]))
    iterator.close()
    assert decoder.buffered == len(frames[1]) + len(frames[2])
    assert list(decoder.messages()) == [(Ping(1), len(frames[1])), (Ping(2), len(frames[2]))]


def test_frames_before_a_bad_frame_are_yielded_first() -> None:
    decoder = FrameDecoder()
    decoder.feed(encode(Ping(1)) + encode(Pong(2)) + _frame(_body(99)) + encode(Ping(3)))
    got: list[Message] = []
    with pytest.raises(RemoteProtocolError) as info:
        for message, _size in decoder.messages():
            got.append(message)
    assert got == [Ping(1), Pong(2)]
    assert info.value.code == GoodbyeCode.PROTOCOL_ERROR


# --------------------------------------------------------------------------- encode-once deliveries

DELIVER_NUMBERS = [0, 1, 23, 24, 255, 256, 65_535, 65_536, 2**32 - 1, 2**32, 2**63, U64_MAX]


def test_encode_deliver_matches_encode() -> None:
    cases = [
        (b"", None, None),
        (b"payload", b"key", [("a", b"1"), ("a", b"2")]),
        (b"\x00" * 70_000, b"", []),
    ]
    for payload, key, headers in cases:
        tail = encode_deliver_tail(payload, key, headers)
        for sub in DELIVER_NUMBERS:
            for seq in DELIVER_NUMBERS:
                head, same_tail = encode_deliver(sub, seq, tail)
                assert same_tail is tail
                message = Deliver(sub, seq, payload, key, headers)
                frame = encode(message)
                assert head + tail == frame, (sub, seq, key, headers)
                assert _decode_all(head + tail) == [(message, len(frame))]


@pytest.mark.parametrize(("sub", "seq"), [(-1, 0), (0, -1), (U64_MAX + 1, 0), (0, U64_MAX + 1)])
def test_encode_deliver_refuses_non_u64(sub: int, seq: int) -> None:
    with pytest.raises(LocalProtocolError):
        encode_deliver(sub, seq, encode_deliver_tail(b"", None, None))


# --------------------------------------------------------------------------- encoding limits


def test_encode_refuses_a_body_over_max_frame() -> None:
    message = Publish(0, b"x" * 100)
    size = len(encode_body(message))
    assert len(encode(message, max_frame=size)) == LENGTH_PREFIX + size
    with pytest.raises(LocalProtocolError):
        encode(message, max_frame=size - 1)
    with pytest.raises(LocalProtocolError):
        encode(Publish(0, b"x" * DEFAULT_MAX_FRAME))


def test_encode_refuses_what_cbor_cannot_carry() -> None:
    with pytest.raises(LocalProtocolError):
        encode(Subscribe(0, "reliable", {"x": object()}))  # type: ignore[dict-item]
    with pytest.raises(LocalProtocolError):
        encode("not a message")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- framing errors


def test_frame_too_large_is_refused_as_soon_as_the_prefix_arrives() -> None:
    decoder = FrameDecoder(max_frame=100)
    decoder.feed(struct.pack(">I", 101)[:3])
    assert list(decoder.messages()) == []
    decoder.feed(struct.pack(">I", 101)[3:])
    with pytest.raises(RemoteProtocolError) as info:
        list(decoder.messages())
    assert info.value.code == GoodbyeCode.FRAME_TOO_LARGE


@pytest.mark.parametrize("length", [DEFAULT_MAX_FRAME + 1, 2**31, 2**32 - 1])
def test_frame_too_large_default_limit(length: int) -> None:
    decoder = FrameDecoder()
    decoder.feed(encode(Ping(1)) + struct.pack(">I", length))
    got: list[Message] = []
    with pytest.raises(RemoteProtocolError) as info:
        for message, _size in decoder.messages():
            got.append(message)
    assert got == [Ping(1)]
    assert info.value.code == GoodbyeCode.FRAME_TOO_LARGE


def test_frame_of_exactly_max_frame_is_accepted() -> None:
    message = Publish(0, b"y" * 50)
    body = encode_body(message)
    decoder = FrameDecoder(max_frame=len(body))
    decoder.feed(_frame(body))
    assert list(decoder.messages()) == [(message, LENGTH_PREFIX + len(body))]


def test_a_length_prefix_waits_for_its_body() -> None:
    decoder = FrameDecoder(max_frame=100)
    decoder.feed(struct.pack(">I", 100) + b"\x00" * 99)
    assert list(decoder.messages()) == []
    assert decoder.buffered == 103


def test_empty_frame_is_refused_as_soon_as_the_prefix_arrives() -> None:
    decoder = FrameDecoder()
    decoder.feed(b"\x00\x00\x00")
    assert list(decoder.messages()) == []
    decoder.feed(b"\x00")
    with pytest.raises(RemoteProtocolError) as info:
        list(decoder.messages())
    assert info.value.code == GoodbyeCode.PROTOCOL_ERROR


# --------------------------------------------------------------------------- malformed bodies


def _deep(levels: int) -> bytes:
    return b"\x82\x02" + b"\x81" * levels + b"\x00"


def _text_item(raw: bytes) -> bytes:
    """A CBOR text string item with ``raw`` as its (possibly invalid) UTF-8."""
    assert len(raw) < 24
    return bytes([0x60 | len(raw)]) + raw


_HELLO = {"client": "c", "session": None, "processed": {}}
_WELCOME = {
    "session": SESSION,
    "resumed": False,
    "epoch": b"e",
    "lease_ms": 1,
    "heartbeat_ms": 1,
    "max_frame": 1024,
    "received": {},
}


def _with(record: dict[str, Any], **changes: Any) -> dict[str, Any]:
    out = dict(record)
    for key, value in changes.items():
        if value is _MISSING:
            del out[key]
        else:
            out[key] = value
    return out


_MISSING = object()

#: category -> {what it breaks: body}; each must be a PROTOCOL_ERROR
MALFORMED: dict[str, dict[str, bytes]] = {
    "not one CBOR item": {
        "truncated ping": _body(2, 5)[:-1],
        "truncated payload": _body(32, 0, b"payload", None, None)[:-4],
        "truncated array header": b"\x98",
        "truncated uint": b"\x82\x02\x1b\x00\x00",
        "break alone": b"\xff",
        "reserved additional info": b"\x82\x02\x1c",
        "trailing byte": _body(2, 5) + b"\x00",
        "trailing item": _body(2, 5) + _body(2, 6),
    },
    "not a non-empty array": {
        "int body": cbor2.dumps(2),
        "text body": cbor2.dumps("ping"),
        "bytes body": cbor2.dumps(b"\x82\x02\x05"),
        "map body": cbor2.dumps({0: 2, 1: 5}),
        "null body": cbor2.dumps(None),
        "tagged array body": cbor2.dumps(CBORTag(1000, [2, 5])),
        "empty array": b"\x80",
    },
    "type code": {
        "unknown type 6": _body(6, 1),
        "unknown type 34": _body(34, 1),
        "unknown type u64 max": _body(U64_MAX, 1),
        "negative type": _body(-1, 1),
        "text type": _body("ping", 1),
        "float type": _body(2.0, 1),
        "bool type": _body(True, 1),
        "null type": _body(None, 1),
        "bytes type": _body(b"\x02", 1),
        "bignum type": _body(2**64 + 2, 1),
    },
    "field types": {
        "text for bytes payload": _body(32, 0, "payload", None, None),
        "text for bytes key": _body(32, 0, b"p", "key", None),
        "int for bytes key": _body(32, 0, b"p", 0, None),
        "null payload": _body(33, 0, 0, None, None, None),
        "undefined key": b"\x85\x18\x20\x00\x41p\xf7\xf6",
        "bytes for text name": _body(30, b"news"),
        "null for text name": _body(30, None),
        "bytes for mode": _body(31, 0, b"reliable", {}),
        "bytes for reason": _body(4, 1, b"why"),
        "bool for int nonce": _body(2, True),
        "bool false for int seq": _body(21, 0, False),
        "bool for topic": _body(32, True, b"", None, None),
        "float for int": _body(2, 1.0),
        "half float for int": b"\x82\x02\xf9\x3c\x00",
        "nan for int": _body(3, float("nan")),
        "negative nonce": _body(2, -1),
        "negative amount": _body(10, [0, 0], -5),
        "u64 overflow nonce": _body(2, 2**64),
        "u64 overflow seq": _body(33, 0, 2**64 + 5, b"", None, None),
        "u64 overflow gap count": _body(22, 0, 0, 2**70),
        "int for bool throttled": _body(5, [2, 0], 1),
        "null for bool mine": _body(20, 0, 0, None),
        "simple value for int": b"\x82\x02\xf0",
        "undefined for int": b"\x82\x02\xf7",
        "array for int": _body(2, [5]),
    },
    "headers": {
        "headers as map": _body(32, 0, b"", None, {"h": b"v"}),
        "header not a pair": _body(32, 0, b"", None, [["h"]]),
        "header triple": _body(32, 0, b"", None, [["h", b"v", b"w"]]),
        "header name bytes": _body(32, 0, b"", None, [[b"h", b"v"]]),
        "header value text": _body(33, 0, 0, b"", None, [["h", "v"]]),
        "header value null": _body(33, 0, 0, b"", None, [["h", None]]),
        "header as text": _body(32, 0, b"", None, ["h"]),
    },
    "channels": {
        "channel kind 4": _body(10, [4, 0], 1),
        "channel kind u64 max": _body(15, [U64_MAX, 0]),
        "topic bind channel index 1": _body(10, [0, 1], 1),
        "subscription bind channel index 7": _body(16, [1, 7]),
        "channel one element": _body(10, [2], 1),
        "channel three elements": _body(11, [2, 0, 0], 1),
        "channel empty": _body(15, []),
        "channel int": _body(12, 2, 1),
        "channel map": _body(13, {2: 0}, 1),
        "channel negative index": _body(14, [2, -1], 1),
        "channel index overflow": _body(16, [3, 2**64]),
        "channel bool kind": _body(5, [True, 0], True),
        "channel text kind": _body(5, ["2", 0], True),
    },
    "free handle": {
        "handle type 2": _body(20, 2, 0, True),
        "handle type u64 max": _body(20, U64_MAX, 0, False),
    },
    "subscribe options": {
        "options not a map": _body(31, 0, "reliable", [["a", 1]]),
        "options null": _body(31, 0, "reliable", None),
        "option key int": _body(31, 0, "reliable", {1: 1}),
        "option value list": _body(31, 0, "reliable", {"a": [1]}),
        "option value map": _body(31, 0, "reliable", {"a": {}}),
        "option value bytes": _body(31, 0, "reliable", {"a": b"x"}),
        "option int over i64": _body(31, 0, "reliable", {"a": I64_MAX + 1}),
        "option int under i64": _body(31, 0, "reliable", {"a": I64_MIN - 1}),
        "option nan": _body(31, 0, "reliable", {"a": float("nan")}),
        "option inf": _body(31, 0, "reliable", {"a": float("-inf")}),
        "option datetime tag": _body(31, 0, "reliable", {"a": CBORTag(1, 0)}),
    },
    "hello and welcome records": {
        "hello missing key": _body(0, 1, _with(_HELLO, processed=_MISSING)),
        "hello extra key": _body(0, 1, _with(_HELLO, extra=1)),
        "hello not a map": _body(0, 1, ["c", None, {}]),
        "hello bytes key": _body(0, 1, {b"client": "c", "session": None, "processed": {}}),
        "hello client bytes": _body(0, 1, _with(_HELLO, client=b"c")),
        "hello session text": _body(0, 1, _with(_HELLO, session="s")),
        "hello processed list": _body(0, 1, _with(_HELLO, processed=[[0, 1]])),
        "hello processed text key": _body(0, 1, _with(_HELLO, processed={"0": 1})),
        "hello processed negative": _body(0, 1, _with(_HELLO, processed={0: -1})),
        "hello processed bool": _body(0, 1, _with(_HELLO, processed={0: True})),
        "hello processed overflow": _body(0, 1, _with(_HELLO, processed={2**64: 0})),
        "hello version text": _body(0, "1", _HELLO),
        "welcome missing key": _body(1, 1, _with(_WELCOME, received=_MISSING)),
        "welcome extra key": _body(1, 1, _with(_WELCOME, extra=None)),
        "welcome empty map": _body(1, 1, {}),
        "welcome session 15 bytes": _body(1, 1, _with(_WELCOME, session=b"s" * 15)),
        "welcome session 17 bytes": _body(1, 1, _with(_WELCOME, session=b"s" * 17)),
        "welcome session empty": _body(1, 1, _with(_WELCOME, session=b"")),
        "welcome session null": _body(1, 1, _with(_WELCOME, session=None)),
        "welcome session text": _body(1, 1, _with(_WELCOME, session="s" * 16)),
        "welcome resumed int": _body(1, 1, _with(_WELCOME, resumed=1)),
        "welcome epoch null": _body(1, 1, _with(_WELCOME, epoch=None)),
        "welcome lease bool": _body(1, 1, _with(_WELCOME, lease_ms=True)),
        "welcome max_frame float": _body(1, 1, _with(_WELCOME, max_frame=1024.0)),
        "welcome received value text": _body(1, 1, _with(_WELCOME, received={0: "1"})),
    },
    "indefinite lengths": {
        "indefinite array": b"\x9f\x02\x05\xff",
        "indefinite inner channel": b"\x83\x0a\x9f\x02\x00\xff\x01",
        "indefinite bytes": b"\x85\x18\x20\x00\x5f\x41a\xff\xf6\xf6",
        "indefinite text": b"\x82\x18\x1e\x7f\x61a\xff",
        "indefinite map": b"\x84\x18\x1f\x00\x68reliable\xbf\xff",
    },
    "tags where a field is expected": {
        "datetime tag 1 nonce": _body(2, CBORTag(1, 1_700_000_000)),
        "datetime tag 0 nonce": _body(2, CBORTag(0, "2024-01-01T00:00:00Z")),
        "set tag 258 channel": _body(10, CBORTag(258, [2, 0]), 1),
        "set tag 258 headers": _body(32, 0, b"", None, CBORTag(258, [])),
        "uuid tag 37 session": _body(1, 1, _with(_WELCOME, session=CBORTag(37, SESSION))),
        "unknown tag payload": _body(32, 0, CBORTag(40_000, b"p"), None, None),
        "negative bignum tag 3": _body(2, CBORTag(3, b"\x01")),
        "decimal fraction tag 4": _body(2, CBORTag(4, [0, 5])),
        "rational tag 30": _body(2, CBORTag(30, [5, 1])),
        "regexp tag 35 name": _body(30, CBORTag(35, "news")),
        "ip address tag 260": _body(32, 0, CBORTag(260, b"\x7f\x00\x00\x01"), None, None),
    },
    "nesting": {
        "nested 8 deep": _body(2, [[[[[[[[1]]]]]]]]),
        "nested 1000 deep": _deep(1_000),
        "nested 100000 deep": _deep(100_000),
        "nested maps": b"\x82\x02" + b"\xa1\x00" * 10_000 + b"\x00",
    },
    "staging": {
        "stage not a pair": _body(30, "t", ["b"]),
        "stage of three": _body(30, "t", ["b", "m", "x"]),
        "stage null": _body(30, "t", None),
        "stage empty batch": _body(30, "t", ["", "m"]),
        "stage batch too long": _body(30, "t", ["b" * 257, "m"]),
        "stage member not text": _body(30, "t", ["b", 1]),
        "commit members not an array": _body(40, 1, "b", {"m": 1}),
        "commit member not a pair": _body(40, 1, "b", [["m"]]),
        "commit negative count": _body(40, 1, "b", [["m", -1]]),
        "commit empty member": _body(40, 1, "b", [["", 1]]),
        "commit empty batch": _body(40, 1, "", []),
        "abort batch not text": _body(41, 1, b"b"),
        "outcome unknown status": _body(42, 1, 4, 0, ""),
        "outcome reason not text": _body(42, 1, 0, 0, None),
    },
    "offsets": {
        "list offsets topics not an array": _body(43, 1, "events"),
        "list offsets empty topic name": _body(43, 1, [""]),
        "list offsets topic name not text": _body(43, 1, [b"t"]),
        "list offsets negative request": _body(43, -1, None),
        "offsets entries not an array": _body(44, 1, None, ""),
        "offsets entry of two": _body(44, 1, [["t", 1]], ""),
        "offsets first above end": _body(44, 1, [["t", 5, 4]], ""),
        "offsets negative end": _body(44, 1, [["t", 1, -1]], ""),
        "offsets reason not text": _body(44, 1, [], None),
    },
    "invalid utf-8": {
        "bad utf8 topic name": b"\x82\x18\x1e" + _text_item(b"\xff\xfe"),
        "bad utf8 overlong": b"\x82\x18\x1e" + _text_item(b"\xc0\xaf"),
        "bad utf8 surrogate": b"\x82\x18\x1e" + _text_item(b"\xed\xa0\x80"),
        "bad utf8 truncated sequence": b"\x82\x18\x1e" + _text_item(b"ab\xe2\x82"),
        "bad utf8 reason": b"\x83\x04\x01" + _text_item(b"\x80"),
        "bad utf8 header name": b"\x85\x18\x20\x00\x40\xf6\x81\x82" + _text_item(b"\xff") + b"\x40",
        "bad utf8 option name": b"\x84\x18\x1f\x00\x60\xa1" + _text_item(b"\xc3") + b"\x01",
        "bad utf8 mode": b"\x84\x18\x1f\x00" + _text_item(b"rel\xffable") + b"\xa0",
    },
}


def _arity_cases() -> dict[str, bytes]:
    cases = {}
    for message in MESSAGES:
        fields = cbor2.loads(encode_body(message))
        name = _id(message)
        if not (isinstance(message, BindTopic) and message.stage is not None):
            # (A staged BindTopic without its stage is a plain one.)
            cases[f"{name} missing a field"] = cbor2.dumps(fields[:-1])
        cases[f"{name} extra field"] = cbor2.dumps([*fields, None])
        cases[f"{name} extra int field"] = cbor2.dumps([*fields, 0])
        cases[f"{name} type code only"] = cbor2.dumps(fields[:1])
    return cases


MALFORMED["arity"] = _arity_cases()


def _assert_refused(body: bytes, code: GoodbyeCode = GoodbyeCode.PROTOCOL_ERROR) -> None:
    with pytest.raises(RemoteProtocolError) as info:
        decode_body(body)
    assert info.value.code == code
    assert info.value.reason
    # The same body framed: refused by the incremental decoder, whole and byte by byte,
    # after the good frames around it.
    for step in (len(body) + 100, 1 if len(body) < 2_000 else 997):
        decoder = FrameDecoder()
        stream = encode(Ping(1)) + _frame(body) + encode(Ping(2))
        got: list[Message] = []
        with pytest.raises(RemoteProtocolError) as info:
            for i in range(0, len(stream), step):
                decoder.feed(stream[i : i + step])
                for message, _size in decoder.messages():
                    got.append(message)
        assert info.value.code == code
        assert got == [Ping(1)]


def _refusal_problem(body: bytes, code: GoodbyeCode = GoodbyeCode.PROTOCOL_ERROR) -> str | None:
    """None if ``body`` is refused as it must be, else what went wrong."""
    try:
        _assert_refused(body, code)
    except (Exception, pytest.fail.Exception) as exc:
        return f"{type(exc).__name__}: {exc!s:.200}"
    return None


@pytest.mark.parametrize("category", MALFORMED)
def test_malformed_body_is_a_protocol_error(category: str) -> None:
    cases = MALFORMED[category]
    assert cases
    problems = {name: _refusal_problem(body) for name, body in cases.items()}
    assert {name: problem for name, problem in problems.items() if problem} == {}


@pytest.mark.parametrize(
    "message",
    [
        Goodbye(1, "a" * 40),
        Subscribe(0, "reliable", {"a": 1, "b": "x"}),
        Hello(1, "client", SESSION, {1: 2}),
        Publish(0, b"x" * 30, b"k", [("h", b"v")]),
    ],
    ids=_id,
)
def test_every_truncation_of_a_valid_body_is_refused(message: Message) -> None:
    body = encode_body(message)
    for cut in range(1, len(body)):
        with pytest.raises(RemoteProtocolError) as info:
            decode_body(body[:cut])
        assert info.value.code == GoodbyeCode.PROTOCOL_ERROR


def test_truncated_cbor_followed_by_more_frames_is_refused() -> None:
    # The CBOR item claims more bytes than its frame holds; the next frame's
    # bytes must not be read as its continuation.
    body = b"\x82\x02\x1a\x00\x00"  # a 4-byte uint with only 2 bytes in the frame
    decoder = FrameDecoder()
    decoder.feed(_frame(body) + b"\x00\x00" + encode(Ping(1)))
    with pytest.raises(RemoteProtocolError) as info:
        list(decoder.messages())
    assert info.value.code == GoodbyeCode.PROTOCOL_ERROR


def test_bignum_within_u64_and_exact_limits() -> None:
    assert decode_body(_body(2, U64_MAX)) == Ping(U64_MAX)
    _assert_refused(_body(2, U64_MAX + 1))
    _assert_refused(_body(2, -(2**64)))
    _assert_refused(_body(2, -(2**64) - 1))


# --------------------------------------------------------------------------- regressions


# Regression: error messages used repr() on the offending value; an int over 4300
# digits (a ~1.8 KB CBOR bignum) made repr() raise ValueError instead.
@pytest.mark.parametrize(
    "body",
    [
        _body(2, 1 << 20_000),
        _body(2, -(1 << 20_000)),
        _body(1 << 20_000, 0),
        _body(31, 0, "reliable", {"a": 1 << 20_000}),
    ],
    ids=["nonce", "negative nonce", "type code", "option"],
)
def test_huge_bignum_is_a_protocol_error(body: bytes) -> None:
    assert len(body) < 4_000
    _assert_refused(body)


# Regression: cbor2 resolves value-sharing tags 28/29 by default, so they were
# accepted where a plain field is expected.
@pytest.mark.parametrize(
    "body",
    [
        _body(2, CBORTag(28, 5)),
        _body(32, 0, CBORTag(28, b"p"), CBORTag(29, 0), None),
    ],
    ids=["shareable nonce", "shared payload as key"],
)
def test_value_sharing_tags_are_refused(body: bytes) -> None:
    _assert_refused(body)


def _shared_fan_out(width: int, levels: int) -> Any:
    """Nested arrays where each level holds ``width`` references to the one below."""

    def build(level: int) -> Any:
        if level == levels:
            return CBORTag(28, [0] * width)
        return CBORTag(28, [build(level + 1)] + [CBORTag(29, level + 1)] * (width - 1))

    return build(0)


# Regression: with value sharing, a tiny frame decoded to a DAG whose repr() (computed
# in full for the error message, then cut to 40 characters) grows as width**levels:
# ~300 bytes allocated megabytes, ~2 KB would take gigabytes and minutes.
def test_a_small_frame_cannot_make_the_decoder_allocate_megabytes() -> None:
    body = _body(2, _shared_fan_out(30, 3))
    assert len(body) < 400
    tracemalloc.start()
    try:
        with pytest.raises(RemoteProtocolError):
            decode_body(body)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000


# Regression: maps with duplicate keys (invalid CBOR, RFC 8949 section 5.6) were
# accepted, the last value silently winning (cbor2 allows them by default).
@pytest.mark.parametrize(
    "body",
    [
        # Hello {"client": "a", "client": "b", "session": null, "processed": {}}
        b"\x83\x00\x01\xa4"
        + b"".join(cbor2.dumps(x) for x in ("client", "a", "client", "b", "session", None))
        + cbor2.dumps("processed")
        + b"\xa0",
        # Subscribe options {"a": 1, "a": 2}
        b"\x84\x18\x1f\x00" + cbor2.dumps("reliable") + b"\xa2\x61a\x01\x61a\x02",
    ],
    ids=["hello record", "subscribe options"],
)
def test_duplicate_map_keys_are_refused(body: bytes) -> None:
    _assert_refused(body)


@pytest.mark.parametrize("headers", [None, [("h", b"v" * 100)]])
def test_a_message_too_large_says_how_large_a_payload_fits(headers: Any) -> None:
    """It said "Publish frame of 65547 bytes exceeds max_frame 65536" of a
    65,536-byte message: frame bytes, not the message, and no remedy."""
    from broker.protocol import LocalProtocolError
    from broker.protocol.frames._encode import encode_publish

    limit = 1024
    too_big = Publish(1, b"m" * 2000, b"key", headers)
    with pytest.raises(LocalProtocolError) as raised:
        if headers is None:
            encode_publish(1, too_big.payload, too_big.key, max_frame=limit)
        else:
            encode(too_big, max_frame=limit)
    reason = str(raised.value)
    assert reason.startswith("a message of 2000 bytes is too large: its Publish frame of ")
    fits = int(reason.split("a payload of at most ")[1].split()[0])
    encode(dataclasses.replace(too_big, payload=b"m" * fits), max_frame=limit)  # fits
    with pytest.raises(LocalProtocolError):
        encode(dataclasses.replace(too_big, payload=b"m" * (fits + 1)), max_frame=limit)
    assert reason.endswith("or raise the broker's max_frame)")


def test_headers_too_large_for_any_payload_are_blamed() -> None:
    """It said "a payload of at most 0 bytes fits" when not even an empty
    payload did: the headers were the problem."""
    from broker.protocol import LocalProtocolError

    too_big = Publish(1, b"x", None, [("h", b"v" * 2000)])
    with pytest.raises(LocalProtocolError) as raised:
        encode(too_big, max_frame=1024)
    reason = str(raised.value)
    assert reason.startswith("a message of 1 bytes is too large: its key and headers alone ")
    assert reason.endswith("(shorten them, or raise the broker's max_frame)")
    overhead = int(reason.split("a Publish frame of ")[1].split()[0])
    with pytest.raises(LocalProtocolError):
        encode(dataclasses.replace(too_big, payload=b""), max_frame=overhead - 1)
    encode(dataclasses.replace(too_big, payload=b""), max_frame=overhead)  # fits exactly
