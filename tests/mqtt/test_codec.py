"""The MQTT codec and framer: every packet type round-trips in both
versions, bytes split anywhere frame the same, and no input makes them
raise anything but MQTTProtocolError with its reason code."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.mqtt import (
    MQTT_3_1_1,
    MQTT_5,
    ConnAck,
    Connect,
    Framer,
    MQTTProtocolError,
    MQTTUsageError,
    Packet,
    Properties,
    PubAck,
    Publish,
    ReasonCode,
    SubAck,
    decode_packet,
    encode_packet,
)
from broker.mqtt._wire import Reader, varint

from .strategies import packets

VERSIONS = st.sampled_from([MQTT_3_1_1, MQTT_5])


def _frame(data: bytes, version: int, max_packet_size: int = 1 << 20) -> list[Packet]:
    framer = Framer(max_packet_size)
    framer.feed(data)
    out = []
    while (frame := framer.next_packet()) is not None:
        out.append(decode_packet(*frame, version))
    assert framer.buffered == 0
    return out


@given(st.data())
def test_every_packet_round_trips(data: st.DataObject) -> None:
    version = data.draw(VERSIONS)
    packet = data.draw(packets(version))
    assert _frame(encode_packet(packet, version), version) == [packet]


@given(st.data())
def test_bytes_split_anywhere_frame_the_same(data: st.DataObject) -> None:
    version = data.draw(VERSIONS)
    sent = data.draw(st.lists(packets(version), min_size=1, max_size=5))
    stream = b"".join(encode_packet(packet, version) for packet in sent)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=8)))
    framer = Framer()
    received = []
    for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        framer.feed(stream[start:end])
        while (frame := framer.next_packet()) is not None:
            received.append(decode_packet(*frame, version))
    assert received == sent


@given(VERSIONS, st.binary(max_size=300))
def test_arbitrary_bytes_raise_only_the_protocol_error(version: int, data: bytes) -> None:
    framer = Framer(200)
    framer.feed(data)
    try:
        while (frame := framer.next_packet()) is not None:
            decode_packet(*frame, version)
    except MQTTProtocolError as error:
        assert error.reason in (0x81, 0x82, 0x84, 0x95)
        assert "\n" not in error.message


@given(st.data())
def test_corrupted_packets_raise_only_the_protocol_error(data: st.DataObject) -> None:
    version = data.draw(VERSIONS)
    raw = bytearray(encode_packet(data.draw(packets(version)), version))
    for _ in range(data.draw(st.integers(1, 3))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    try:
        _frame(bytes(raw) + b"\xc0\x00", version)
    except MQTTProtocolError as error:
        assert error.reason in (0x81, 0x82, 0x84, 0x95)
    except AssertionError:
        pass  # the corrupted length left bytes buffered: a partial packet


@pytest.mark.parametrize("value", [0, 127, 128, 16_383, 16_384, 2_097_151, 2_097_152, 268_435_455])
def test_variable_byte_integers_at_their_boundaries(value: int) -> None:
    encoded = varint(value)
    assert len(encoded) == (value >= 128) + (value >= 16_384) + (value >= 2_097_152) + 1
    assert Reader(encoded).varint() == value


def test_a_remaining_length_of_five_bytes_is_malformed() -> None:
    framer = Framer()
    framer.feed(b"\x30\xff\xff\xff\xff\x01")
    with pytest.raises(MQTTProtocolError) as caught:
        framer.next_packet()
    assert caught.value.reason is ReasonCode.MALFORMED_PACKET


def test_a_packet_over_the_maximum_is_refused_before_its_body() -> None:
    framer = Framer(100)
    framer.feed(b"\x30\x62")  # 2 + 98 = 100 bytes: allowed, waits for the body
    assert framer.next_packet() is None
    framer = Framer(100)
    framer.feed(b"\x30\x63")  # 101 bytes
    with pytest.raises(MQTTProtocolError) as caught:
        framer.next_packet()
    assert caught.value.reason is ReasonCode.PACKET_TOO_LARGE


@pytest.mark.parametrize(
    ("topic", "why"),
    [(b"a\x00b", "U+0000"), (b"\xed\xa0\x80", "surrogate"), (b"\xff", "not UTF-8")],
)
def test_bad_strings_are_malformed(topic: bytes, why: str) -> None:
    body = len(topic).to_bytes(2, "big") + topic + b"payload"
    with pytest.raises(MQTTProtocolError) as caught:
        decode_packet(0x30, body, MQTT_5)
    assert caught.value.reason is ReasonCode.MALFORMED_PACKET, why


def test_property_faults_have_their_reason_codes() -> None:
    def publish_with(props: bytes) -> bytes:
        return b"\x00\x01t" + varint(len(props)) + props

    twice = b"\x02\x00\x00\x00\x01" * 2  # message expiry interval twice
    with pytest.raises(MQTTProtocolError) as caught:
        decode_packet(0x30, publish_with(twice), MQTT_5)
    assert caught.value.reason is ReasonCode.PROTOCOL_ERROR
    wrong = b"\x21\x00\x05"  # receive maximum in a PUBLISH
    with pytest.raises(MQTTProtocolError) as caught:
        decode_packet(0x30, publish_with(wrong), MQTT_5)
    assert caught.value.reason is ReasonCode.MALFORMED_PACKET
    unknown = b"\x7f\x00"
    with pytest.raises(MQTTProtocolError) as caught:
        decode_packet(0x30, publish_with(unknown), MQTT_5)
    assert caught.value.reason is ReasonCode.MALFORMED_PACKET
    flag = b"\x01\x02"  # payload format indicator 2
    with pytest.raises(MQTTProtocolError) as caught:
        decode_packet(0x30, publish_with(flag), MQTT_5)
    assert caught.value.reason is ReasonCode.PROTOCOL_ERROR
    # Two user properties with the same name are fine and keep their order.
    pairs = b"\x26\x00\x01k\x00\x01a\x26\x00\x01k\x00\x01b"
    packet = decode_packet(0x30, publish_with(pairs), MQTT_5)
    assert isinstance(packet, Publish)
    assert packet.properties.user_properties == (("k", "a"), ("k", "b"))


def test_reserved_flags_and_qos_3_are_malformed() -> None:
    for first, body in [(0x36, b"\x00\x01t\x00\x01"), (0x80, b"\x00\x01\x00\x01a\x00")]:
        with pytest.raises(MQTTProtocolError) as caught:
            decode_packet(first, body, MQTT_3_1_1)
        assert caught.value.reason is ReasonCode.MALFORMED_PACKET
    with pytest.raises(MQTTProtocolError):
        decode_packet(0xF0, b"", MQTT_3_1_1)  # AUTH does not exist in 3.1.1


def test_version_3_1_1_connack_and_suback_codes() -> None:
    refused = encode_packet(ConnAck(ReasonCode.BAD_USER_NAME_OR_PASSWORD), MQTT_3_1_1)
    assert refused == b"\x20\x02\x00\x04"
    busy = encode_packet(ConnAck(ReasonCode.SERVER_BUSY), MQTT_3_1_1)
    assert busy == b"\x20\x02\x00\x03"
    suback = SubAck(1, (ReasonCode.GRANTED_QOS_1, ReasonCode.TOPIC_FILTER_INVALID))
    assert encode_packet(suback, MQTT_3_1_1) == b"\x90\x04\x00\x01\x01\x80"


def test_version_5_acks_use_their_short_forms() -> None:
    assert encode_packet(PubAck(7), MQTT_5) == b"\x40\x02\x00\x07"
    no_match = PubAck(7, ReasonCode.NO_MATCHING_SUBSCRIBERS)
    assert encode_packet(no_match, MQTT_5) == b"\x40\x03\x00\x07\x10"


def test_encoding_refuses_what_mqtt_forbids() -> None:
    with pytest.raises(MQTTUsageError):
        encode_packet(Publish("t", b"", 1), MQTT_5)  # QoS 1 without a packet id
    with pytest.raises(MQTTUsageError):
        encode_packet(Publish("t", properties=Properties(receive_maximum=1)), MQTT_5)
    with pytest.raises(MQTTUsageError):
        encode_packet(PubAck(1, ReasonCode.GRANTED_QOS_2), MQTT_5)
    with pytest.raises(MQTTUsageError):
        encode_packet(Connect("c", MQTT_3_1_1, password=b"p"), MQTT_3_1_1)
