"""The connection's direct ways through the usual packets (a PUBLISH to a
topic name seen before, a plain PUBACK; a PUBLISH and a PUBACK written
without the general encoder) agree with the general codec: for any bytes,
the same events, the same answers and the same state."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.mqtt import (
    MQTT_3_1_1,
    MQTT_5,
    NO_PROPERTIES,
    Connect,
    MQTTUsageError,
    PacketTooLargeForPeer,
    Properties,
    PubAck,
    Publish,
    ServerConnection,
    encode_packet,
)

from .strategies import texts

versions = st.sampled_from([MQTT_3_1_1, MQTT_5])
#: Topic names (no wildcards), a few of them, so that some repeat.
topic_names = st.sampled_from(["a", "a/b", "é/ü", "x" * 200]) | texts.filter(
    lambda name: bool(name) and "+" not in name and "#" not in name
)
payloads = st.binary(max_size=40) | st.sampled_from([b"p" * 127, b"p" * 128, b"p" * 20_000])


def connected(
    version: int, properties: Properties = NO_PROPERTIES, **options: int
) -> ServerConnection:
    conn = ServerConnection(**options)  # type: ignore[arg-type]
    conn.receive_data(encode_packet(Connect("c", version, keepalive=10), version))
    assert isinstance(conn.next_event(0.0), Connect)
    conn.connack(properties=properties)
    conn.data_to_send()
    return conn


def state(conn: ServerConnection) -> tuple[object, ...]:
    return (
        conn.state,
        conn.session_state(),
        conn.send_quota,
        conn.keepalive_deadline(),
        sorted(conn._in_qos1),
        sorted(conn._in_qos2_new),
    )


def pair(
    version: int, topics: list[str], limits: Properties, receive_maximum: int
) -> tuple[ServerConnection, ServerConnection]:
    """Two connections (CONNACK ``limits``, 5.0 only) that received the
    same QoS 0 PUBLISHes to ``topics``: the first remembers those names,
    the second forgot them (so it reads everything the general way)."""
    if version != MQTT_5:
        limits = NO_PROPERTIES
    options = {"max_packet_size": 1024, "receive_maximum": receive_maximum}
    conns = connected(version, limits, **options), connected(version, limits, **options)
    for conn in conns:
        for topic in topics:
            conn.receive_data(encode_packet(Publish(topic, b"seen"), version))
        assert len(conn.events(1.0)) == len(topics)
    conns[1]._names_in.clear()
    conns[1]._names_out.clear()
    return conns


@st.composite
def publishes(draw: st.DrawFn, version: int) -> bytes:
    """A PUBLISH's bytes: well formed, or with its flags, topic length or
    properties length garbled."""
    qos = draw(st.integers(0, 2))
    packet = Publish(
        draw(topic_names),
        draw(payloads),
        qos,
        draw(st.booleans()),
        draw(st.booleans()) if qos else False,
        draw(st.integers(1, 3)) if qos else None,
        NO_PROPERTIES,
    )
    data = bytearray(encode_packet(packet, version))
    if draw(st.booleans()):
        index = draw(st.integers(0, len(data) - 1))
        data[index] = draw(st.integers(0, 255))
    return bytes(data)


@given(versions, st.data())
def test_publishes_read_alike_with_and_without_known_names(
    version: int, data: st.DataObject
) -> None:
    known = data.draw(st.lists(topic_names, max_size=3))
    limits = Properties(
        maximum_qos=data.draw(st.sampled_from([None, 0, 1])),
        retain_available=data.draw(st.sampled_from([None, 0])),
    )
    fast, general = pair(version, known, limits, data.draw(st.sampled_from([2, 65_535])))
    chunks = data.draw(st.lists(publishes(version), min_size=1, max_size=6))
    chunks += data.draw(st.lists(st.binary(max_size=30), max_size=2))
    for conn in (fast, general):
        for chunk in chunks:
            conn.receive_data(chunk)
    assert fast.events(2.0) == general.events(2.0)
    assert fast.data_to_send() == general.data_to_send()
    assert state(fast) == state(general)


@given(versions, st.lists(st.integers(0, 5), min_size=1, max_size=8), st.binary(max_size=6))
def test_pubacks_read_alike_with_and_without_the_direct_way(
    version: int, ids: list[int], garbage: bytes
) -> None:
    conns = connected(version), connected(version)
    for conn in conns:
        for _ in range(3):
            conn.publish("t", b"x", 1)
        conn.data_to_send()
    fast, general = conns
    for packet_id in ids:
        fast.receive_data(bytes((0x40, 2, 0, packet_id)))
        # (The same PUBACK with the 5.0 reason byte: the general way, same meaning.)
        v5 = version == MQTT_5
        general.receive_data(bytes((0x40, 3, 0, packet_id, 0) if v5 else (0x40, 2, 0, packet_id)))
    fast_events = [e for e in fast.events(0.0) if isinstance(e, PubAck)]
    general_events = [e for e in general.events(0.0) if isinstance(e, PubAck)]
    assert fast_events == general_events
    before_zero = ids[: ids.index(0)] if 0 in ids else ids  # (packet id 0 is malformed)
    assert fast_events == [PubAck(i) for i in dict.fromkeys(before_zero) if 1 <= i <= 3]
    assert state(fast) == state(general)
    for conn in conns:
        conn.receive_data(garbage)
    assert fast.events(0.0) == general.events(0.0)


@given(versions, topic_names, payloads, st.integers(0, 2), st.booleans())
def test_a_publish_is_written_as_the_encoder_writes_it(
    version: int, topic: str, payload: bytes, qos: int, retain: bool
) -> None:
    conn = connected(version)
    for _ in range(2):  # (the second time from the remembered name)
        packet_id = conn.publish(topic, payload, qos, retain=retain)
        expected = Publish(topic, payload, qos, retain, False, packet_id, NO_PROPERTIES)
        assert conn.data_to_send() == encode_packet(expected, version)
    if qos:
        assert packet_id is not None
        assert conn.publish(topic, payload, qos, retain=retain, packet_id=packet_id) == packet_id
        resent = Publish(topic, payload, qos, retain, True, packet_id, NO_PROPERTIES)
        assert conn.data_to_send() == encode_packet(resent, version)


@pytest.mark.parametrize("version", [MQTT_3_1_1, MQTT_5])
def test_the_direct_way_keeps_the_checks(version: int) -> None:
    conn = connected(version)
    with pytest.raises(MQTTUsageError):
        conn.publish("a/+", b"x")
    conn.publish("a", b"x")
    with pytest.raises(MQTTUsageError):
        conn.publish("a", b"x", 3)
    small = ServerConnection()
    props = Properties(maximum_packet_size=64) if version == MQTT_5 else NO_PROPERTIES
    small.receive_data(encode_packet(Connect("c", version, properties=props), version))
    small.next_event(0.0)
    small.connack()
    small.data_to_send()
    if version == MQTT_5:
        with pytest.raises(PacketTooLargeForPeer):
            small.publish("a", b"x" * 100, 1)
        assert small.send_quota == 65_535  # (nothing was taken)
        assert small.data_to_send() == b""


@pytest.mark.parametrize("version", [MQTT_3_1_1, MQTT_5])
def test_a_puback_is_written_as_the_encoder_writes_it(version: int) -> None:
    conn = connected(version)
    for packet_id in (1, 300):
        conn.receive_data(encode_packet(Publish("t", b"x", 1, packet_id=packet_id), version))
    assert len(conn.events(0.0)) == 2
    conn.puback(1)
    conn.puback(300)
    assert conn.data_to_send() == encode_packet(PubAck(1), version) + encode_packet(
        PubAck(300), version
    )


@pytest.mark.parametrize("version", [MQTT_3_1_1, MQTT_5])
def test_the_server_keeps_at_most_send_maximum_in_flight(version: int) -> None:
    """A 3.1.1 client has no Receive Maximum: ``send_maximum`` bounds the
    PUBLISHes in flight to it all the same, and new packet ids cycle
    through 1 to four times it."""
    conn = connected(version, send_maximum=4)
    ids = [conn.publish("t", b"x", 1) for _ in range(4)]
    assert ids == [1, 2, 3, 4] and conn.send_quota == 0
    with pytest.raises(MQTTUsageError):
        conn.publish("t", b"x", 1)
    in_flight = list(ids)
    for _ in range(40):  # acknowledge the oldest, send one more
        oldest = in_flight.pop(0)
        conn.receive_data(encode_packet(PubAck(oldest), version))
        assert conn.events(0.0) == [PubAck(oldest)]
        packet_id = conn.publish("t", b"x", 1)
        assert packet_id is not None and packet_id not in in_flight
        in_flight.append(packet_id)
        assert conn.send_quota == 0
    assert max(ids + in_flight) <= 16 and len(set(in_flight)) == 4
