"""The MQTT control packets of 3.1.1 and 5.0 as values: one frozen class
per packet type, the same classes for both versions.

Fields a version lacks are ignored when encoding for it (3.1.1 has no
properties, no reason codes in PUBACK, PUBREC, PUBREL, PUBCOMP, UNSUBACK
and DISCONNECT, no subscription options but the QoS) and take their
defaults when decoding it. These classes are also the events a
:class:`~broker.mqtt.ServerConnection` hands out.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._codes import MQTT_5, ReasonCode
from ._properties import NO_PROPERTIES, Properties

__all__ = [
    "Auth",
    "ConnAck",
    "Connect",
    "Disconnect",
    "Packet",
    "PingReq",
    "PingResp",
    "PubAck",
    "PubComp",
    "PubRec",
    "PubRel",
    "Publish",
    "SubAck",
    "Subscribe",
    "Subscription",
    "UnsubAck",
    "Unsubscribe",
    "Will",
]


@dataclass(frozen=True, slots=True)
class Will:
    """A will message of CONNECT, published by the server when the
    connection ends without a normal DISCONNECT."""

    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    #: 5.0 only: will delay, expiry, content type, response topic...
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Connect:
    """CONNECT: the client's first packet."""

    client_id: str
    #: 4 for MQTT 3.1.1, 5 for MQTT 5.0.
    protocol_version: int = MQTT_5
    #: 3.1.1's Clean Session, 5.0's Clean Start.
    clean_start: bool = True
    #: Seconds; 0 turns keepalive off.
    keepalive: int = 0
    username: str | None = None
    password: bytes | None = None
    will: Will | None = None
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class ConnAck:
    """CONNACK: the server's answer to CONNECT. In 3.1.1 the reason is sent
    as a return code 0-5 (see :func:`~broker.mqtt._codes.v3_connack_code`)."""

    reason: ReasonCode = ReasonCode.SUCCESS
    session_present: bool = False
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Publish:
    """PUBLISH: an application message, either way."""

    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    dup: bool = False
    #: Present exactly when ``qos`` is 1 or 2.
    packet_id: int | None = None
    properties: Properties = NO_PROPERTIES


_FIELD_SETTERS = tuple(
    getattr(Publish, name).__set__
    for name in ("topic", "payload", "qos", "retain", "dup", "packet_id", "properties")
)


def new_publish(
    topic: str, payload: bytes, qos: int, retain: bool, dup: bool, packet_id: int | None
) -> Publish:
    """``Publish(topic, payload, qos, retain, dup, packet_id)`` (no
    properties), made at half the cost of the frozen class's ``__init__``
    (its slots set directly): for the connection's PUBLISHes read directly."""
    packet = object.__new__(Publish)
    set_topic, set_payload, set_qos, set_retain, set_dup, set_id, set_properties = _FIELD_SETTERS
    set_topic(packet, topic)
    set_payload(packet, payload)
    set_qos(packet, qos)
    set_retain(packet, retain)
    set_dup(packet, dup)
    set_id(packet, packet_id)
    set_properties(packet, NO_PROPERTIES)
    return packet


@dataclass(frozen=True, slots=True)
class PubAck:
    """PUBACK: QoS 1's acknowledgement."""

    packet_id: int
    reason: ReasonCode = ReasonCode.SUCCESS
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class PubRec:
    """PUBREC: QoS 2's first answer (received)."""

    packet_id: int
    reason: ReasonCode = ReasonCode.SUCCESS
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class PubRel:
    """PUBREL: QoS 2's second step (release)."""

    packet_id: int
    reason: ReasonCode = ReasonCode.SUCCESS
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class PubComp:
    """PUBCOMP: QoS 2's last step (complete)."""

    packet_id: int
    reason: ReasonCode = ReasonCode.SUCCESS
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Subscription:
    """One topic filter of SUBSCRIBE with its options (all but ``qos`` are
    5.0 only)."""

    topic_filter: str
    #: The maximum QoS the client asks for.
    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    #: 0: send retained messages on subscribe; 1: only if the subscription
    #: is new; 2: never.
    retain_handling: int = 0


@dataclass(frozen=True, slots=True)
class Subscribe:
    """SUBSCRIBE: one or more subscriptions."""

    packet_id: int
    subscriptions: tuple[Subscription, ...]
    #: 5.0: at most one subscription identifier, the user properties.
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class SubAck:
    """SUBACK: one reason code per subscription (3.1.1: granted QoS 0-2 or
    0x80 Failure; any 5.0 error is sent as 0x80 there)."""

    packet_id: int
    reasons: tuple[ReasonCode, ...]
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    """UNSUBSCRIBE: one or more topic filters."""

    packet_id: int
    topic_filters: tuple[str, ...]
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class UnsubAck:
    """UNSUBACK: 5.0 has one reason code per filter, 3.1.1 none."""

    packet_id: int
    reasons: tuple[ReasonCode, ...] = ()
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class PingReq:
    """PINGREQ: the client is alive (the connection answers PINGRESP itself)."""


@dataclass(frozen=True, slots=True)
class PingResp:
    """PINGRESP: the server's answer to PINGREQ."""


@dataclass(frozen=True, slots=True)
class Disconnect:
    """DISCONNECT: the end of a connection (3.1.1: client to server only,
    without reason)."""

    reason: ReasonCode = ReasonCode.NORMAL_DISCONNECTION
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Auth:
    """AUTH (5.0 only): enhanced authentication, which this package decodes
    but its server connection refuses."""

    reason: ReasonCode = ReasonCode.SUCCESS
    properties: Properties = NO_PROPERTIES


#: Any control packet.
Packet = (
    Connect
    | ConnAck
    | Publish
    | PubAck
    | PubRec
    | PubRel
    | PubComp
    | Subscribe
    | SubAck
    | Unsubscribe
    | UnsubAck
    | PingReq
    | PingResp
    | Disconnect
    | Auth
)
