"""The server-role MQTT connection: order, limits, QoS flows, keepalive,
and the close each violation gets in 3.1.1 and 5.0."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.mqtt import (
    MQTT_3_1_1,
    MQTT_5,
    NO_PROPERTIES,
    ConnAck,
    Connect,
    ConnectionClosed,
    ConnectionState,
    Disconnect,
    Framer,
    MQTTUsageError,
    Packet,
    PacketTooLargeForPeer,
    PingReq,
    PingResp,
    Properties,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    ReasonCode,
    ServerConnection,
    SessionState,
    Subscribe,
    Subscription,
    Will,
    decode_packet,
    encode_packet,
)
from broker.mqtt._connection import Event

R = ReasonCode


def sent(conn: ServerConnection, version: int) -> list[Packet]:
    """The packets the server queued, decoded."""
    framer = Framer()
    framer.feed(conn.data_to_send())
    out = []
    while (frame := framer.next_packet()) is not None:
        out.append(decode_packet(*frame, version))
    return out


def feed(conn: ServerConnection, version: int, *packets: Packet, now: float = 0.0) -> list[Event]:
    conn.receive_data(b"".join(encode_packet(p, version) for p in packets))
    return conn.events(now)


def connected(
    version: int = MQTT_5, connect_props: Properties = NO_PROPERTIES, **options: int
) -> ServerConnection:
    conn = ServerConnection(**options)  # type: ignore[arg-type]
    events = feed(conn, version, Connect("c", version, keepalive=10, properties=connect_props))
    assert isinstance(events[0], Connect)
    conn.connack()
    assert isinstance(sent(conn, version)[0], ConnAck)
    return conn


@pytest.mark.parametrize("version", [MQTT_3_1_1, MQTT_5])
def test_qos_flows_both_ways(version: int) -> None:
    conn = connected(version)
    events = feed(
        conn, version, Publish("a", b"1", 1, packet_id=1), Publish("b", b"2", 2, packet_id=2)
    )
    assert [type(e) for e in events] == [Publish, Publish]
    conn.puback(1)
    conn.pubrec(2)
    assert feed(conn, version, PubRel(2)) == [PubRel(2)]
    conn.pubcomp(2)
    assert sent(conn, version) == [PubAck(1), PubRec(2), PubComp(2)]
    one = conn.publish("x", b"", 1)
    two = conn.publish("y", b"", 2)
    assert (one, two) == (1, 2)
    assert feed(conn, version, PubAck(1), PubRec(2)) == [PubAck(1), PubRec(2)]
    conn.pubrel(2)
    assert feed(conn, version, PubComp(2)) == [PubComp(2)]
    assert conn.session_state() == SessionState()


def test_packets_wait_for_the_connack() -> None:
    conn = ServerConnection()
    conn.receive_data(
        encode_packet(Connect("c"), MQTT_5) + encode_packet(Publish("t", b"x"), MQTT_5)
    )
    assert isinstance(conn.next_event(0), Connect)
    assert conn.next_event(0) is None
    conn.connack()
    assert conn.next_event(0) == Publish("t", b"x")


def test_connack_tells_the_server_limits() -> None:
    conn = ServerConnection(max_packet_size=1000, receive_maximum=5, topic_alias_maximum=3)
    feed(conn, MQTT_5, Connect("c"))
    conn.connack(properties=Properties(maximum_qos=1))
    (ack,) = sent(conn, MQTT_5)
    assert isinstance(ack, ConnAck)
    props = ack.properties
    assert (props.maximum_packet_size, props.receive_maximum, props.topic_alias_maximum) == (
        1000,
        5,
        3,
    )
    (closed,) = feed(conn, MQTT_5, Publish("t", b"", 2, packet_id=1))
    assert closed == ConnectionClosed(R.QOS_NOT_SUPPORTED, "QoS 2 is not supported")


@pytest.mark.parametrize(
    ("packet", "reason"),
    [
        (Connect("c"), R.PROTOCOL_ERROR),
        (Publish("a/+", b""), R.TOPIC_NAME_INVALID),
        (Publish("", b"", properties=Properties(topic_alias=1)), R.PROTOCOL_ERROR),
        (Publish("t", b"", properties=Properties(topic_alias=9)), R.TOPIC_ALIAS_INVALID),
        (Publish("t", b"", properties=Properties(subscription_identifiers=(1,))), R.PROTOCOL_ERROR),
        (ConnAck(), R.PROTOCOL_ERROR),
        (PingResp(), R.PROTOCOL_ERROR),
        (Subscribe(1, (Subscription("$share/g/t", no_local=True),)), R.PROTOCOL_ERROR),
        (Disconnect(properties=Properties(session_expiry_interval=5)), R.PROTOCOL_ERROR),
    ],
)
def test_violations_close_with_their_reason(packet: Packet, reason: ReasonCode) -> None:
    conn = connected(MQTT_5, topic_alias_maximum=8)
    (closed,) = feed(conn, MQTT_5, packet)
    assert isinstance(closed, ConnectionClosed) and closed.reason is reason
    (disconnect,) = sent(conn, MQTT_5)
    assert isinstance(disconnect, Disconnect) and disconnect.reason is reason
    assert conn.state is ConnectionState.CLOSED
    assert conn.next_event(0) is None


def test_a_3_1_1_violation_closes_without_a_disconnect() -> None:
    conn = connected(MQTT_3_1_1)
    (closed,) = feed(conn, MQTT_3_1_1, Connect("again", MQTT_3_1_1))
    assert isinstance(closed, ConnectionClosed) and closed.reason is R.PROTOCOL_ERROR
    assert conn.data_to_send() == b""


def test_the_receive_maximum_is_enforced() -> None:
    conn = connected(MQTT_5, receive_maximum=2)
    publishes = [Publish("t", b"", 1, packet_id=n) for n in (1, 2, 3)]
    events = feed(conn, MQTT_5, *publishes)
    assert events[-1] == ConnectionClosed(
        R.RECEIVE_MAXIMUM_EXCEEDED, "more than 2 unacknowledged QoS 1 and 2 PUBLISHes"
    )


def test_a_packet_too_large_is_refused() -> None:
    conn = connected(MQTT_5, max_packet_size=64)
    (closed,) = feed(conn, MQTT_5, Publish("t", b"x" * 100))
    assert isinstance(closed, ConnectionClosed) and closed.reason is R.PACKET_TOO_LARGE
    assert sent(conn, MQTT_5)[0] == Disconnect(
        R.PACKET_TOO_LARGE, Properties(reason_string=closed.message)
    )


@pytest.mark.parametrize(
    ("data", "answer"),
    [
        (b"\x10\x0c\x00\x06MQIsdp\x03\x02\x00\x0a", b"\x20\x02\x00\x01"),  # 3.1: code 1
        (
            encode_packet(Connect("", MQTT_3_1_1, clean_start=False), MQTT_3_1_1),
            b"\x20\x02\x00\x02",
        ),
        (encode_packet(Publish("t"), MQTT_5), b""),  # not CONNECT first: just close
    ],
)
def test_connect_refusals(data: bytes, answer: bytes) -> None:
    conn = ServerConnection()
    conn.receive_data(data)
    assert isinstance(conn.next_event(0), ConnectionClosed)
    assert conn.data_to_send() == answer


def test_enhanced_authentication_is_refused() -> None:
    conn = ServerConnection()
    connect = Connect("c", properties=Properties(authentication_method="SCRAM-SHA-1"))
    (closed,) = feed(conn, MQTT_5, connect)
    assert isinstance(closed, ConnectionClosed)
    (ack,) = sent(conn, MQTT_5)
    assert isinstance(ack, ConnAck) and ack.reason is R.BAD_AUTHENTICATION_METHOD


def test_ping_is_answered_and_keepalive_watched() -> None:
    conn = connected(MQTT_5)
    assert feed(conn, MQTT_5, PingReq(), now=100.0) == [PingReq()]
    assert sent(conn, MQTT_5) == [PingResp()]
    assert conn.keepalive_deadline() == 115.0
    assert not conn.check_keepalive(115.0)
    assert conn.check_keepalive(115.5)
    assert sent(conn, MQTT_5)[0].reason is R.KEEP_ALIVE_TIMEOUT  # type: ignore[union-attr]
    assert conn.state is ConnectionState.CLOSED


def test_outbound_topic_aliases_and_client_limits() -> None:
    props = Properties(topic_alias_maximum=1, receive_maximum=1, maximum_packet_size=60)
    conn = connected(MQTT_5, props)
    conn.publish("a", b"", 0)
    conn.publish("a", b"", 0)
    conn.publish("b", b"", 0)
    aliases = [(p.topic, p.properties.topic_alias) for p in sent(conn, MQTT_5)]  # type: ignore[union-attr]
    assert aliases == [("a", 1), ("", 1), ("b", None)]
    conn.publish("q", b"", 1)
    with pytest.raises(MQTTUsageError):
        conn.publish("q", b"", 1)  # the client's receive maximum is 1
    with pytest.raises(PacketTooLargeForPeer):
        conn.publish("big", b"x" * 100, 0)


def test_qos_2_survives_a_new_connection() -> None:
    conn = connected(MQTT_5)
    feed(conn, MQTT_5, Publish("t", b"once", 2, packet_id=7))
    conn.pubrec(7)
    conn.publish("out", b"", 1)
    state = conn.session_state()
    assert state == SessionState(frozenset({7}), {1: 1}, frozenset())
    again = ServerConnection()
    feed(again, MQTT_5, Connect("c", clean_start=False))
    again.connack(session_present=True, session=state)
    again.data_to_send()
    # The client resends the PUBLISH: a duplicate, answered, not handed out.
    assert feed(again, MQTT_5, Publish("t", b"once", 2, dup=True, packet_id=7)) == []
    assert sent(again, MQTT_5) == [PubRec(7)]
    assert feed(again, MQTT_5, PubRel(7)) == [PubRel(7)]
    again.pubcomp(7)
    assert again.publish("out", b"", 1, packet_id=1) == 1
    resent = sent(again, MQTT_5)[-1]
    assert isinstance(resent, Publish) and resent.dup


def test_unknown_releases_get_not_found() -> None:
    conn = connected(MQTT_5)
    assert feed(conn, MQTT_5, PubRel(5), PubRec(6), PubAck(7), PubComp(8)) == []
    assert sent(conn, MQTT_5) == [
        PubComp(5, R.PACKET_IDENTIFIER_NOT_FOUND),
        PubRel(6, R.PACKET_IDENTIFIER_NOT_FOUND),
    ]


def test_the_will_is_due_unless_a_normal_disconnect() -> None:
    connect = Connect("c", will=Will("w", b"bye"))
    for ending, due in [(Disconnect(), False), (Disconnect(R.DISCONNECT_WITH_WILL_MESSAGE), True)]:
        conn = ServerConnection()
        feed(conn, MQTT_5, connect)
        conn.connack()
        feed(conn, MQTT_5, ending)
        assert conn.will_due is due
    conn = ServerConnection()
    feed(conn, MQTT_5, connect)
    conn.connack()
    conn.receive_data(b"")
    assert isinstance(conn.next_event(0), ConnectionClosed)
    assert conn.will_due


@given(st.sampled_from([MQTT_3_1_1, MQTT_5]), st.binary(max_size=200))
def test_arbitrary_bytes_never_raise(version: int, data: bytes) -> None:
    conn = connected(version, max_packet_size=128)
    conn.receive_data(data)
    conn.receive_data(b"")
    events = conn.events(0.0)
    assert conn.state is ConnectionState.CLOSED or not events or events[-1] is not None
    conn.data_to_send()


@given(st.binary(max_size=200))
def test_arbitrary_bytes_before_connect_never_raise(data: bytes) -> None:
    conn = ServerConnection(max_packet_size=128)
    conn.receive_data(data)
    conn.events(0.0)
    conn.data_to_send()
