"""The peer benchmark's MQTT 3.1.1 codec (broker.bench._mqtt): the remaining
length at its byte boundaries, the packets the bench sends, and the
streaming reader over any split of the bytes."""

from __future__ import annotations

import pytest

from broker.bench import _mqtt as mqtt


@pytest.mark.parametrize(
    ("length", "encoded"),
    [
        (0, b"\x00"),
        (127, b"\x7f"),
        (128, b"\x80\x01"),
        (16_383, b"\xff\x7f"),
        (16_384, b"\x80\x80\x01"),
        (2_097_151, b"\xff\xff\x7f"),
        (2_097_152, b"\x80\x80\x80\x01"),
        (mqtt.MAX_REMAINING_LENGTH, b"\xff\xff\xff\x7f"),
    ],
)
def test_remaining_length_at_its_byte_boundaries(length: int, encoded: bytes) -> None:
    """The examples of MQTT 3.1.1 table 2.4, both ways."""
    assert mqtt.encode_remaining_length(length) == encoded
    assert mqtt.decode_remaining_length(b"\x30" + encoded + b"rest", 1) == (
        length,
        1 + len(encoded),
    )


def test_remaining_length_out_of_range_is_refused() -> None:
    with pytest.raises(mqtt.MqttError):
        mqtt.encode_remaining_length(mqtt.MAX_REMAINING_LENGTH + 1)
    with pytest.raises(mqtt.MqttError):
        mqtt.encode_remaining_length(-1)
    with pytest.raises(mqtt.MqttError, match="four bytes"):
        mqtt.decode_remaining_length(b"\xff\xff\xff\xff\x01", 0)


def test_an_unfinished_remaining_length_waits_for_more() -> None:
    assert mqtt.decode_remaining_length(b"\x30\x80", 1) is None
    assert mqtt.decode_remaining_length(b"\x30", 1) is None


def test_connect_is_laid_out_as_the_specification_says() -> None:
    packet = mqtt.connect("c1", keepalive=30)
    # Fixed header, "MQTT", level 4, clean session, keep-alive 30, client id.
    assert packet == b"\x10\x0e\x00\x04MQTT\x04\x02\x00\x1e\x00\x02c1"


def test_subscribe_and_its_fixed_flags() -> None:
    assert mqtt.subscribe(7, "a/b", 1) == b"\x82\x08\x00\x07\x00\x03a/b\x01"


@pytest.mark.parametrize("qos", [0, 1])
def test_publish_round_trips_through_the_reader(qos: int) -> None:
    payload = bytes(range(256)) * 3  # a body past 127 bytes: a two-byte length
    packet_id = 65_535 if qos else 0
    [packet] = mqtt.PacketReader().feed(mqtt.publish("lat", payload, qos, packet_id))
    assert (packet.type, packet.flags) == (mqtt.PUBLISH, qos << 1)
    assert mqtt.parse_publish(packet) == mqtt.Publish("lat", payload, qos, packet_id)


def test_a_publish_whose_body_is_16384_bytes_has_a_three_byte_length() -> None:
    topic = "t"
    payload = b"p" * (16_384 - 2 - len(topic))
    data = mqtt.publish(topic, payload)
    assert data[1:4] == b"\x80\x80\x01"
    assert len(data) == 1 + 3 + 16_384
    [packet] = mqtt.PacketReader().feed(data)
    assert mqtt.parse_publish(packet).payload == payload


def test_acks_parse() -> None:
    reader = mqtt.PacketReader()
    connack, suback, puback = reader.feed(
        b"\x20\x02\x00\x00" + b"\x90\x03\x00\x01\x01" + mqtt.puback(513)
    )
    assert mqtt.parse_connack(connack) == 0
    assert mqtt.parse_suback(suback) == (1, [1])
    assert mqtt.parse_puback(puback) == 513
    with pytest.raises(mqtt.MqttError, match="expected PUBACK"):
        mqtt.parse_puback(connack)


def test_a_packet_split_across_reads_comes_out_whole_once() -> None:
    data = mqtt.publish("lat", b"x" * 200, 1, 9)  # a two-byte remaining length
    for split in range(1, len(data)):
        reader = mqtt.PacketReader()
        assert reader.feed(data[:split]) == []
        assert reader.pending() == split
        [packet] = reader.feed(data[split:])
        assert mqtt.parse_publish(packet).packet_id == 9
        assert reader.pending() == 0


def test_a_packet_fed_a_byte_at_a_time() -> None:
    data = mqtt.publish("lat", b"y" * 20_000)  # a three-byte remaining length
    reader = mqtt.PacketReader()
    got = [packet for byte in data for packet in reader.feed(bytes([byte]))]
    assert [mqtt.parse_publish(p).payload for p in got] == [b"y" * 20_000]


def test_several_packets_in_one_read_and_a_partial_one_after() -> None:
    packets = [mqtt.publish("lat", bytes([n]) * n, n % 2, n + 1) for n in range(1, 6)]
    packets.append(mqtt.disconnect())
    tail = mqtt.puback(42)
    reader = mqtt.PacketReader()
    got = reader.feed(b"".join(packets) + tail[:3])
    assert [p.type for p in got] == [mqtt.PUBLISH] * 5 + [mqtt.DISCONNECT]
    assert [mqtt.parse_publish(p).payload for p in got[:5]] == [bytes([n]) * n for n in range(1, 6)]
    assert reader.pending() == 3
    [ack] = reader.feed(tail[3:])
    assert mqtt.parse_puback(ack) == 42


def test_a_malformed_publish_is_refused() -> None:
    with pytest.raises(mqtt.MqttError):
        mqtt.parse_publish(mqtt.Packet(mqtt.PUBLISH, 0x6, b"\x00\x01a"))  # QoS 3
    with pytest.raises(mqtt.MqttError):
        mqtt.parse_publish(mqtt.Packet(mqtt.PUBLISH, 0x2, b"\x00\x05ab"))  # short topic
    with pytest.raises(mqtt.MqttError):
        mqtt.publish("t", b"", qos=3)


@pytest.mark.parametrize("qos", [0, 1, 2])
def test_publish_prefix_is_where_publish_starts(qos: int) -> None:
    payload = b"z" * 300
    packet_id = 513 if qos else 0
    prefix = mqtt.publish_prefix("a/b", len(payload), qos)
    ident = mqtt.packet_id_bytes(packet_id) if qos else b""
    assert prefix + ident + payload == mqtt.publish("a/b", payload, qos, packet_id)


def test_the_qos_2_exchange_and_dup() -> None:
    """PUBREL's fixed flags are 0b0010 (MQTT 3.1.1, 3.6.1); DUP is bit 3."""
    assert mqtt.pubrec(7) == b"\x50\x02\x00\x07"
    assert mqtt.pubrel(7) == b"\x62\x02\x00\x07"
    assert mqtt.pubcomp(7) == b"\x70\x02\x00\x07"
    [resent] = mqtt.PacketReader().feed(mqtt.publish("t", b"x", 2, 9, dup=True))
    assert resent.flags == 0x8 | 2 << 1
    assert mqtt.parse_publish(resent) == mqtt.Publish("t", b"x", 2, 9)
    rec, rel, comp = mqtt.PacketReader().feed(mqtt.pubrec(1) + mqtt.pubrel(2) + mqtt.pubcomp(3))
    assert mqtt.parse_ack(rec, mqtt.PUBREC) == 1
    assert mqtt.parse_ack(rel, mqtt.PUBREL) == 2
    assert mqtt.parse_ack(comp, mqtt.PUBCOMP) == 3
    with pytest.raises(mqtt.MqttError, match="expected PUBCOMP"):
        mqtt.parse_ack(rec, mqtt.PUBCOMP)


def test_connack_session_present() -> None:
    kept, fresh = mqtt.PacketReader().feed(b"\x20\x02\x01\x00\x20\x02\x00\x00")
    assert mqtt.session_present(kept)
    assert not mqtt.session_present(fresh)
    assert mqtt.connect("c", clean_session=False)[9] == 0  # connect flags: no clean session
