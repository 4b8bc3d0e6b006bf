"""A minimal MQTT 3.1.1 codec, sans-IO: just what the benchmarks' clients
need (CONNECT/CONNACK, SUBSCRIBE/SUBACK, PUBLISH at QoS 0, 1 and 2, PUBACK,
the QoS 2 exchange PUBREC/PUBREL/PUBCOMP, DISCONNECT), and a streaming
reader that turns bytes, however they were split into reads, into whole
packets.

Encoders build packets as the MQTT 3.1.1 specification lays them out
(section 2: a fixed header of the type and flags, the remaining length in
one to four bytes, then the variable header and payload); decoders refuse
what they cannot read with :class:`MqttError`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

CONNECT = 1
CONNACK = 2
PUBLISH = 3
PUBACK = 4
PUBREC = 5
PUBREL = 6
PUBCOMP = 7
SUBSCRIBE = 8
SUBACK = 9
DISCONNECT = 14

#: The largest remaining length four bytes can say (MQTT 3.1.1, 2.2.3).
MAX_REMAINING_LENGTH = 268_435_455

_U16 = struct.Struct(">H")


class MqttError(ValueError):
    """Bytes that are not the MQTT this codec reads."""


@dataclass(frozen=True, slots=True)
class Packet:
    """One control packet: its type (1-15), the fixed header's four flag
    bits and what follows the remaining length."""

    type: int
    flags: int
    body: bytes


@dataclass(frozen=True, slots=True)
class Publish:
    topic: str
    payload: bytes
    qos: int
    #: 0 at QoS 0 (a QoS 0 PUBLISH has no packet identifier).
    packet_id: int


def encode_remaining_length(length: int) -> bytes:
    """``length`` as MQTT's variable-length integer: seven bits a byte,
    least significant first, the top bit set on every byte but the last."""
    if not 0 <= length <= MAX_REMAINING_LENGTH:
        raise MqttError(f"remaining length {length} out of range")
    out = bytearray()
    while True:
        byte, length = length & 0x7F, length >> 7
        out.append(byte | 0x80 if length else byte)
        if not length:
            return bytes(out)


def decode_remaining_length(data: bytes | bytearray, start: int) -> tuple[int, int] | None:
    """The remaining length that starts at ``data[start]`` and the index just
    after it, or None if ``data`` ends before it does."""
    value = 0
    for shift in range(4):
        if start + shift >= len(data):
            return None
        byte = data[start + shift]
        value |= (byte & 0x7F) << (7 * shift)
        if not byte & 0x80:
            return value, start + shift + 1
    raise MqttError("remaining length longer than four bytes")


def _packet(type_: int, flags: int, body: bytes) -> bytes:
    return bytes([type_ << 4 | flags]) + encode_remaining_length(len(body)) + body


def _string(text: str) -> bytes:
    raw = text.encode()
    if len(raw) > 0xFFFF:
        raise MqttError("string longer than 65,535 bytes")
    return _U16.pack(len(raw)) + raw


def connect(client_id: str, keepalive: int = 60, clean_session: bool = True) -> bytes:
    """CONNECT for protocol level 4 (3.1.1), no will, user name or password."""
    flags = 0x02 if clean_session else 0
    header = _string("MQTT") + bytes([4, flags]) + _U16.pack(keepalive)
    return _packet(CONNECT, 0, header + _string(client_id))


def subscribe(packet_id: int, topic: str, qos: int) -> bytes:
    """SUBSCRIBE to one topic filter at ``qos`` (its fixed flags are 0b0010)."""
    return _packet(SUBSCRIBE, 0x2, _U16.pack(packet_id) + _string(topic) + bytes([qos]))


def publish(
    topic: str, payload: bytes, qos: int = 0, packet_id: int = 0, *, dup: bool = False
) -> bytes:
    """PUBLISH, not retained; ``packet_id`` (1-65535) only at QoS 1 or 2;
    ``dup``: a resend of one sent before (QoS 1 or 2)."""
    if qos not in (0, 1, 2):
        raise MqttError(f"QoS {qos}")
    ident = _U16.pack(packet_id) if qos else b""
    flags = qos << 1 | (0x8 if dup and qos else 0)
    return _packet(PUBLISH, flags, _string(topic) + ident + payload)


def publish_prefix(topic: str, payload_size: int, qos: int) -> bytes:
    """What every PUBLISH of ``payload_size`` bytes to ``topic`` at ``qos``
    starts with (fixed header, topic name): :func:`publish` is this, the
    packet identifier (at QoS 1 or 2) and the payload."""
    if qos not in (0, 1, 2):
        raise MqttError(f"QoS {qos}")
    name = _string(topic)
    length = len(name) + (2 if qos else 0) + payload_size
    return bytes([PUBLISH << 4 | qos << 1]) + encode_remaining_length(length) + name


def packet_id_bytes(packet_id: int) -> bytes:
    """A packet identifier as it is on the wire."""
    return _U16.pack(packet_id)


def puback(packet_id: int) -> bytes:
    return _packet(PUBACK, 0, _U16.pack(packet_id))


def pubrec(packet_id: int) -> bytes:
    return _packet(PUBREC, 0, _U16.pack(packet_id))


def pubrel(packet_id: int) -> bytes:
    """PUBREL (its fixed flags are 0b0010)."""
    return _packet(PUBREL, 0x2, _U16.pack(packet_id))


def pubcomp(packet_id: int) -> bytes:
    return _packet(PUBCOMP, 0, _U16.pack(packet_id))


def disconnect() -> bytes:
    return _packet(DISCONNECT, 0, b"")


def parse_publish(packet: Packet) -> Publish:
    """A PUBLISH packet's topic, payload, QoS and packet identifier."""
    if packet.type != PUBLISH:
        raise MqttError(f"packet type {packet.type} is not PUBLISH")
    qos = (packet.flags >> 1) & 0x3
    if qos == 3:
        raise MqttError("PUBLISH with QoS 3")
    body = packet.body
    if len(body) < 2:
        raise MqttError("PUBLISH too short for its topic")
    (length,) = _U16.unpack_from(body)
    start = 2 + length + (2 if qos else 0)
    if len(body) < start:
        raise MqttError("PUBLISH too short for its topic and packet identifier")
    topic = body[2 : 2 + length].decode()
    packet_id = _U16.unpack_from(body, 2 + length)[0] if qos else 0
    return Publish(topic, body[start:], qos, packet_id)


def parse_connack(packet: Packet) -> int:
    """A CONNACK's return code (0: accepted)."""
    if packet.type != CONNACK or len(packet.body) != 2:
        raise MqttError(f"expected CONNACK, got packet type {packet.type}")
    return packet.body[1]


def session_present(packet: Packet) -> bool:
    """Whether a CONNACK says the server kept a session for the client."""
    parse_connack(packet)
    return bool(packet.body[0] & 0x01)


def parse_suback(packet: Packet) -> tuple[int, list[int]]:
    """A SUBACK's packet identifier and return codes (granted QoS, or 0x80)."""
    if packet.type != SUBACK or len(packet.body) < 3:
        raise MqttError(f"expected SUBACK, got packet type {packet.type}")
    return _U16.unpack_from(packet.body)[0], list(packet.body[2:])


def parse_puback(packet: Packet) -> int:
    """A PUBACK's packet identifier."""
    return parse_ack(packet, PUBACK)


def parse_ack(packet: Packet, type_: int) -> int:
    """The packet identifier of an acknowledgement of type ``type_``
    (PUBACK, PUBREC, PUBREL, PUBCOMP: 3.1.1's two-byte body, or a 5.0
    one with a reason code and properties after it)."""
    if packet.type != type_ or len(packet.body) < 2:
        names = {PUBACK: "PUBACK", PUBREC: "PUBREC", PUBREL: "PUBREL", PUBCOMP: "PUBCOMP"}
        raise MqttError(f"expected {names.get(type_, type_)}, got packet type {packet.type}")
    packet_id: int = _U16.unpack_from(packet.body)[0]
    return packet_id


class PacketReader:
    """Whole packets out of a byte stream: :meth:`feed` takes what one read
    returned and gives back every packet it completed (none, one or many);
    a packet's bytes may arrive over any number of reads."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[Packet]:
        buffer = self._buffer
        buffer += data
        packets: list[Packet] = []
        start = 0
        while len(buffer) - start >= 2:
            decoded = decode_remaining_length(buffer, start + 1)
            if decoded is None:
                break
            length, body_start = decoded
            end = body_start + length
            if end > len(buffer):
                break
            first = buffer[start]
            packets.append(Packet(first >> 4, first & 0x0F, bytes(buffer[body_start:end])))
            start = end
        del buffer[:start]
        return packets

    def pending(self) -> int:
        """How many bytes wait for the rest of their packet."""
        return len(self._buffer)
