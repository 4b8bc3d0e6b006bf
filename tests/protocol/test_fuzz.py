"""Garbage in: the decoder only ever raises RemoteProtocolError, a Connection never raises.

Random bytes, random frame bodies and mutated streams of valid frames are
fed to :class:`FrameDecoder` and to live connections of both roles, whole,
byte by byte and in random chunks. The result must not depend on how the
bytes were split.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Callable
from typing import Any

import cbor2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.protocol import (
    DEFAULT_MAX_FRAME,
    SUBSCRIPTION_BINDS,
    TOPIC_BINDS,
    U64_MAX,
    Abort,
    Absolve,
    Ack,
    AnnounceDropping,
    Apologise,
    BindTopic,
    Channel,
    ChannelKind,
    Commit,
    Confirm,
    Connection,
    ConnectionClosed,
    Deliver,
    Event,
    FreeHandle,
    Gap,
    Goodbye,
    GoodbyeCode,
    Hello,
    IssueGuarantee,
    LimitReceiving,
    LimitSending,
    ListOffsets,
    Message,
    Offsets,
    Outcome,
    Ping,
    Plead,
    Pong,
    Publish,
    PublishReceived,
    RemoteProtocolError,
    Role,
    Stage,
    Subscribe,
    Throttled,
    Welcome,
    WelcomeReceived,
)
from broker.protocol.frames import FrameDecoder, decode_body, encode, encode_body
from tests.hypothesis_profiles import examples

from .pair import ConnectionPair

FUZZ = settings(
    max_examples=examples(400),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# --------------------------------------------------------------------------- strategies

I64 = st.integers(-(1 << 63), (1 << 63) - 1)
#: Mostly tiny values (so handles and channels hit what is bound), some edges.
u64s = st.one_of(
    st.integers(0, 3),
    st.sampled_from([23, 24, 255, 256, 65_535, 65_536, 2**32 - 1, 2**32, U64_MAX]),
    st.integers(0, U64_MAX),
)
handles = st.integers(0, 2)
channels = st.one_of(
    st.just(TOPIC_BINDS),
    st.just(SUBSCRIPTION_BINDS),
    st.builds(Channel, st.sampled_from([ChannelKind.PUBLISH, ChannelKind.DELIVER]), handles),
)
short_text = st.text(max_size=6)
#: Batch and member names of a Stage: 1 to 256 characters.
stage_names = st.text(min_size=1, max_size=10)
short_bytes = st.binary(max_size=24)
headers = st.none() | st.lists(st.tuples(short_text, short_bytes), max_size=3)
u64_maps = st.dictionaries(u64s, u64s, max_size=3)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    I64,
    st.floats(allow_nan=False, allow_infinity=False),
    short_text,
)

messages: st.SearchStrategy[Message] = st.one_of(
    st.builds(Hello, st.integers(0, 2), short_text, st.none() | short_bytes, u64_maps),
    st.builds(
        Welcome,
        st.integers(0, 2),
        st.binary(min_size=16, max_size=16),
        st.just(False),
        short_bytes,
        u64s,
        u64s,
        u64s,
        u64_maps,
    ),
    # A resumed session's Welcome also says how many handles the broker bound.
    st.builds(
        Welcome,
        st.integers(0, 2),
        st.binary(min_size=16, max_size=16),
        st.just(True),
        short_bytes,
        u64s,
        u64s,
        u64s,
        u64_maps,
        st.tuples(u64s, u64s),
    ),
    st.builds(Ping, u64s),
    st.builds(Pong, u64s),
    st.builds(Goodbye, u64s, short_text),
    st.builds(Throttled, channels, st.booleans()),
    st.builds(IssueGuarantee, channels, u64s),
    st.builds(Absolve, channels, u64s),
    st.builds(Plead, channels, u64s),
    st.builds(LimitSending, channels, u64s),
    st.builds(LimitReceiving, channels, u64s),
    st.builds(AnnounceDropping, channels),
    st.builds(Apologise, channels),
    st.builds(FreeHandle, st.integers(0, 1), handles, st.booleans()),
    st.builds(Ack, handles, u64s),
    st.builds(Gap, handles, u64s, u64s),
    st.builds(Confirm, handles, u64s),
    st.builds(BindTopic, short_text, st.none() | st.builds(Stage, stage_names, stage_names)),
    st.builds(Commit, u64s, stage_names, st.lists(st.tuples(stage_names, u64s), max_size=3)),
    st.builds(Abort, u64s, stage_names),
    st.builds(Outcome, u64s, st.integers(0, 3), u64s, short_text),
    st.builds(
        ListOffsets, u64s, st.none() | st.lists(st.sampled_from(["t", "a.b", "ü"]), max_size=3)
    ),
    st.builds(
        Offsets,
        u64s,
        st.lists(st.tuples(short_text, st.integers(0, 9), st.integers(9, 20)), max_size=3),
        short_text,
    ),
    st.builds(
        Subscribe,
        handles,
        st.sampled_from(["reliable", "lossy", "latest", "other"]),
        st.dictionaries(short_text, scalars, max_size=3),
    ),
    st.builds(Publish, handles, short_bytes, st.none() | short_bytes, headers),
    st.builds(Deliver, handles, u64s, short_bytes, st.none() | short_bytes, headers),
)

amounts = st.one_of(st.integers(0, 300), st.integers(0, 70_000), u64s)


def _peer_messages(receiver: Role) -> st.SearchStrategy[Message]:
    """Messages the peer of ``receiver`` may send, on channels in the right direction.

    Most of them are acceptable in some state, so streams of them get past the
    first frame and into the guarantee and handle machinery.
    """
    handles = st.one_of(st.just(0), st.integers(0, 2))  # handle 0 is bound
    client_channels = st.one_of(
        st.just(TOPIC_BINDS),
        st.just(SUBSCRIPTION_BINDS),
        st.builds(Channel, st.just(ChannelKind.PUBLISH), handles),
    )
    deliver_channels = st.builds(Channel, st.just(ChannelKind.DELIVER), handles)
    common = [st.builds(Ping, u64s), st.builds(Pong, u64s)]
    if receiver is Role.BROKER:  # the peer is a client
        sent, received = client_channels, deliver_channels
        specific = [
            st.builds(FreeHandle, st.integers(0, 1), handles, st.just(True)),
            st.builds(Ack, handles, u64s),
            st.builds(BindTopic, st.sampled_from(["t", "u", "v"])),
            st.builds(BindTopic, st.just("t"), st.builds(Stage, st.just("b"), st.just("m"))),
            st.builds(Commit, u64s, st.just("b"), st.just([("m", 1)])),
            st.builds(Abort, u64s, st.just("b")),
            st.builds(Subscribe, handles, st.sampled_from(["reliable", "lossy", "latest"])),
            st.builds(Publish, handles, short_bytes, st.none() | short_bytes, headers),
        ]
    else:  # the peer is a broker
        sent, received = deliver_channels, client_channels
        specific = [
            st.builds(FreeHandle, st.integers(0, 1), handles, st.just(False)),
            st.builds(Throttled, client_channels, st.booleans()),
            st.builds(Gap, handles, u64s, u64s),
            st.builds(Confirm, handles, u64s),
            st.builds(Outcome, u64s, st.integers(0, 3), u64s, short_text),
            st.builds(Deliver, handles, u64s, short_bytes, st.none() | short_bytes, headers),
        ]
    return st.one_of(
        *common,
        *specific,
        # About channels the peer sends on.
        st.builds(Absolve, sent, amounts),
        st.builds(LimitSending, sent, amounts),
        st.builds(Apologise, sent),
        # About channels the peer receives on.
        st.builds(IssueGuarantee, received, amounts),
        st.builds(Plead, received, amounts),
        st.builds(LimitReceiving, received, amounts),
        st.builds(AnnounceDropping, received),
    )


PEER_MESSAGES = {role: _peer_messages(role) for role in Role}


@st.composite
def plausible_streams(draw: st.DrawFn, receiver: Role) -> bytes:
    stream = draw(st.lists(PEER_MESSAGES[receiver], min_size=1, max_size=12))
    return b"".join(encode(m) for m in stream)


#: Arbitrary CBOR values, to build bodies that are CBOR but not messages.
cbor_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**70), 2**70),
        st.floats(),
        short_text,
        short_bytes,
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=6),
        st.dictionaries(st.integers(-5, 40) | short_text, inner, max_size=4),
        st.builds(cbor2.CBORTag, st.sampled_from([0, 1, 2, 3, 4, 5, 30, 37, 258, 999]), inner),
    ),
    max_leaves=12,
)


def _frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


@st.composite
def cbor_bodies(draw: st.DrawFn) -> bytes:
    """A correctly framed CBOR item that is usually not a message."""
    value = draw(cbor_values)
    if draw(st.booleans()):
        # An array led by a real type code gets past the first checks.
        code = draw(st.sampled_from([0, 1, 2, 3, 4, 5, 10, 15, 20, 21, 30, 31, 32, 33]))
        value = [code, *(value if isinstance(value, list) else [value])]
    try:
        body = cbor2.dumps(value)
    except (ValueError, TypeError, cbor2.CBOREncodeError):
        body = b"\xf6"
    return _frame(body)


@st.composite
def mutated_streams(draw: st.DrawFn) -> bytes:
    """A stream of valid frames with a few bytes flipped, inserted, deleted or re-lengthed."""
    frames = [encode(m) for m in draw(st.lists(messages, min_size=1, max_size=6))]
    starts = [sum(len(f) for f in frames[:i]) for i in range(len(frames))]
    data = bytearray(b"".join(frames))
    for _ in range(draw(st.integers(1, 4))):
        if not data:
            break
        op = draw(st.sampled_from(["flip", "set", "insert", "delete", "length", "cut", "splice"]))
        pos = draw(st.integers(0, len(data) - 1))
        if op == "flip":
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif op == "set":
            data[pos] = draw(st.integers(0, 255))
        elif op == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=4))
        elif op == "delete":
            del data[pos : pos + draw(st.integers(1, 4))]
        elif op == "cut":
            del data[pos:]
        elif op == "splice":
            data[pos:pos] = draw(cbor_bodies())
        else:
            start = draw(st.sampled_from(starts))
            if start + 4 > len(data):
                continue
            (old,) = struct.unpack_from(">I", data, start)
            new = draw(
                st.sampled_from(
                    [0, 1, max(old - 1, 0), min(old + 1, 2**32 - 1), DEFAULT_MAX_FRAME + 1]
                )
                | st.integers(0, 2**32 - 1)
            )
            struct.pack_into(">I", data, start, new)
    return bytes(data)


garbage = st.one_of(
    st.binary(max_size=200),
    cbor_bodies(),
    st.lists(cbor_bodies(), min_size=1, max_size=4).map(b"".join),
    mutated_streams(),
)


def _pieces(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


def _splits(data: bytes, cuts: list[int]) -> dict[str, list[bytes]]:
    return {
        "whole": [data],
        "byte by byte": [data[i : i + 1] for i in range(len(data))],
        "random chunks": _pieces(data, cuts),
    }


cut_lists = st.lists(st.integers(0, 10_000), max_size=8)

# --------------------------------------------------------------------------- FrameDecoder

Outcome = tuple[list[tuple[Message, int]], GoodbyeCode | None, int]


def _decode(pieces: list[bytes], max_frame: int) -> Outcome:
    """Feed ``pieces``; the messages, the error code (None if none) and bytes left buffered.

    Any exception but RemoteProtocolError propagates and fails the test.
    """
    decoder = FrameDecoder(max_frame=max_frame)
    out: list[tuple[Message, int]] = []
    try:
        for piece in pieces:
            decoder.feed(piece)
            for item in decoder.messages():
                out.append(item)
    except RemoteProtocolError as error:
        assert error.code in (GoodbyeCode.PROTOCOL_ERROR, GoodbyeCode.FRAME_TOO_LARGE)
        assert isinstance(error.reason, str) and error.reason
        return out, error.code, -1
    return out, None, decoder.buffered


def _check_decoder(data: bytes, cuts: list[int], max_frame: int) -> Outcome:
    outcomes = {name: _decode(pieces, max_frame) for name, pieces in _splits(data, cuts).items()}
    whole = outcomes["whole"]
    assert outcomes["byte by byte"] == whole
    assert outcomes["random chunks"] == whole
    messages_out, code, buffered = whole
    assert sum(size for _, size in messages_out) + max(buffered, 0) <= len(data)
    if code is None:
        assert sum(size for _, size in messages_out) + buffered == len(data)
    for message, size in messages_out:
        # Whatever is accepted is a well-formed message of its declared size.
        assert 4 < size <= 4 + max_frame
        assert decode_body(encode_body(message)) == message
    return whole


@FUZZ
@given(data=st.binary(max_size=300), cuts=cut_lists)
def test_random_bytes_only_raise_remote_protocol_error(data: bytes, cuts: list[int]) -> None:
    _check_decoder(data, cuts, DEFAULT_MAX_FRAME)


@FUZZ
@given(
    data=st.lists(cbor_bodies(), min_size=1, max_size=4).map(b"".join),
    cuts=cut_lists,
    max_frame=st.sampled_from([16, 64, DEFAULT_MAX_FRAME]),
)
def test_random_cbor_bodies_only_raise_remote_protocol_error(
    data: bytes, cuts: list[int], max_frame: int
) -> None:
    _check_decoder(data, cuts, max_frame)


@FUZZ
@given(
    data=mutated_streams(),
    cuts=cut_lists,
    max_frame=st.sampled_from([32, 128, DEFAULT_MAX_FRAME]),
)
def test_mutated_streams_only_raise_remote_protocol_error(
    data: bytes, cuts: list[int], max_frame: int
) -> None:
    _check_decoder(data, cuts, max_frame)


@settings(max_examples=examples(100), deadline=None)
@given(stream=st.lists(messages, min_size=1, max_size=8), cuts=cut_lists)
def test_valid_streams_decode_to_themselves_however_split(
    stream: list[Message], cuts: list[int]
) -> None:
    data = b"".join(encode(m) for m in stream)
    got, code, buffered = _check_decoder(data, cuts, DEFAULT_MAX_FRAME)
    assert code is None
    assert buffered == 0
    assert got == [(m, len(encode(m))) for m in stream]


# --------------------------------------------------------------------------- Connection


def _fresh(role: Role) -> Connection:
    connection = Connection(role)
    if role is Role.CLIENT:
        connection.hello("fuzz")
        connection.data_to_send()
    return connection


def _handshaken(role: Role) -> Connection:
    pair = ConnectionPair()
    return pair.client if role is Role.CLIENT else pair.broker


def _busy(role: Role) -> Connection:
    """Handles 0 bound on both sides, a publish and a delivery buffered."""
    pair = ConnectionPair()
    topic = pair.client.bind_topic("t")
    pair.run()
    sub = pair.client.subscribe(topic)
    pair.run()
    pair.client.publish(topic, b"p")
    pair.run()
    (published,) = [e for e in pair.broker_events if isinstance(e, PublishReceived)]
    pair.broker.deliver(sub, 0, published.message.payload)
    pair.run()
    pair.assert_no_errors()
    return pair.client if role is Role.CLIENT else pair.broker


SETUPS: dict[str, Callable[[Role], Connection]] = {
    "before handshake": _fresh,
    "after handshake": _handshaken,
    "with handles bound": _busy,
}


def _normal(item: Event | Message) -> Any:
    """``item`` without the text of an error's reason.

    The reason may name a different symptom depending on the split (a truncated
    CBOR item ends at the end of the data, or runs into the next frame); the
    code and everything else may not differ.
    """
    if isinstance(item, ConnectionClosed):
        error = item.error
        reason = item.reason if item.by_peer else "<error>"
        return ("closed", item.code, reason, item.by_peer, error and error.code)
    if isinstance(item, Goodbye):
        return ("goodbye", item.code)
    return item


def _feed(setup: str, role: Role, pieces: list[bytes]) -> tuple[list[Any], list[Any]]:
    connection = SETUPS[setup](role)
    assert connection.data_to_send() == b""
    events: list[Event] = []
    for piece in pieces:
        new = connection.receive_data(piece, 1.0)  # must never raise
        if connection.closed and events and isinstance(events[-1], ConnectionClosed):
            assert new == []
        events += new
    out = connection.data_to_send(1.0)
    # Everything queued is well-formed and fits what the peer accepts.
    sent = _decode([out], connection.peer_max_frame)
    assert sent[1] is None, "the connection queued a malformed or oversized frame"
    sent_messages = [m for m, _ in sent[0]]
    goodbyes = [m for m in sent_messages if isinstance(m, Goodbye)]
    closed = [i for i, e in enumerate(events) if isinstance(e, ConnectionClosed)]
    if not closed:
        assert not connection.closed
        assert goodbyes == []
    else:
        assert closed == [len(events) - 1], "ConnectionClosed must be the last event"
        assert connection.closed
        event = events[-1]
        assert isinstance(event, ConnectionClosed)
        if event.by_peer:
            # The garbage held a well-formed Goodbye: the peer closed, nothing to answer.
            assert event.error is None
            assert goodbyes == []
        else:
            assert isinstance(event.error, RemoteProtocolError)
            assert event.code == int(event.error.code)
            # The reason may be cut short (it can echo peer input), never made up.
            assert event.reason
            assert event.error.reason.startswith(event.reason)
            assert goodbyes == [Goodbye(event.code, event.reason)]
            assert sent_messages[-1] == Goodbye(event.code, event.reason)
    if connection.closed:
        # A closed connection ignores everything from now on.
        assert connection.receive_data(encode(Ping(1)) + b"\xff" * 9, 2.0) == []
        assert connection.receive_data(b"", 2.0) == []
        assert connection.data_to_send(2.0) == b""
        assert connection.closed
    return [_normal(e) for e in events], [_normal(m) for m in sent_messages]


def _check_connection(setup: str, role: Role, data: bytes, cuts: list[int]) -> None:
    results = {name: _feed(setup, role, pieces) for name, pieces in _splits(data, cuts).items()}
    assert results["byte by byte"] == results["whole"]
    assert results["random chunks"] == results["whole"]


@settings(
    max_examples=examples(600),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    setup=st.sampled_from(list(SETUPS)),
    role=st.sampled_from(Role),
    data=garbage,
    cuts=cut_lists,
)
def test_connection_survives_garbage(setup: str, role: Role, data: bytes, cuts: list[int]) -> None:
    _check_connection(setup, role, data, cuts)


@FUZZ
@given(
    role=st.sampled_from(Role),
    stream=st.lists(messages, min_size=1, max_size=8),
    cuts=cut_lists,
)
def test_connection_survives_valid_but_unexpected_frames(
    role: Role, stream: list[Message], cuts: list[int]
) -> None:
    _check_connection("with handles bound", role, b"".join(encode(m) for m in stream), cuts)


@FUZZ
@given(
    role_and_data=st.sampled_from(Role).flatmap(
        lambda r: st.tuples(st.just(r), plausible_streams(r))
    ),
    cuts=cut_lists,
)
def test_connection_survives_plausible_peers(
    role_and_data: tuple[Role, bytes], cuts: list[int]
) -> None:
    role, data = role_and_data
    _check_connection("with handles bound", role, data, cuts)


@pytest.mark.parametrize("role", list(Role), ids=lambda r: r.name.lower())
def test_connection_reports_a_malformed_frame(role: Role) -> None:
    connection = _handshaken(role)
    events = connection.receive_data(encode(Ping(5)) + _frame(b"\x82\x02\xf5"), 0.0)
    assert len(events) == 1
    (event,) = events
    assert isinstance(event, ConnectionClosed)
    assert (event.code, event.by_peer) == (GoodbyeCode.PROTOCOL_ERROR, False)
    assert isinstance(event.error, RemoteProtocolError)
    sent = _decode([connection.data_to_send()], DEFAULT_MAX_FRAME)
    assert [m for m, _ in sent[0]] == [Pong(5), Goodbye(GoodbyeCode.PROTOCOL_ERROR, event.reason)]
    assert connection.receive_data(encode(Ping(6)), 0.0) == []
    assert connection.data_to_send() == b""


@pytest.mark.parametrize("role", list(Role), ids=lambda r: r.name.lower())
def test_connection_refuses_an_oversized_frame_before_its_body(role: Role) -> None:
    connection = _handshaken(role)
    events = connection.receive_data(struct.pack(">I", 2**32 - 1), 0.0)
    assert len(events) == 1
    (event,) = events
    assert isinstance(event, ConnectionClosed)
    assert (event.code, event.by_peer) == (GoodbyeCode.FRAME_TOO_LARGE, False)
    sent = _decode([connection.data_to_send()], DEFAULT_MAX_FRAME)
    assert [m for m, _ in sent[0]] == [Goodbye(GoodbyeCode.FRAME_TOO_LARGE, event.reason)]


# --------------------------------------------------------------------------- regressions


def _receive_must_close(role: Role, data: bytes) -> None:
    connection = _handshaken(role)
    events = connection.receive_data(data, 0.0)
    assert connection.closed
    assert isinstance(events[-1], ConnectionClosed)
    assert events[-1].error is not None
    # The Goodbye fits what the peer accepts.
    sent = _decode([connection.data_to_send()], connection.peer_max_frame)
    assert [m for m, _ in sent[0]][-1] == Goodbye(events[-1].code, events[-1].reason)


# Regression: a bignum over 4300 digits made the codec's error message raise
# ValueError, which escaped Connection.receive_data.
@pytest.mark.parametrize("role", list(Role), ids=lambda r: r.name.lower())
def test_huge_bignum_closes_the_connection(role: Role) -> None:
    _receive_must_close(role, _frame(cbor2.dumps([2, 1 << 20_000])))


#: A Subscribe whose option value is not a scalar, under an option name of ~1 MiB.
LONG_OPTION_NAME = cbor2.dumps([31, 0, "reliable", {"k" * (DEFAULT_MAX_FRAME - 40): [0]}])


# Regression: the Goodbye reason echoed peer-chosen text unbounded (Subscribe mode,
# option name); near max_frame the Goodbye no longer fitted the peer's max_frame, so
# encode() raised LocalProtocolError out of receive_data and the connection stayed open.
@pytest.mark.parametrize(
    ("role", "body"),
    [
        # The broker's error names the unknown delivery mode in full.
        (Role.BROKER, encode_body(Subscribe(0, "x" * (DEFAULT_MAX_FRAME - 10), {}))),
        # The codec's error names the option key in full (any role).
        (Role.BROKER, LONG_OPTION_NAME),
        (Role.CLIENT, LONG_OPTION_NAME),
    ],
    ids=["broker: long mode", "broker: long option name", "client: long option name"],
)
def test_an_error_about_long_peer_text_still_closes_the_connection(role: Role, body: bytes) -> None:
    assert len(body) <= DEFAULT_MAX_FRAME
    _receive_must_close(role, _frame(body))


def _small_frame_pair() -> tuple[Connection, Connection]:
    """A client and a broker joined by hand; the broker accepts only 64-byte frames."""
    client = Connection(Role.CLIENT)
    broker = Connection(Role.BROKER, max_frame=64)
    client.hello("c")
    broker.receive_data(client.data_to_send(), 0.0)
    broker.welcome(session=bytes(16), epoch=b"e")
    events = client.receive_data(broker.data_to_send(), 0.0)
    assert isinstance(events[0], WelcomeReceived)
    assert client.peer_max_frame == 64
    assert not client.closed and not broker.closed
    return client, broker


@pytest.mark.parametrize("role", list(Role), ids=lambda r: r.name.lower())
def test_a_small_max_frame_still_fits_the_goodbye(role: Role) -> None:
    client, broker = _small_frame_pair()
    connection = client if role is Role.CLIENT else broker
    # A truncated CBOR item: its error message is longer than 64 bytes.
    events = connection.receive_data(_frame(b"\x83\x02\x01"), 0.0)
    assert connection.closed
    assert isinstance(events[-1], ConnectionClosed)
    assert events[-1].error is not None
    sent = _decode([connection.data_to_send()], connection.peer_max_frame)
    assert [m for m, _ in sent[0]] == [Goodbye(events[-1].code, events[-1].reason)]
