"""Encoding and decoding one MQTT control packet, 3.1.1 or 5.0.

:func:`encode_packet` makes a whole packet (fixed header included) of a
packet value; :func:`decode_packet` makes a packet value of a fixed
header's first byte and the body the framer (:mod:`._framing`) cut.
Decoding raises only :class:`MQTTProtocolError` (0x81 Malformed Packet for
bytes that do not parse, 0x82 Protocol Error for a parsed value MQTT
forbids); encoding refuses a value it cannot send with
:class:`MQTTUsageError`.
"""

from __future__ import annotations

from ._codes import (
    MQTT_3_1_1,
    MQTT_5,
    REASONS_ALLOWED,
    V3_CONNACK_CODES,
    PacketType,
    ReasonCode,
    v3_connack_code,
)
from ._errors import MQTTProtocolError, MQTTUsageError
from ._packets import (
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    PingReq,
    PingResp,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    Subscription,
    UnsubAck,
    Unsubscribe,
    Will,
)
from ._properties import (
    NO_PROPERTIES,
    WILL,
    Properties,
    decode_properties,
    encode_properties,
)
from ._wire import Reader, binary, malformed, string, u16, varint

__all__ = ["PACKET_TYPES", "connect_protocol_level", "decode_packet", "encode_packet"]

T = PacketType
#: The packet type of each packet class.
PACKET_TYPES: dict[type[Packet], PacketType] = {
    Connect: T.CONNECT,
    ConnAck: T.CONNACK,
    Publish: T.PUBLISH,
    PubAck: T.PUBACK,
    PubRec: T.PUBREC,
    PubRel: T.PUBREL,
    PubComp: T.PUBCOMP,
    Subscribe: T.SUBSCRIBE,
    SubAck: T.SUBACK,
    Unsubscribe: T.UNSUBSCRIBE,
    UnsubAck: T.UNSUBACK,
    PingReq: T.PINGREQ,
    PingResp: T.PINGRESP,
    Disconnect: T.DISCONNECT,
    Auth: T.AUTH,
}
_ACK_CLASSES: dict[PacketType, type[PubAck | PubRec | PubRel | PubComp]] = {
    T.PUBACK: PubAck,
    T.PUBREC: PubRec,
    T.PUBREL: PubRel,
    T.PUBCOMP: PubComp,
}
#: The fixed header flags each packet type must have (PUBLISH's vary).
_FLAGS = {T.PUBREL: 0b0010, T.SUBSCRIBE: 0b0010, T.UNSUBSCRIBE: 0b0010}
_V3_SUBACK = frozenset({0x00, 0x01, 0x02, 0x80})


def _usage(message: str) -> MQTTUsageError:
    return MQTTUsageError(ReasonCode.PROTOCOL_ERROR, message)


def _check_version(version: int) -> None:
    if version not in (MQTT_3_1_1, MQTT_5):
        raise _usage(f"protocol version {version} is neither 4 (3.1.1) nor 5 (5.0)")


def _packet_id(packet_id: int | None) -> bytes:
    if packet_id is None or not 1 <= packet_id <= 0xFFFF:
        raise _usage(f"packet identifier {packet_id} is not 1-65535")
    return u16(packet_id)


def _reason(reason: ReasonCode, packet: PacketType) -> int:
    if reason not in REASONS_ALLOWED[packet]:
        raise _usage(f"{packet.name} may not carry reason {reason.name}")
    return int(reason)


def _qos(qos: int, what: str) -> int:
    if qos not in (0, 1, 2):
        raise _usage(f"{what} QoS {qos} is not 0, 1 or 2")
    return qos


def encode_packet(packet: Packet, version: int) -> bytes:
    """The whole packet ``packet`` for protocol ``version`` (4 or 5);
    fields that version lacks are left out (see :mod:`._packets`)."""
    _check_version(version)
    v5 = version == MQTT_5
    kind = PACKET_TYPES[type(packet)]
    flags = _FLAGS.get(kind, 0)
    body: bytes
    if isinstance(packet, Publish):
        body, flags = _encode_publish(packet, v5)
    elif isinstance(packet, PubAck | PubRec | PubRel | PubComp):
        body = _packet_id(packet.packet_id)
        if v5 and (packet.reason or packet.properties != NO_PROPERTIES):
            body += bytes((_reason(packet.reason, kind),))
            if packet.properties != NO_PROPERTIES:
                body += encode_properties(packet.properties, kind)
    elif isinstance(packet, Connect):
        body = _encode_connect(packet, version)
    elif isinstance(packet, ConnAck):
        reason = _reason(packet.reason, kind)
        if packet.session_present and packet.reason:
            raise _usage("a refusing CONNACK may not say a session is present")
        code = reason if v5 else v3_connack_code(packet.reason)
        body = bytes((int(packet.session_present), code))
        if v5:
            body += encode_properties(packet.properties, kind)
    elif isinstance(packet, Subscribe):
        body = _packet_id(packet.packet_id) + _props(packet.properties, kind, v5)
        if not packet.subscriptions:
            raise _usage("SUBSCRIBE needs at least one subscription")
        for sub in packet.subscriptions:
            body += string(sub.topic_filter) + bytes((_options(sub, v5),))
    elif isinstance(packet, SubAck):
        body = _packet_id(packet.packet_id) + _props(packet.properties, kind, v5)
        codes = [_reason(reason, kind) for reason in packet.reasons]
        body += bytes(code if v5 or code < 0x80 else 0x80 for code in codes)
    elif isinstance(packet, Unsubscribe):
        body = _packet_id(packet.packet_id) + _props(packet.properties, kind, v5)
        if not packet.topic_filters:
            raise _usage("UNSUBSCRIBE needs at least one topic filter")
        body += b"".join(string(topic_filter) for topic_filter in packet.topic_filters)
    elif isinstance(packet, UnsubAck):
        body = _packet_id(packet.packet_id)
        if v5:
            body += encode_properties(packet.properties, kind)
            body += bytes(_reason(reason, kind) for reason in packet.reasons)
    elif isinstance(packet, Disconnect | Auth):
        if kind is T.AUTH and not v5:
            raise _usage("MQTT 3.1.1 has no AUTH packet")
        body = b""
        if v5 and (packet.reason or packet.properties != NO_PROPERTIES):
            body = bytes((_reason(packet.reason, kind),))
            if packet.properties != NO_PROPERTIES:
                body += encode_properties(packet.properties, kind)
    else:  # PingReq, PingResp
        body = b""
    return bytes((kind << 4 | flags,)) + varint(len(body)) + body


def _props(props: Properties, kind: PacketType, v5: bool) -> bytes:
    return encode_properties(props, kind) if v5 else b""


def _encode_publish(packet: Publish, v5: bool) -> tuple[bytes, int]:
    qos = _qos(packet.qos, "PUBLISH")
    if qos == 0 and (packet.packet_id is not None or packet.dup):
        raise _usage("a QoS 0 PUBLISH has no packet identifier and no DUP")
    if not packet.topic and (not v5 or packet.properties.topic_alias is None):
        raise _usage("a PUBLISH needs a topic name (or, in 5.0, a topic alias)")
    body = string(packet.topic)
    if qos:
        body += _packet_id(packet.packet_id)
    body += _props(packet.properties, T.PUBLISH, v5) + packet.payload
    return body, packet.dup << 3 | qos << 1 | packet.retain


def _options(sub: Subscription, v5: bool) -> int:
    qos = _qos(sub.qos, "subscription")
    if not v5:
        return qos
    if sub.retain_handling not in (0, 1, 2):
        raise _usage(f"retain handling {sub.retain_handling} is not 0, 1 or 2")
    return qos | sub.no_local << 2 | sub.retain_as_published << 3 | sub.retain_handling << 4


def _encode_connect(packet: Connect, version: int) -> bytes:
    v5 = version == MQTT_5
    if packet.protocol_version != version:
        raise _usage(f"a CONNECT of version {packet.protocol_version} encoded as {version}")
    if not 0 <= packet.keepalive <= 0xFFFF:
        raise _usage(f"keepalive {packet.keepalive} is not 0-65535")
    if not v5 and packet.password is not None and packet.username is None:
        raise _usage("MQTT 3.1.1 allows a password only with a user name")
    flags = packet.clean_start << 1
    will = packet.will
    if will is not None:
        flags |= 0x04 | _qos(will.qos, "will") << 3 | will.retain << 5
    if packet.username is not None:
        flags |= 0x80
    if packet.password is not None:
        flags |= 0x40
    body = string("MQTT") + bytes((version, flags)) + u16(packet.keepalive)
    body += _props(packet.properties, T.CONNECT, v5) + string(packet.client_id)
    if will is not None:
        if v5:
            body += encode_properties(will.properties, WILL)
        body += string(will.topic) + binary(will.payload)
    if packet.username is not None:
        body += string(packet.username)
    if packet.password is not None:
        body += binary(packet.password)
    return body


# -- decoding ---------------------------------------------------------------


def connect_protocol_level(body: bytes) -> int | None:
    """The protocol level of a CONNECT ``body`` if its protocol name is
    "MQTT" (3.1.1 and 5.0) or "MQIsdp" (3.1), else ``None``: what a server
    needs to know how to refuse a CONNECT it cannot decode."""
    reader = Reader(body)
    try:
        name = reader.string("the protocol name")
        level = reader.u8("the protocol level")
    except MQTTProtocolError:
        return None
    return level if name in ("MQTT", "MQIsdp") else None


def _id(reader: Reader) -> int:
    packet_id = reader.u16("the packet identifier")
    if not packet_id:
        raise malformed("packet identifier 0")
    return packet_id


def _read_reason(reader: Reader, packet: PacketType) -> ReasonCode:
    code = reader.u8("the reason code")
    try:
        reason = ReasonCode(code)
    except ValueError:
        raise malformed(f"0x{code:02X} is no reason code") from None
    if reason not in REASONS_ALLOWED[packet]:
        raise MQTTProtocolError(
            ReasonCode.PROTOCOL_ERROR, f"{packet.name} may not carry reason {reason.name}"
        )
    return reason


def decode_packet(first: int, body: bytes, version: int) -> Packet:
    """The packet of fixed-header byte ``first`` and ``body`` (the bytes
    after the remaining length), as protocol ``version`` reads it; a CONNECT
    is read as its own protocol level says."""
    try:
        kind = PacketType(first >> 4)
    except ValueError:
        raise malformed("packet type 0 is reserved") from None
    flags = first & 0x0F
    v5 = version == MQTT_5
    if kind is not T.PUBLISH and flags != _FLAGS.get(kind, 0):
        raise malformed(f"{kind.name} has reserved flags 0x{flags:X}")
    if kind is T.AUTH and not v5:
        raise malformed("packet type 15 is reserved in MQTT 3.1.1")
    reader = Reader(body)
    packet: Packet
    if kind is T.PUBLISH:
        packet = _decode_publish(reader, flags, v5)
    elif kind in _ACK_CLASSES:
        packet_id = _id(reader)
        reason = ReasonCode.SUCCESS
        props = NO_PROPERTIES
        if v5 and reader.remaining:
            reason = _read_reason(reader, kind)
            if reader.remaining:
                props = decode_properties(reader, kind)
        packet = _ACK_CLASSES[kind](packet_id, reason, props)
    elif kind is T.CONNECT:
        packet = _decode_connect(reader)
    elif kind is T.CONNACK:
        packet = _decode_connack(reader, v5)
    elif kind is T.SUBSCRIBE:
        packet = _decode_subscribe(reader, v5)
    elif kind is T.SUBACK:
        packet_id = _id(reader)
        props = decode_properties(reader, kind) if v5 else NO_PROPERTIES
        if not v5 and not _V3_SUBACK.issuperset(body[reader.pos :]):
            raise malformed("a SUBACK return code is not 0, 1, 2 or 0x80")
        reasons = tuple(_read_reason(reader, kind) for _ in range(reader.remaining))
        packet = SubAck(packet_id, reasons, props)
    elif kind is T.UNSUBSCRIBE:
        packet_id = _id(reader)
        props = decode_properties(reader, kind) if v5 else NO_PROPERTIES
        filters: list[str] = []
        while reader.remaining:
            filters.append(reader.string("a topic filter"))
        if not filters:
            raise MQTTProtocolError(ReasonCode.PROTOCOL_ERROR, "UNSUBSCRIBE without a filter")
        packet = Unsubscribe(packet_id, tuple(filters), props)
    elif kind is T.UNSUBACK:
        packet_id = _id(reader)
        if v5:
            props = decode_properties(reader, kind)
            reasons = tuple(_read_reason(reader, kind) for _ in range(reader.remaining))
            packet = UnsubAck(packet_id, reasons, props)
        else:
            packet = UnsubAck(packet_id)
    elif kind is T.PINGREQ:
        packet = PingReq()
    elif kind is T.PINGRESP:
        packet = PingResp()
    else:  # DISCONNECT, AUTH
        reason = ReasonCode.SUCCESS
        props = NO_PROPERTIES
        if v5 and reader.remaining:
            reason = _read_reason(reader, kind)
            if reader.remaining:
                props = decode_properties(reader, kind)
        packet = Disconnect(reason, props) if kind is T.DISCONNECT else Auth(reason, props)
    if reader.remaining:
        raise malformed(f"{kind.name} has {reader.remaining} bytes after its end")
    return packet


def _decode_publish(reader: Reader, flags: int, v5: bool) -> Publish:
    qos = flags >> 1 & 0b11
    dup = bool(flags & 0b1000)
    if qos == 3:
        raise malformed("PUBLISH with QoS 3")
    if qos == 0 and dup:
        raise malformed("a QoS 0 PUBLISH with DUP set")
    topic = reader.string("the topic name")
    packet_id = _id(reader) if qos else None
    props = decode_properties(reader, T.PUBLISH) if v5 else NO_PROPERTIES
    return Publish(topic, reader.rest(), qos, bool(flags & 1), dup, packet_id, props)


def _decode_connack(reader: Reader, v5: bool) -> ConnAck:
    ack_flags = reader.u8("the acknowledge flags")
    if ack_flags & 0xFE:
        raise malformed("CONNACK has reserved flags set")
    if v5:
        reason = _read_reason(reader, T.CONNACK)
        props = decode_properties(reader, T.CONNACK)
    else:
        code = reader.u8("the return code")
        if code not in V3_CONNACK_CODES:
            raise malformed(f"CONNACK return code {code} is not 0-5")
        reason, props = V3_CONNACK_CODES[code], NO_PROPERTIES
    return ConnAck(reason, bool(ack_flags & 1), props)


def _decode_subscribe(reader: Reader, v5: bool) -> Subscribe:
    packet_id = _id(reader)
    props = decode_properties(reader, T.SUBSCRIBE) if v5 else NO_PROPERTIES
    subs: list[Subscription] = []
    while reader.remaining:
        topic_filter = reader.string("a topic filter")
        options = reader.u8("the subscription options")
        if options & (0xC0 if v5 else 0xFC):
            raise malformed("subscription options have reserved bits set")
        qos = options & 0b11
        if qos == 3:
            raise malformed("subscription with QoS 3")
        handling = options >> 4 & 0b11
        if handling == 3:
            raise MQTTProtocolError(ReasonCode.PROTOCOL_ERROR, "retain handling 3")
        subs.append(Subscription(topic_filter, qos, bool(options & 4), bool(options & 8), handling))
    if not subs:
        raise MQTTProtocolError(ReasonCode.PROTOCOL_ERROR, "SUBSCRIBE without a subscription")
    return Subscribe(packet_id, tuple(subs), props)


def _decode_connect(reader: Reader) -> Connect:
    name = reader.string("the protocol name")
    level = reader.u8("the protocol level")
    if name != "MQTT" or level not in (MQTT_3_1_1, MQTT_5):
        raise MQTTProtocolError(
            ReasonCode.UNSUPPORTED_PROTOCOL_VERSION,
            "only MQTT 3.1.1 (level 4) and 5.0 (level 5) are supported",
        )
    v5 = level == MQTT_5
    flags = reader.u8("the connect flags")
    if flags & 1:
        raise malformed("the connect flags' reserved bit is set")
    will_flag = bool(flags & 0x04)
    will_qos = flags >> 3 & 0b11
    will_retain = bool(flags & 0x20)
    if will_qos == 3:
        raise malformed("will QoS 3")
    if not will_flag and (will_qos or will_retain):
        raise malformed("will QoS or retain set without a will")
    has_user, has_password = bool(flags & 0x80), bool(flags & 0x40)
    if not v5 and has_password and not has_user:
        raise malformed("a password without a user name (MQTT 3.1.1)")
    keepalive = reader.u16("the keepalive")
    props = decode_properties(reader, T.CONNECT) if v5 else NO_PROPERTIES
    client_id = reader.string("the client identifier")
    will = None
    if will_flag:
        will_props = decode_properties(reader, WILL) if v5 else NO_PROPERTIES
        topic = reader.string("the will topic")
        payload = reader.binary("the will payload")
        will = Will(topic, payload, will_qos, will_retain, will_props)
    username = reader.string("the user name") if has_user else None
    password = reader.binary("the password") if has_password else None
    return Connect(client_id, level, bool(flags & 0x02), keepalive, username, password, will, props)
