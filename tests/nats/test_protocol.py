"""The NATS client protocol, sans-IO: the handshake, frames parsed from any
chunking, output encoded, keepalive, subscriptions across transports, and
protocol violations reported as one event."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.nats import Headers, Msg, NatsConnection, PayloadTooLarge
from broker.nats._protocol import (
    Connected,
    ConnectOptions,
    Event,
    InfoReceived,
    Pong,
    ProtocolViolation,
    ServerError,
    StaleConnection,
    State,
)

INFO = b'INFO {"server_id":"S","version":"2.15.1","max_payload":4096,"headers":true}\r\n'


def connected() -> NatsConnection:
    """A connection past its handshake (what it sent taken)."""
    conn = NatsConnection(ping_interval=10.0)
    conn.connection_made()
    assert [type(e) for e in conn.receive_data(INFO)] == [InfoReceived]
    conn.connect(ConnectOptions(name="t"), now=0.0)
    sent = conn.data_to_send()
    assert sent.startswith(b"CONNECT {")
    assert [type(e) for e in conn.receive_data(b"PONG\r\n")] == [Connected]
    assert conn.state is State.CONNECTED
    return conn


def test_the_handshake_sends_connect_then_ping() -> None:
    conn = NatsConnection()
    conn.connection_made()
    assert conn.data_to_send() == b""
    (info,) = conn.receive_data(INFO)
    assert isinstance(info, InfoReceived) and info.info["version"] == "2.15.1"
    assert conn.max_payload == 4096
    conn.connect(
        ConnectOptions(name="front", user="u", password="p", token="t", tls_required=True), 0.0
    )
    sent = bytes(conn.data_to_send())
    line, rest = sent.split(b"\r\n", 1)
    assert rest == b"PING\r\n"
    assert line.startswith(b"CONNECT ")
    body = json.loads(line[8:])
    assert body["verbose"] is False and body["pedantic"] is False
    assert body["headers"] is True and body["no_responders"] is True
    assert body["name"] == "front" and body["user"] == "u" and body["pass"] == "p"
    assert body["auth_token"] == "t" and body["tls_required"] is True
    assert body["lang"] and body["version"]
    assert conn.receive_data(b"PONG\r\n") == [Connected(conn.info)]


def test_output_waits_for_the_handshake() -> None:
    conn = NatsConnection()
    conn.publish("early", b"x")
    sid = conn.subscribe("in.>", "workers")
    conn.connection_made()
    conn.receive_data(INFO)
    conn.connect(ConnectOptions(), 0.0)
    sent = bytes(conn.data_to_send())
    assert b"SUB in.> workers %d\r\n" % sid in sent
    assert b"PUB early" not in sent  # (a refused CONNECT must not lose it)
    conn.receive_data(b"PONG\r\n")
    assert conn.data_to_send() == b"PUB early 1\r\nx\r\n"


def test_a_refused_connect_fails_the_connection() -> None:
    conn = NatsConnection()
    conn.connection_made()
    conn.receive_data(INFO)
    conn.connect(ConnectOptions(), 0.0)
    events = conn.receive_data(b"-ERR 'Authorization Violation'\r\nPONG\r\n")
    assert events == [ServerError("Authorization Violation", fatal=True)]
    assert conn.state is State.FAILED
    assert conn.receive_data(b"PONG\r\n") == []


def test_a_permissions_violation_is_not_fatal() -> None:
    conn = connected()
    events = conn.receive_data(b"-ERR 'Permissions Violation for Publish to \"x\"'\r\nPONG\r\n")
    assert events == [ServerError('Permissions Violation for Publish to "x"', fatal=False)]
    assert conn.state is State.CONNECTED


def test_publish_encodes_pub_and_hpub() -> None:
    conn = connected()
    conn.publish("a.b", b"hello")
    conn.publish("a.b", b"", reply="_INBOX.x.1")
    conn.publish("a.b", b"hi", headers=Headers({"K": "v"}))
    conn.publish("a.b", b"hi", reply="r", headers=Headers({"K": "v"}))
    block = b"NATS/1.0\r\nK: v\r\n\r\n"
    assert bytes(conn.data_to_send()) == (
        b"PUB a.b 5\r\nhello\r\n"
        b"PUB a.b _INBOX.x.1 0\r\n\r\n"
        b"HPUB a.b %d %d\r\n%bhi\r\n"
        % (len(block), len(block) + 2, block)
        + b"HPUB a.b r %d %d\r\n%bhi\r\n" % (len(block), len(block) + 2, block)
    )


def test_publish_refuses_what_the_server_would() -> None:
    conn = connected()
    with pytest.raises(PayloadTooLarge):
        conn.publish("a", bytes(4097))
    with pytest.raises(PayloadTooLarge):
        conn.publish("a", bytes(4090), headers=Headers({"K": "v"}))
    for subject in ("", "a b", "a\r\nPUB x 1"):
        with pytest.raises(ValueError):
            conn.publish(subject, b"x")
    assert conn.data_to_send() == b""
    conn.publish("a", bytes(4096))
    assert len(conn.data_to_send()) == len(b"PUB a 4096\r\n\r\n") + 4096


def test_sub_and_unsub_lines() -> None:
    conn = connected()
    one = conn.subscribe("x.*")
    two = conn.subscribe("y", queue="q")
    conn.unsubscribe(one)
    conn.unsubscribe(two, max_msgs=5)
    assert bytes(conn.data_to_send()) == (
        b"SUB x.* %d\r\nSUB y q %d\r\nUNSUB %d\r\nUNSUB %d 5\r\n" % (one, two, one, two)
    )


def test_a_server_ping_is_answered() -> None:
    conn = connected()
    assert conn.receive_data(b"PING\r\n") == []
    assert conn.data_to_send() == b"PONG\r\n"


def test_pings_answer_in_order_and_a_lost_transport_gives_back_its_tokens() -> None:
    conn = connected()
    conn.ping("one")
    conn.ping("two")
    conn.data_to_send()
    conn.ping("three")  # queued, not handed out
    assert conn.receive_data(b"PONG\r\n") == [Pong("one")]
    assert conn.connection_lost() == ["two"]
    conn.connection_made()
    conn.receive_data(INFO)
    conn.connect(ConnectOptions(), 0.0)
    conn.data_to_send()
    assert conn.receive_data(b"PONG\r\n") == [Connected(conn.info)]
    assert conn.data_to_send() == b"PING\r\n"
    assert conn.receive_data(b"PONG\r\n") == [Pong("three")]


def test_keepalive_pings_then_reports_a_stale_connection() -> None:
    conn = connected()  # ping_interval 10, at 0
    assert conn.next_deadline() == 10.0
    assert conn.handle_timer(5.0) == []
    assert conn.handle_timer(10.0) == []
    assert conn.data_to_send() == b"PING\r\n"
    assert conn.receive_data(b"PONG\r\n") == []  # (its own: no event)
    assert conn.handle_timer(20.0) == []
    assert conn.handle_timer(30.0) == []
    assert conn.handle_timer(40.0) == [StaleConnection(2)]
    assert conn.state is State.FAILED


def test_anything_the_server_sends_counts_as_an_answer_to_the_pings() -> None:
    conn = connected()  # ping_interval 10, at 0
    sid = conn.subscribe("s")
    assert conn.handle_timer(10.0) == []
    assert conn.handle_timer(20.0) == []  # (two PINGs unanswered)
    conn.receive_data(b"MSG s %d 1\r\na\r\n" % sid)  # (but the server is alive)
    assert conn.handle_timer(30.0) == []
    assert conn.handle_timer(40.0) == []
    assert conn.handle_timer(50.0) == [StaleConnection(2)]


def test_a_subscription_with_max_msgs_is_sent_again_with_what_is_left() -> None:
    conn = connected()
    sid = conn.subscribe("s")
    conn.unsubscribe(sid, max_msgs=3)
    conn.data_to_send()
    conn.receive_data(b"MSG s %d 1\r\na\r\n" % sid)
    conn.connection_lost()
    conn.connection_made()
    conn.receive_data(INFO)
    conn.connect(ConnectOptions(), 0.0)
    sent = bytes(conn.data_to_send())
    assert b"SUB s %d\r\nUNSUB %d 2\r\n" % (sid, sid) in sent
    conn.receive_data(b"PONG\r\nMSG s %d 1\r\na\r\nMSG s %d 1\r\na\r\n" % (sid, sid))
    assert not conn.is_subscribed(sid)


def test_messages_and_their_headers() -> None:
    conn = connected()
    block = b"NATS/1.0 408 Request Timeout\r\nA: 1\r\n\r\n"
    data = (
        b"MSG a.b 1 5\r\nhello\r\n"
        b"MSG a.b 2 _INBOX.r.1 0\r\n\r\n"
        b"HMSG _INBOX.r.2 3 16 16\r\nNATS/1.0 503\r\n\r\n\r\n"
        b"HMSG x 4 reply %d %d\r\n%bhi\r\n" % (len(block), len(block) + 2, block)
    )
    assert conn.receive_data(data) == [
        Msg("a.b", 1, "", b"hello"),
        Msg("a.b", 2, "_INBOX.r.1", b""),
        Msg("_INBOX.r.2", 3, "", b"", Headers(status=503)),
        Msg("x", 4, "reply", b"hi", Headers({"A": "1"}, status=408, description="Request Timeout")),
    ]
    (no_responders,) = conn.receive_data(b"HMSG _INBOX.r.2 3 16 16\r\nNATS/1.0 503\r\n\r\n\r\n")
    assert isinstance(no_responders, Msg) and no_responders.status == 503


@pytest.mark.parametrize(
    "data",
    [
        b"NOPE\r\n",
        b"MSG a 1 x\r\n",
        b"MSG a 1 5000\r\n",  # over max_payload (4096)
        b"MSG a 1 2\r\nabc\r\n",  # payload not ended by CRLF
        b"MSG a\r\n",
        b"HMSG a 1 10 5\r\n",  # headers larger than the whole
        b"HMSG a 1 4 6\r\nXXXXab\r\n",  # not a header block
        b"INFO [1]\r\n",
        b"MSG " + b"a" * 70_000,  # a control line without end
    ],
)
def test_a_protocol_violation_is_one_event_then_silence(data: bytes) -> None:
    conn = connected()
    events = conn.receive_data(data)
    assert len(events) == 1 and isinstance(events[0], ProtocolViolation)
    assert conn.state is State.FAILED
    assert conn.receive_data(b"MSG a 1 1\r\nx\r\n") == []


def test_a_large_message_in_small_chunks() -> None:
    conn = NatsConnection()
    conn.connection_made()
    conn.receive_data(INFO.replace(b"4096", b"8388608"))
    payload = bytes(range(256)) * 8192  # 2 MiB
    data = b"MSG big 1 %d\r\n%b\r\n" % (len(payload), payload)
    events: list[Event] = []
    for at in range(0, len(data), 1000):
        events += conn.receive_data(data[at : at + 1000])
    assert events == [Msg("big", 1, "", payload)]


# A stream of mixed frames, fed whole and in random chunks: the same events.

_TOKEN = st.text(alphabet="abcxyz0123_", min_size=1, max_size=6)
_SUBJECT = st.lists(_TOKEN, min_size=1, max_size=3).map(".".join)
_HEADERS = st.one_of(
    st.builds(
        Headers,
        st.lists(st.tuples(st.sampled_from(["A", "Nats-Msg-Id", "b-c"]), _TOKEN), max_size=3),
    ),
    st.sampled_from(
        [
            Headers(status=503),
            Headers(status=404, description="No Messages"),
            Headers(status=408, description="Request Timeout"),
            Headers(
                {"Nats-Last-Consumer": "3", "Nats-Last-Stream": "9"},
                status=100,
                description="Idle Heartbeat",
            ),
        ]
    ),
)


@st.composite
def _frames(draw: st.DrawFn) -> tuple[bytes, list[Event]]:
    from broker.nats._headers import encode_headers

    kind = draw(st.sampled_from(["msg", "hmsg", "ping", "pong", "ok", "info", "err"]))
    if kind in ("msg", "hmsg"):
        subject = draw(_SUBJECT)
        sid = draw(st.integers(1, 1000))
        reply = draw(st.one_of(st.just(""), _SUBJECT))
        payload = draw(st.binary(max_size=300))
        middle = f" {reply}" if reply else ""
        if kind == "msg":
            line = f"MSG {subject} {sid}{middle} {len(payload)}\r\n".encode()
            return line + payload + b"\r\n", [Msg(subject, sid, reply, payload)]
        headers = draw(_HEADERS)
        block = encode_headers(headers)
        line = f"HMSG {subject} {sid}{middle} {len(block)} {len(block) + len(payload)}\r\n"
        return line.encode() + block + payload + b"\r\n", [
            Msg(subject, sid, reply, payload, headers)
        ]
    if kind == "ping":
        return b"PING\r\n", []
    if kind == "pong":
        return b"PONG\r\n", []  # (nothing asked: no event)
    if kind == "ok":
        return b"+OK\r\n", []
    if kind == "info":
        info = {"server_id": draw(_TOKEN), "connect_urls": ["127.0.0.1:4223"], "max_payload": 4096}
        return b"INFO " + json.dumps(info).encode() + b"\r\n", [InfoReceived(info)]
    message = "Permissions Violation for Subscription to " + draw(_SUBJECT)
    return f"-ERR '{message}'\r\n".encode(), [ServerError(message, fatal=False)]


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({cut % (len(data) + 1) for cut in cuts})
    pieces, last = [], 0
    for point in points:
        pieces.append(data[last:point])
        last = point
    pieces.append(data[last:])
    return pieces


@given(
    st.lists(_frames(), min_size=1, max_size=25),
    st.lists(st.integers(min_value=0), max_size=40),
)
def test_any_chunking_gives_the_same_events(
    frames: list[tuple[bytes, list[Event]]], cuts: list[int]
) -> None:
    data = b"".join(frame for frame, _ in frames)
    expected = [event for _, events in frames for event in events]
    whole = connected()
    assert whole.receive_data(data) == expected
    chunked = connected()
    got: list[Event] = []
    for piece in _split(data, cuts):
        got += chunked.receive_data(bytearray(piece))
    assert got == expected
    pings = sum(frame == b"PING\r\n" for frame, _ in frames)
    assert whole.data_to_send() == chunked.data_to_send() == b"PONG\r\n" * pings
