"""Hello's optional ``token``: encoded only when given, decoded strictly, never shown.

Without a token a Hello is the 3-key map of docs/protocol.md, byte for byte;
with one the map gains a fourth key ``"token"`` holding text. Anything else
in the map (an unknown key, a token that is not text) is a protocol error:
the broker answers with Goodbye code 1 and closes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import cbor2
import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.protocol import (
    LENGTH_PREFIX,
    PROTOCOL_VERSION,
    U64_MAX,
    Connection,
    ConnectionClosed,
    ConnectionState,
    Goodbye,
    GoodbyeCode,
    Hello,
    HelloReceived,
    LocalProtocolError,
    Message,
    Ping,
    RemoteProtocolError,
    Role,
    WelcomeReceived,
)
from broker.protocol.frames import FrameDecoder, decode_body, encode, encode_body

from .pair import EPOCH, SESSION, ConnectionPair, of, split_frames

DOC = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"

#: encode(Hello(PROTOCOL_VERSION, "demo", None, {})) as docs/protocol.md shows it.
DOCUMENTED_HELLO_HEX = (
    "00 00 00 24 83 00 01 a3 66 63 6c 69 65 6e 74 64 64 65 6d 6f 67 73 65 73 73 69 6f 6e"
    " f6 69 70 72 6f 63 65 73 73 65 64 a0"
)
DOCUMENTED_HELLO = bytes.fromhex(DOCUMENTED_HELLO_HEX)

SECRET = "s3cret"


def frame(body: bytes) -> bytes:
    return len(body).to_bytes(LENGTH_PREFIX, "big") + body


def hello_body(fields: Any, version: Any = 1) -> bytes:
    """The body of a Hello frame whose field map is ``fields`` (sent as is)."""
    return cbor2.dumps([0, version, fields])


def fields_with(**changes: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {"client": "c", "session": None, "processed": {}}
    fields.update(changes)
    return fields


# --------------------------------------------------------------------------- encoding


def test_without_a_token_a_hello_is_exactly_the_documented_frame() -> None:
    assert DOCUMENTED_HELLO_HEX in DOC.read_text(encoding="utf-8")
    assert encode(Hello(PROTOCOL_VERSION, "demo", None, {})) == DOCUMENTED_HELLO
    assert encode(Hello(PROTOCOL_VERSION, "demo", None, {}, None)) == DOCUMENTED_HELLO
    assert encode(Hello(PROTOCOL_VERSION, "demo", None, {}, token=None)) == DOCUMENTED_HELLO
    assert len(DOCUMENTED_HELLO) == 40
    decoded = decode_body(DOCUMENTED_HELLO[LENGTH_PREFIX:])
    assert decoded == Hello(1, "demo", None, {})
    assert isinstance(decoded, Hello) and decoded.token is None


def test_a_token_is_a_fourth_key_after_the_documented_three() -> None:
    frame_bytes = encode(Hello(PROTOCOL_VERSION, "demo", None, {}, SECRET))
    body = frame_bytes[LENGTH_PREFIX:]
    # The documented body with a map of 4 pairs instead of 3, then "token": text(6).
    documented_body = DOCUMENTED_HELLO[LENGTH_PREFIX:]
    assert documented_body[3] == 0xA3
    expected = documented_body[:3] + b"\xa4" + documented_body[4:] + b"\x65token\x66s3cret"
    assert body == expected
    assert frame_bytes[:LENGTH_PREFIX] == len(expected).to_bytes(4, "big")
    assert list(cbor2.loads(body)[2]) == ["client", "session", "processed", "token"]


@pytest.mark.parametrize(
    ("token", "keys"),
    [
        (None, ["client", "session", "processed"]),
        ("", ["client", "session", "processed", "token"]),
        (SECRET, ["client", "session", "processed", "token"]),
    ],
)
def test_the_token_key_is_sent_only_when_a_token_is_given(
    token: str | None, keys: list[str]
) -> None:
    fields = cbor2.loads(encode_body(Hello(1, "c", None, {}, token)))[2]
    assert list(fields) == keys
    if token is not None:
        assert fields["token"] == token and type(fields["token"]) is str


TOKENS = [
    SECRET,
    "",  # an empty token is still a token
    "pässwörd ✓ 🔑",
    "\x00\x7f\u2028",
    "t" * 70_000,
    "line\nbreak",
]

HELLOS: list[Hello] = [
    *(Hello(1, "client", None, {}, token) for token in TOKENS),
    Hello(1, "ünïcødé ✓", SESSION, {0: 0, 1: U64_MAX}, "tøkén"),
    Hello(U64_MAX, "", b"", {3: 4}, "x"),
    Hello(1, "client", None, {}),
    Hello(0, "c", SESSION, {5: 6}, None),
]


def _assert_round_trips(message: Hello) -> None:
    frame_bytes = encode(message)
    body = frame_bytes[LENGTH_PREFIX:]
    assert body == encode_body(message)
    decoded = decode_body(body)
    assert decoded == message
    assert isinstance(decoded, Hello)
    assert decoded.token == message.token
    assert type(decoded.token) is type(message.token)
    # The incremental decoder agrees, and the decoded message re-encodes identically.
    decoder = FrameDecoder()
    decoder.feed(frame_bytes)
    assert list(decoder.messages()) == [(message, len(frame_bytes))]
    assert decoder.buffered == 0
    assert encode(decoded) == frame_bytes


@pytest.mark.parametrize("message", HELLOS, ids=lambda m: repr(m.token)[:20])
def test_hello_round_trips_with_and_without_a_token(message: Hello) -> None:
    _assert_round_trips(message)


@given(
    token=st.none() | st.text(),
    client=st.text(max_size=30),
    session=st.none() | st.binary(max_size=20),
    processed=st.dictionaries(st.integers(0, U64_MAX), st.integers(0, U64_MAX), max_size=4),
)
def test_any_hello_round_trips(
    token: str | None, client: str, session: bytes | None, processed: dict[int, int]
) -> None:
    _assert_round_trips(Hello(PROTOCOL_VERSION, client, session, processed, token))


def test_a_token_that_differs_makes_a_different_message() -> None:
    assert Hello(1, "c", None, {}, "a") != Hello(1, "c", None, {}, "b")
    assert Hello(1, "c", None, {}, "") != Hello(1, "c", None, {}, None)
    assert encode(Hello(1, "c", None, {}, "")) != encode(Hello(1, "c", None, {}, None))


@pytest.mark.parametrize(
    "order",
    [
        ["token", "client", "session", "processed"],
        ["processed", "token", "session", "client"],
        ["session", "processed", "client", "token"],
    ],
)
def test_the_decoder_accepts_the_token_key_in_any_position(order: list[str]) -> None:
    values = {"client": "c", "session": None, "processed": {1: 2}, "token": SECRET}
    body = hello_body({key: values[key] for key in order})
    assert list(cbor2.loads(body)[2]) == order
    assert decode_body(body) == Hello(1, "c", None, {1: 2}, SECRET)


# --------------------------------------------------------------------------- refusals


def _bad_utf8_token_body() -> bytes:
    body = hello_body(fields_with(token="AAAA"))
    assert body.count(b"\x64AAAA") == 1
    return body.replace(b"\x64AAAA", b"\x64\xff\xfe\xfd\xfc")


def _duplicate_token_body() -> bytes:
    # {"client": "c", "session": null, "processed": {}, "token": "a", "token": "b"}
    items: tuple[Any, ...] = (
        "client",
        "c",
        "session",
        None,
        "processed",
        {},
        "token",
        "a",
        "token",
        "b",
    )
    return b"\x83\x00\x01\xa5" + b"".join(cbor2.dumps(item) for item in items)


#: what it breaks -> a Hello body the decoder must refuse
MALFORMED_HELLOS: dict[str, bytes] = {
    "extra unknown key": hello_body(fields_with(extra=1)),
    "extra unknown key with a token": hello_body(fields_with(token=SECRET, extra=1)),
    "extra null key with a token": hello_body(fields_with(token=SECRET, tokens=None)),
    "capitalised Token key": hello_body(fields_with(Token=SECRET)),
    "token as a bytes key": hello_body(fields_with() | {b"token": SECRET}),
    "token bytes": hello_body(fields_with(token=SECRET.encode())),
    "token null": hello_body(fields_with(token=None)),
    "token int": hello_body(fields_with(token=5)),
    "token zero": hello_body(fields_with(token=0)),
    "token bool": hello_body(fields_with(token=True)),
    "token float": hello_body(fields_with(token=1.5)),
    "token array": hello_body(fields_with(token=[SECRET])),
    "token map": hello_body(fields_with(token={"t": SECRET})),
    "token tagged text": hello_body(fields_with(token=cbor2.CBORTag(35, SECRET))),
    "token invalid utf-8": _bad_utf8_token_body(),
    "token twice": _duplicate_token_body(),
    "token but processed missing": hello_body({"client": "c", "session": None, "token": SECRET}),
    "token but client missing": hello_body({"session": None, "processed": {}, "token": SECRET}),
    "token instead of session": hello_body({"client": "c", "processed": {}, "token": SECRET}),
    "only a token": hello_body({"token": SECRET}),
    "token with bytes client": hello_body(fields_with(client=b"c", token=SECRET)),
    "token in the array, not the map": cbor2.dumps([0, 1, fields_with(), SECRET]),
}


@pytest.mark.parametrize("body", MALFORMED_HELLOS.values(), ids=MALFORMED_HELLOS.keys())
def test_a_malformed_hello_map_is_a_protocol_error(body: bytes) -> None:
    with pytest.raises(RemoteProtocolError) as info:
        decode_body(body)
    assert info.value.code == GoodbyeCode.PROTOCOL_ERROR
    assert info.value.reason.startswith("malformed frame: ")
    # The incremental decoder refuses it too, after the good frame before it.
    decoder = FrameDecoder()
    decoder.feed(encode(Ping(1)) + frame(body) + encode(Ping(2)))
    got: list[Message] = []
    with pytest.raises(RemoteProtocolError) as info:
        for message, _size in decoder.messages():
            got.append(message)
    assert info.value.code == GoodbyeCode.PROTOCOL_ERROR
    assert got == [Ping(1)]


@pytest.mark.parametrize("body", MALFORMED_HELLOS.values(), ids=MALFORMED_HELLOS.keys())
def test_a_broker_answers_a_malformed_hello_with_goodbye_1_and_closes(body: bytes) -> None:
    broker = Connection(Role.BROKER)
    events = broker.receive_data(frame(body), 0.0)
    assert len(events) == 1
    closed = events[0]
    assert isinstance(closed, ConnectionClosed)
    assert closed.code == int(GoodbyeCode.PROTOCOL_ERROR) == 1
    assert closed.by_peer is False
    assert isinstance(closed.error, RemoteProtocolError)
    assert closed.reason == closed.error.reason
    assert broker.closed and broker.state is ConnectionState.CLOSED
    assert broker.hello_message is None
    # What it sends is exactly one Goodbye(1, reason), and it then ignores the peer.
    assert split_frames(broker.data_to_send()) == [encode(Goodbye(1, closed.reason))]
    assert broker.receive_data(encode(Hello(1, "c", None, {}, SECRET)), 0.0) == []
    assert broker.data_to_send() == b""


def test_a_well_formed_hello_with_a_token_is_accepted_by_a_bare_broker() -> None:
    broker = Connection(Role.BROKER)
    events = broker.receive_data(encode(Hello(1, "c", None, {}, SECRET)), 0.0)
    assert events == [HelloReceived(Hello(1, "c", None, {}, SECRET))]
    assert broker.state is ConnectionState.HELLO_RECEIVED
    assert broker.hello_message is not None and broker.hello_message.token == SECRET
    assert broker.data_to_send() == b""


@pytest.mark.parametrize(
    "body",
    [
        hello_body(fields_with(extra=SECRET)),
        hello_body(fields_with(token=SECRET, extra=1)),
        hello_body(fields_with(token=SECRET, client=b"c")),
        hello_body(fields_with(token=SECRET, processed=None)),
        hello_body(fields_with(token=SECRET), version=2),
    ],
    ids=["secret as unknown value", "extra key", "bytes client", "null processed", "version 2"],
)
def test_refusing_a_hello_never_echoes_a_text_token(body: bytes) -> None:
    broker = Connection(Role.BROKER)
    events = broker.receive_data(frame(body), 0.0)
    (closed,) = of(ConnectionClosed, events)
    assert closed.code == GoodbyeCode.PROTOCOL_ERROR
    assert SECRET not in closed.reason
    assert SECRET not in str(closed.error)
    assert SECRET.encode() not in broker.data_to_send()


def test_refusing_a_mistyped_token_does_not_echo_it() -> None:
    broker = Connection(Role.BROKER)
    events = broker.receive_data(frame(hello_body(fields_with(token=SECRET.encode()))), 0.0)
    (closed,) = of(ConnectionClosed, events)
    assert SECRET not in str(closed.error)
    assert SECRET.encode() not in broker.data_to_send()


# --------------------------------------------------------------------------- through a connection


def test_a_client_token_arrives_at_the_broker() -> None:
    pair = ConnectionPair(handshake=False)
    pair.client.hello("test-client", token=SECRET)
    assert pair.client.hello_message is not None
    assert pair.client.hello_message.token == SECRET
    events = pair.to_broker()
    assert len(events) == 1 and isinstance(events[0], HelloReceived)
    hello = events[0].hello
    assert hello == Hello(PROTOCOL_VERSION, "test-client", None, {}, SECRET)
    assert hello.token == SECRET
    assert pair.broker.hello_message == hello
    # The handshake then completes as usual.
    pair.broker.welcome(session=SESSION, epoch=EPOCH)
    pair.run()
    pair.assert_no_errors()
    (welcome,) = of(WelcomeReceived, pair.client_events)
    assert welcome.welcome.session == SESSION
    assert pair.client.state is ConnectionState.OPEN
    assert pair.broker.state is ConnectionState.OPEN


def test_a_resuming_client_sends_its_token_with_session_and_processed() -> None:
    pair = ConnectionPair(handshake=False)
    pair.client.hello("resumer", session=SESSION, processed={4: 9}, token="pässwörd ✓")
    (event,) = pair.to_broker()
    assert isinstance(event, HelloReceived)
    assert event.hello == Hello(PROTOCOL_VERSION, "resumer", SESSION, {4: 9}, "pässwörd ✓")


def test_a_client_without_a_token_sends_the_documented_frame() -> None:
    client = Connection(Role.CLIENT)
    client.hello("demo")
    assert client.hello_message is not None and client.hello_message.token is None
    assert client.data_to_send() == DOCUMENTED_HELLO
    broker = Connection(Role.BROKER)
    (event,) = broker.receive_data(DOCUMENTED_HELLO, 0.0)
    assert isinstance(event, HelloReceived)
    assert event.hello.token is None


def test_the_token_passes_frame_by_frame_split_anywhere() -> None:
    client = Connection(Role.CLIENT)
    client.hello("c", token="tøkén")
    data = client.data_to_send()
    broker = Connection(Role.BROKER)
    events = []
    for i in range(len(data)):
        events += broker.receive_data(data[i : i + 1], 0.0)
    assert events == [HelloReceived(Hello(PROTOCOL_VERSION, "c", None, {}, "tøkén"))]


def test_hello_is_refused_locally_a_second_time_or_by_a_broker() -> None:
    client = Connection(Role.CLIENT)
    client.hello("c", token=SECRET)
    with pytest.raises(LocalProtocolError):
        client.hello("c", token="other")
    assert client.hello_message is not None and client.hello_message.token == SECRET
    with pytest.raises(LocalProtocolError):
        Connection(Role.BROKER).hello("c", token=SECRET)


def test_the_token_is_in_no_repr() -> None:
    pair = ConnectionPair(handshake=False)
    pair.client.hello("test-client", token=SECRET)
    (event,) = pair.to_broker()
    assert isinstance(event, HelloReceived)
    for shown in (
        repr(event.hello),
        str(event.hello),
        repr(event),
        repr(pair.client.hello_message),
        repr(pair.broker.hello_message),
        repr(Hello(1, "c", SESSION, {1: 2}, SECRET)),
    ):
        assert SECRET not in shown
        assert "token" not in shown
    # The other fields are still shown.
    assert "test-client" in repr(event.hello)
