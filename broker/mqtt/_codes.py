"""MQTT's numbers: protocol levels, packet types, reason codes and which
packet may carry which reason code.

Reason codes are MQTT 5.0's (section 2.4 of the specification), with the
specification's names. MQTT 3.1.1 has fewer codes: its CONNACK return codes
0-5 and SUBACK's 0, 1, 2 and 0x80 are mapped to and from these by the codec
(:data:`V3_CONNACK_CODES`).
"""

from __future__ import annotations

from enum import IntEnum

__all__ = [
    "MQTT_3_1_1",
    "MQTT_5",
    "REASONS_ALLOWED",
    "V3_CONNACK_CODES",
    "PacketType",
    "ReasonCode",
    "v3_connack_code",
]

#: The protocol level byte of MQTT 3.1.1 in CONNECT.
MQTT_3_1_1 = 4
#: The protocol level byte of MQTT 5.0 in CONNECT.
MQTT_5 = 5


class PacketType(IntEnum):
    """The control packet types (the high four bits of a packet's first byte)."""

    CONNECT = 1
    CONNACK = 2
    PUBLISH = 3
    PUBACK = 4
    PUBREC = 5
    PUBREL = 6
    PUBCOMP = 7
    SUBSCRIBE = 8
    SUBACK = 9
    UNSUBSCRIBE = 10
    UNSUBACK = 11
    PINGREQ = 12
    PINGRESP = 13
    DISCONNECT = 14
    AUTH = 15


class ReasonCode(IntEnum):
    """MQTT 5.0 reason codes; value 0 has three names, as in the specification."""

    SUCCESS = 0x00
    NORMAL_DISCONNECTION = 0x00
    GRANTED_QOS_0 = 0x00
    GRANTED_QOS_1 = 0x01
    GRANTED_QOS_2 = 0x02
    DISCONNECT_WITH_WILL_MESSAGE = 0x04
    NO_MATCHING_SUBSCRIBERS = 0x10
    NO_SUBSCRIPTION_EXISTED = 0x11
    CONTINUE_AUTHENTICATION = 0x18
    RE_AUTHENTICATE = 0x19
    UNSPECIFIED_ERROR = 0x80
    MALFORMED_PACKET = 0x81
    PROTOCOL_ERROR = 0x82
    IMPLEMENTATION_SPECIFIC_ERROR = 0x83
    UNSUPPORTED_PROTOCOL_VERSION = 0x84
    CLIENT_IDENTIFIER_NOT_VALID = 0x85
    BAD_USER_NAME_OR_PASSWORD = 0x86
    NOT_AUTHORIZED = 0x87
    SERVER_UNAVAILABLE = 0x88
    SERVER_BUSY = 0x89
    BANNED = 0x8A
    SERVER_SHUTTING_DOWN = 0x8B
    BAD_AUTHENTICATION_METHOD = 0x8C
    KEEP_ALIVE_TIMEOUT = 0x8D
    SESSION_TAKEN_OVER = 0x8E
    TOPIC_FILTER_INVALID = 0x8F
    TOPIC_NAME_INVALID = 0x90
    PACKET_IDENTIFIER_IN_USE = 0x91
    PACKET_IDENTIFIER_NOT_FOUND = 0x92
    RECEIVE_MAXIMUM_EXCEEDED = 0x93
    TOPIC_ALIAS_INVALID = 0x94
    PACKET_TOO_LARGE = 0x95
    MESSAGE_RATE_TOO_HIGH = 0x96
    QUOTA_EXCEEDED = 0x97
    ADMINISTRATIVE_ACTION = 0x98
    PAYLOAD_FORMAT_INVALID = 0x99
    RETAIN_NOT_SUPPORTED = 0x9A
    QOS_NOT_SUPPORTED = 0x9B
    USE_ANOTHER_SERVER = 0x9C
    SERVER_MOVED = 0x9D
    SHARED_SUBSCRIPTIONS_NOT_SUPPORTED = 0x9E
    CONNECTION_RATE_EXCEEDED = 0x9F
    MAXIMUM_CONNECT_TIME = 0xA0
    SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED = 0xA1
    WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED = 0xA2

    @property
    def is_error(self) -> bool:
        """Whether this code reports a failure (0x80 and above)."""
        return self >= 0x80


R = ReasonCode

#: Which reason codes each packet type may carry in MQTT 5.0 (spec 2.4 and
#: the packets' sections). A received code outside its packet's set is a
#: Protocol Error; one that is no reason code at all is a Malformed Packet.
REASONS_ALLOWED: dict[PacketType, frozenset[ReasonCode]] = {
    PacketType.CONNACK: frozenset(
        {
            R.SUCCESS,
            R.UNSPECIFIED_ERROR,
            R.MALFORMED_PACKET,
            R.PROTOCOL_ERROR,
            R.IMPLEMENTATION_SPECIFIC_ERROR,
            R.UNSUPPORTED_PROTOCOL_VERSION,
            R.CLIENT_IDENTIFIER_NOT_VALID,
            R.BAD_USER_NAME_OR_PASSWORD,
            R.NOT_AUTHORIZED,
            R.SERVER_UNAVAILABLE,
            R.SERVER_BUSY,
            R.BANNED,
            R.BAD_AUTHENTICATION_METHOD,
            R.TOPIC_NAME_INVALID,
            R.PACKET_TOO_LARGE,
            R.QUOTA_EXCEEDED,
            R.PAYLOAD_FORMAT_INVALID,
            R.RETAIN_NOT_SUPPORTED,
            R.QOS_NOT_SUPPORTED,
            R.USE_ANOTHER_SERVER,
            R.SERVER_MOVED,
            R.CONNECTION_RATE_EXCEEDED,
        }
    ),
    PacketType.PUBACK: frozenset(
        {
            R.SUCCESS,
            R.NO_MATCHING_SUBSCRIBERS,
            R.UNSPECIFIED_ERROR,
            R.IMPLEMENTATION_SPECIFIC_ERROR,
            R.NOT_AUTHORIZED,
            R.TOPIC_NAME_INVALID,
            R.PACKET_IDENTIFIER_IN_USE,
            R.QUOTA_EXCEEDED,
            R.PAYLOAD_FORMAT_INVALID,
        }
    ),
    PacketType.PUBREL: frozenset({R.SUCCESS, R.PACKET_IDENTIFIER_NOT_FOUND}),
    PacketType.SUBACK: frozenset(
        {
            R.GRANTED_QOS_0,
            R.GRANTED_QOS_1,
            R.GRANTED_QOS_2,
            R.UNSPECIFIED_ERROR,
            R.IMPLEMENTATION_SPECIFIC_ERROR,
            R.NOT_AUTHORIZED,
            R.TOPIC_FILTER_INVALID,
            R.PACKET_IDENTIFIER_IN_USE,
            R.QUOTA_EXCEEDED,
            R.SHARED_SUBSCRIPTIONS_NOT_SUPPORTED,
            R.SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED,
            R.WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED,
        }
    ),
    PacketType.UNSUBACK: frozenset(
        {
            R.SUCCESS,
            R.NO_SUBSCRIPTION_EXISTED,
            R.UNSPECIFIED_ERROR,
            R.IMPLEMENTATION_SPECIFIC_ERROR,
            R.NOT_AUTHORIZED,
            R.TOPIC_FILTER_INVALID,
            R.PACKET_IDENTIFIER_IN_USE,
        }
    ),
    PacketType.DISCONNECT: frozenset(
        {
            R.NORMAL_DISCONNECTION,
            R.DISCONNECT_WITH_WILL_MESSAGE,
            R.UNSPECIFIED_ERROR,
            R.MALFORMED_PACKET,
            R.PROTOCOL_ERROR,
            R.IMPLEMENTATION_SPECIFIC_ERROR,
            R.NOT_AUTHORIZED,
            R.SERVER_BUSY,
            R.SERVER_SHUTTING_DOWN,
            R.KEEP_ALIVE_TIMEOUT,
            R.SESSION_TAKEN_OVER,
            R.TOPIC_FILTER_INVALID,
            R.TOPIC_NAME_INVALID,
            R.RECEIVE_MAXIMUM_EXCEEDED,
            R.TOPIC_ALIAS_INVALID,
            R.PACKET_TOO_LARGE,
            R.MESSAGE_RATE_TOO_HIGH,
            R.QUOTA_EXCEEDED,
            R.ADMINISTRATIVE_ACTION,
            R.PAYLOAD_FORMAT_INVALID,
            R.RETAIN_NOT_SUPPORTED,
            R.QOS_NOT_SUPPORTED,
            R.USE_ANOTHER_SERVER,
            R.SERVER_MOVED,
            R.SHARED_SUBSCRIPTIONS_NOT_SUPPORTED,
            R.CONNECTION_RATE_EXCEEDED,
            R.MAXIMUM_CONNECT_TIME,
            R.SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED,
            R.WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED,
        }
    ),
    PacketType.AUTH: frozenset({R.SUCCESS, R.CONTINUE_AUTHENTICATION, R.RE_AUTHENTICATE}),
}
REASONS_ALLOWED[PacketType.PUBREC] = REASONS_ALLOWED[PacketType.PUBACK]
REASONS_ALLOWED[PacketType.PUBCOMP] = REASONS_ALLOWED[PacketType.PUBREL]

#: MQTT 3.1.1's CONNACK return codes (0-5) as the 5.0 reason codes they mean.
V3_CONNACK_CODES: dict[int, ReasonCode] = {
    0: R.SUCCESS,
    1: R.UNSUPPORTED_PROTOCOL_VERSION,
    2: R.CLIENT_IDENTIFIER_NOT_VALID,
    3: R.SERVER_UNAVAILABLE,
    4: R.BAD_USER_NAME_OR_PASSWORD,
    5: R.NOT_AUTHORIZED,
}
_V3_CONNACK_BY_REASON = {reason: code for code, reason in V3_CONNACK_CODES.items()}
# The nearest 3.1.1 return code of the other refusals.
_V3_CONNACK_BY_REASON.update(
    {
        R.BAD_AUTHENTICATION_METHOD: 4,
        R.BANNED: 5,
        R.SERVER_BUSY: 3,
        R.USE_ANOTHER_SERVER: 3,
        R.SERVER_MOVED: 3,
    }
)


def v3_connack_code(reason: ReasonCode) -> int:
    """The MQTT 3.1.1 CONNACK return code (0-5) for a 5.0 reason code:
    the six that have one map exactly, bad credentials and bans map to 4 and
    5, and every other refusal to 3 (Server unavailable)."""
    return _V3_CONNACK_BY_REASON.get(reason, 3)
