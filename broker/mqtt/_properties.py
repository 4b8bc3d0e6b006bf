"""MQTT 5.0 properties (spec 2.2.2): their identifiers, types, the packets
that may carry each, their value rules, and their codec.

:class:`Properties` holds every property as a typed field (``None`` when
absent); the two that may repeat are tuples: ``user_properties`` (name,
value pairs, order kept) and ``subscription_identifiers``.

Received properties are refused with :class:`MQTTProtocolError`:

- 0x81 Malformed Packet: an unknown identifier, an identifier the packet may
  not carry, a property length that overruns its packet, a bad field;
- 0x82 Protocol Error: a property other than User Property (or Subscription
  Identifier in PUBLISH) given twice, or a value outside its range (a
  Receive Maximum or Maximum Packet Size of 0, a Subscription Identifier of
  0, a byte flag other than 0 or 1, a Maximum QoS other than 0 or 1).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from enum import Enum, IntEnum

from ._codes import PacketType, ReasonCode
from ._errors import MQTTProtocolError, MQTTUsageError
from ._wire import MAX_VARINT, Reader, binary, malformed, string, u16, u32, varint

__all__ = ["WILL", "Properties", "PropertyId", "decode_properties", "encode_properties"]

#: The context of a will's properties (in CONNECT's payload), where the
#: codec's functions take a packet type.
WILL = None


class PropertyId(IntEnum):
    """The property identifiers of MQTT 5.0, with the specification's names."""

    PAYLOAD_FORMAT_INDICATOR = 0x01
    MESSAGE_EXPIRY_INTERVAL = 0x02
    CONTENT_TYPE = 0x03
    RESPONSE_TOPIC = 0x08
    CORRELATION_DATA = 0x09
    SUBSCRIPTION_IDENTIFIER = 0x0B
    SESSION_EXPIRY_INTERVAL = 0x11
    ASSIGNED_CLIENT_IDENTIFIER = 0x12
    SERVER_KEEP_ALIVE = 0x13
    AUTHENTICATION_METHOD = 0x15
    AUTHENTICATION_DATA = 0x16
    REQUEST_PROBLEM_INFORMATION = 0x17
    WILL_DELAY_INTERVAL = 0x18
    REQUEST_RESPONSE_INFORMATION = 0x19
    RESPONSE_INFORMATION = 0x1A
    SERVER_REFERENCE = 0x1C
    REASON_STRING = 0x1F
    RECEIVE_MAXIMUM = 0x21
    TOPIC_ALIAS_MAXIMUM = 0x22
    TOPIC_ALIAS = 0x23
    MAXIMUM_QOS = 0x24
    RETAIN_AVAILABLE = 0x25
    USER_PROPERTY = 0x26
    MAXIMUM_PACKET_SIZE = 0x27
    WILDCARD_SUBSCRIPTION_AVAILABLE = 0x28
    SUBSCRIPTION_IDENTIFIER_AVAILABLE = 0x29
    SHARED_SUBSCRIPTION_AVAILABLE = 0x2A


class _Kind(Enum):
    FLAG = "a byte of 0 or 1"
    BYTE = "a byte"
    U16 = "a two-byte integer"
    U32 = "a four-byte integer"
    VARINT = "a variable byte integer"
    STRING = "a UTF-8 string"
    BINARY = "binary data"
    PAIR = "a UTF-8 string pair"


P = PacketType
_MESSAGE = frozenset({P.PUBLISH, WILL})
_ACKS = frozenset(
    {
        P.CONNACK,
        P.PUBACK,
        P.PUBREC,
        P.PUBREL,
        P.PUBCOMP,
        P.SUBACK,
        P.UNSUBACK,
        P.DISCONNECT,
        P.AUTH,
    }
)
_ALL = frozenset(P) - {P.PINGREQ, P.PINGRESP} | {WILL}


@dataclass(frozen=True, slots=True)
class _Spec:
    field: str
    kind: _Kind
    packets: frozenset[PacketType | None]
    nonzero: bool = False


_SPECS: dict[PropertyId, _Spec] = {
    PropertyId.PAYLOAD_FORMAT_INDICATOR: _Spec("payload_format_indicator", _Kind.FLAG, _MESSAGE),
    PropertyId.MESSAGE_EXPIRY_INTERVAL: _Spec("message_expiry_interval", _Kind.U32, _MESSAGE),
    PropertyId.CONTENT_TYPE: _Spec("content_type", _Kind.STRING, _MESSAGE),
    PropertyId.RESPONSE_TOPIC: _Spec("response_topic", _Kind.STRING, _MESSAGE),
    PropertyId.CORRELATION_DATA: _Spec("correlation_data", _Kind.BINARY, _MESSAGE),
    PropertyId.SUBSCRIPTION_IDENTIFIER: _Spec(
        "subscription_identifiers", _Kind.VARINT, frozenset({P.PUBLISH, P.SUBSCRIBE}), True
    ),
    PropertyId.SESSION_EXPIRY_INTERVAL: _Spec(
        "session_expiry_interval", _Kind.U32, frozenset({P.CONNECT, P.CONNACK, P.DISCONNECT})
    ),
    PropertyId.ASSIGNED_CLIENT_IDENTIFIER: _Spec(
        "assigned_client_identifier", _Kind.STRING, frozenset({P.CONNACK})
    ),
    PropertyId.SERVER_KEEP_ALIVE: _Spec("server_keep_alive", _Kind.U16, frozenset({P.CONNACK})),
    PropertyId.AUTHENTICATION_METHOD: _Spec(
        "authentication_method", _Kind.STRING, frozenset({P.CONNECT, P.CONNACK, P.AUTH})
    ),
    PropertyId.AUTHENTICATION_DATA: _Spec(
        "authentication_data", _Kind.BINARY, frozenset({P.CONNECT, P.CONNACK, P.AUTH})
    ),
    PropertyId.REQUEST_PROBLEM_INFORMATION: _Spec(
        "request_problem_information", _Kind.FLAG, frozenset({P.CONNECT})
    ),
    PropertyId.WILL_DELAY_INTERVAL: _Spec("will_delay_interval", _Kind.U32, frozenset({WILL})),
    PropertyId.REQUEST_RESPONSE_INFORMATION: _Spec(
        "request_response_information", _Kind.FLAG, frozenset({P.CONNECT})
    ),
    PropertyId.RESPONSE_INFORMATION: _Spec(
        "response_information", _Kind.STRING, frozenset({P.CONNACK})
    ),
    PropertyId.SERVER_REFERENCE: _Spec(
        "server_reference", _Kind.STRING, frozenset({P.CONNACK, P.DISCONNECT})
    ),
    PropertyId.REASON_STRING: _Spec("reason_string", _Kind.STRING, _ACKS),
    PropertyId.RECEIVE_MAXIMUM: _Spec(
        "receive_maximum", _Kind.U16, frozenset({P.CONNECT, P.CONNACK}), True
    ),
    PropertyId.TOPIC_ALIAS_MAXIMUM: _Spec(
        "topic_alias_maximum", _Kind.U16, frozenset({P.CONNECT, P.CONNACK})
    ),
    # A Topic Alias of 0 is refused by the connection (0x94 Topic Alias invalid).
    PropertyId.TOPIC_ALIAS: _Spec("topic_alias", _Kind.U16, frozenset({P.PUBLISH})),
    PropertyId.MAXIMUM_QOS: _Spec("maximum_qos", _Kind.FLAG, frozenset({P.CONNACK})),
    PropertyId.RETAIN_AVAILABLE: _Spec("retain_available", _Kind.FLAG, frozenset({P.CONNACK})),
    PropertyId.USER_PROPERTY: _Spec("user_properties", _Kind.PAIR, _ALL),
    PropertyId.MAXIMUM_PACKET_SIZE: _Spec(
        "maximum_packet_size", _Kind.U32, frozenset({P.CONNECT, P.CONNACK}), True
    ),
    PropertyId.WILDCARD_SUBSCRIPTION_AVAILABLE: _Spec(
        "wildcard_subscription_available", _Kind.FLAG, frozenset({P.CONNACK})
    ),
    PropertyId.SUBSCRIPTION_IDENTIFIER_AVAILABLE: _Spec(
        "subscription_identifier_available", _Kind.FLAG, frozenset({P.CONNACK})
    ),
    PropertyId.SHARED_SUBSCRIPTION_AVAILABLE: _Spec(
        "shared_subscription_available", _Kind.FLAG, frozenset({P.CONNACK})
    ),
}
_BY_FIELD = {spec.field: (ident, spec) for ident, spec in _SPECS.items()}


@dataclass(frozen=True, slots=True, repr=False)
class Properties:
    """A packet's MQTT 5.0 properties; ``None`` (or an empty tuple) is absent.

    The constructor checks nothing: :func:`encode_properties` refuses a
    property the packet may not carry or a value out of range, with
    :class:`MQTTUsageError`.
    """

    payload_format_indicator: int | None = None
    message_expiry_interval: int | None = None
    content_type: str | None = None
    response_topic: str | None = None
    correlation_data: bytes | None = None
    #: One in SUBSCRIBE; one per matching subscription in PUBLISH to a client.
    subscription_identifiers: tuple[int, ...] = ()
    session_expiry_interval: int | None = None
    assigned_client_identifier: str | None = None
    server_keep_alive: int | None = None
    authentication_method: str | None = None
    authentication_data: bytes | None = None
    request_problem_information: int | None = None
    will_delay_interval: int | None = None
    request_response_information: int | None = None
    response_information: str | None = None
    server_reference: str | None = None
    reason_string: str | None = None
    receive_maximum: int | None = None
    topic_alias_maximum: int | None = None
    topic_alias: int | None = None
    maximum_qos: int | None = None
    retain_available: int | None = None
    #: (name, value) pairs in the order given; names may repeat.
    user_properties: tuple[tuple[str, str], ...] = ()
    maximum_packet_size: int | None = None
    wildcard_subscription_available: int | None = None
    subscription_identifier_available: int | None = None
    shared_subscription_available: int | None = None

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.present())
        return f"Properties({shown})"

    def present(self) -> list[str]:
        """The names of the fields that are set, in declaration order."""
        return [f.name for f in fields(self) if getattr(self, f.name) not in (None, ())]


#: No properties at all.
NO_PROPERTIES = Properties()

_LIMITS = {_Kind.BYTE: 0xFF, _Kind.U16: 0xFFFF, _Kind.U32: 0xFFFF_FFFF, _Kind.VARINT: MAX_VARINT}


def _where(packet: PacketType | None) -> str:
    return "a will" if packet is None else packet.name


def _encode_value(kind: _Kind, value: object, name: str) -> bytes:
    if kind is _Kind.STRING:
        if not isinstance(value, str):
            raise MQTTUsageError(ReasonCode.MALFORMED_PACKET, f"property {name} must be a str")
        return string(value)
    if kind is _Kind.BINARY:
        if not isinstance(value, bytes | bytearray):
            raise MQTTUsageError(ReasonCode.MALFORMED_PACKET, f"property {name} must be bytes")
        return binary(bytes(value))
    if kind is _Kind.PAIR:
        pair = value if isinstance(value, tuple) else ()
        if len(pair) != 2 or not all(isinstance(part, str) for part in pair):
            raise MQTTUsageError(
                ReasonCode.MALFORMED_PACKET, f"each of {name} must be a (str, str) pair"
            )
        return string(pair[0]) + string(pair[1])
    if not isinstance(value, int) or isinstance(value, bool):
        raise MQTTUsageError(ReasonCode.MALFORMED_PACKET, f"property {name} must be an int")
    limit = 1 if kind is _Kind.FLAG else _LIMITS[kind]
    if not 0 <= value <= limit:
        raise MQTTUsageError(ReasonCode.PROTOCOL_ERROR, f"property {name} is out of range")
    if kind in (_Kind.FLAG, _Kind.BYTE):
        return bytes((value,))
    if kind is _Kind.U16:
        return u16(value)
    if kind is _Kind.U32:
        return u32(value)
    return varint(value)


def encode_properties(props: Properties, packet: PacketType | None) -> bytes:
    """``props`` as a property length and properties, for ``packet`` (a
    packet type, or :data:`WILL`); refuses what that packet may not carry."""
    out = bytearray()
    for name in props.present():
        ident, spec = _BY_FIELD[name]
        if packet not in spec.packets:
            raise MQTTUsageError(
                ReasonCode.PROTOCOL_ERROR, f"{_where(packet)} may not carry property {name}"
            )
        value = getattr(props, name)
        if spec.nonzero and (value == 0 or (isinstance(value, tuple) and 0 in value)):
            raise MQTTUsageError(ReasonCode.PROTOCOL_ERROR, f"property {name} must not be 0")
        repeats = spec.kind is _Kind.PAIR or name == "subscription_identifiers"
        values = value if repeats else (value,)
        for one in values:
            out.append(ident)
            out += _encode_value(spec.kind, one, name)
    return varint(len(out)) + bytes(out)


def _decode_value(reader: Reader, kind: _Kind, what: str) -> object:
    if kind is _Kind.FLAG:
        value = reader.u8(what)
        if value > 1:
            raise MQTTProtocolError(ReasonCode.PROTOCOL_ERROR, f"{what} is {value}, not 0 or 1")
        return value
    if kind is _Kind.BYTE:
        return reader.u8(what)
    if kind is _Kind.U16:
        return reader.u16(what)
    if kind is _Kind.U32:
        return reader.u32(what)
    if kind is _Kind.VARINT:
        return reader.varint(what)
    if kind is _Kind.STRING:
        return reader.string(what)
    if kind is _Kind.BINARY:
        return reader.binary(what)
    return (reader.string(what), reader.string(what))


def decode_properties(reader: Reader, packet: PacketType | None) -> Properties:
    """Read a property length and the properties it covers, for ``packet``
    (a packet type, or :data:`WILL`); see the module for what is refused."""
    length = reader.varint("the property length")
    if length > reader.remaining:
        raise malformed("the property length overruns the packet")
    end = reader.pos + length
    values: dict[str, object] = {}
    pairs: list[tuple[str, str]] = []
    identifiers: list[int] = []
    inner = Reader(reader.data, reader.pos)
    inner.end = end
    while inner.pos < end:
        code = inner.varint("a property identifier")
        try:
            ident = PropertyId(code)
        except ValueError:
            raise malformed(f"unknown property identifier 0x{code:02X}") from None
        spec = _SPECS[ident]
        if packet not in spec.packets:
            raise malformed(f"{_where(packet)} may not carry property {spec.field}")
        what = f"property {spec.field}"
        value = _decode_value(inner, spec.kind, what)
        if spec.nonzero and value == 0:
            raise MQTTProtocolError(ReasonCode.PROTOCOL_ERROR, f"{what} is 0")
        if ident is PropertyId.USER_PROPERTY:
            assert isinstance(value, tuple)
            pairs.append(value)
        elif ident is PropertyId.SUBSCRIPTION_IDENTIFIER:
            assert isinstance(value, int)
            if identifiers and packet is not P.PUBLISH:
                raise MQTTProtocolError(ReasonCode.PROTOCOL_ERROR, f"{what} given twice")
            identifiers.append(value)
        elif spec.field in values:
            raise MQTTProtocolError(ReasonCode.PROTOCOL_ERROR, f"{what} given twice")
        else:
            values[spec.field] = value
    reader.pos = end
    if not values and not pairs and not identifiers:
        return NO_PROPERTIES
    return Properties(
        **values,  # type: ignore[arg-type]
        user_properties=tuple(pairs),
        subscription_identifiers=tuple(identifiers),
    )
