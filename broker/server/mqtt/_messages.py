"""The mapping of one message between MQTT and the broker: payload, key
and headers to and from a PUBLISH's payload and user properties.

- The payload is the payload, byte for byte.
- Every MQTT user property ``(name, value)`` is a header ``(name,
  value as UTF-8)``, in order, repeats kept; every header is a user
  property, its value decoded as UTF-8 (bytes that are not UTF-8 are
  replaced by U+FFFD: MQTT strings must be UTF-8).
- The broker's message *key* is the user property named ``key`` (its
  first, if repeated): publishing with it sets the key (and it is not a
  header then); a message with a key is delivered with a ``key`` user
  property first. A header named ``key`` from a native client is
  delivered as a second ``key`` property after it.
- 3.1.1 has no properties: a 3.1.1 client publishes no key and no
  headers, and receives the payload only.
- A PUBLISH with the retain flag is stored with one more header,
  ``mqtt-retain: 1`` (:data:`RETAIN_HEADER`), last: native readers see it;
  MQTT clients do not (it says that the message was published retained,
  for 5.0's Retain As Published). The name is reserved: a user property
  ``mqtt-retain`` of an MQTT client is not kept.
- A 5.0 PUBLISH with a Message Expiry Interval is stored with the header
  ``mqtt-expiry`` (:data:`EXPIRY_HEADER`): when it expires, in
  milliseconds since the Unix epoch (the broker's wall clock when it
  received the PUBLISH, plus the interval). A delivery after that time is
  not made; one before it carries the interval left, in whole seconds
  rounded up.
- A PUBLISH of a client that has a No Local subscription matching its
  topic is stored with the header ``mqtt-origin`` (:data:`ORIGIN_HEADER`):
  the client id; that client's No Local subscriptions skip it.
- A PUBLISH at QoS 0 or 1 is stored with the header ``mqtt-qos``
  (:data:`QOS_HEADER`): ``0`` or ``1``; it is delivered at that QoS or the
  subscription's, whichever is lower (MQTT 3.1.1 and 5.0 section 3.8.4).
  A record without it (a QoS 2 PUBLISH, a native client's publish) is
  delivered at the subscription's QoS.
- A 5.0 PUBLISH's Payload Format Indicator, Content Type, Response Topic
  and Correlation Data are stored as the headers ``mqtt-format``
  (``1``: UTF-8), ``mqtt-content-type``, ``mqtt-response-topic`` (the MQTT
  topic name) and ``mqtt-correlation`` (the bytes), in that order, before
  the others of ours; they are delivered to 5.0 clients as the properties
  again, unchanged (MQTT 5.0 section 3.3.2.3).
- These names are reserved: MQTT clients never see those headers, and
  user properties of those names are not kept.

Nothing here does I/O; :func:`wall_ms` reads the wall clock.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import NamedTuple

from broker.mqtt import MQTT_5, NO_PROPERTIES, Properties
from broker.protocol.frames import decode_deliver_tail, encode_deliver_tail

__all__ = [
    "EXPIRY_HEADER",
    "KEY_PROPERTY",
    "ORIGIN_HEADER",
    "QOS_HEADER",
    "RETAIN_HEADER",
    "Delivered",
    "delivered",
    "expired",
    "plain_delivery",
    "plain_tail",
    "published_tail",
    "wall_ms",
]

#: The user property that carries the broker's message key.
KEY_PROPERTY = "key"
#: The header that marks a message published with the retain flag.
RETAIN_HEADER = "mqtt-retain"
#: The header that says when a message expires (Unix epoch, milliseconds).
EXPIRY_HEADER = "mqtt-expiry"
#: The header that names the publishing client (for No Local subscriptions).
ORIGIN_HEADER = "mqtt-origin"
#: The header that says the QoS of a message published at QoS 0 or 1.
QOS_HEADER = "mqtt-qos"
#: The QoS of a record without :data:`QOS_HEADER` (QoS 2, or a native
#: publish): no bound on the subscription's.
DEFAULT_QOS = 2
#: The headers of the 5.0 PUBLISH properties forwarded unchanged.
FORMAT_HEADER = "mqtt-format"
CONTENT_TYPE_HEADER = "mqtt-content-type"
RESPONSE_TOPIC_HEADER = "mqtt-response-topic"
CORRELATION_HEADER = "mqtt-correlation"
#: Header names of ours: an MQTT client's user properties of these names are not kept.
RESERVED = frozenset(
    {
        RETAIN_HEADER,
        EXPIRY_HEADER,
        ORIGIN_HEADER,
        QOS_HEADER,
        FORMAT_HEADER,
        CONTENT_TYPE_HEADER,
        RESPONSE_TOPIC_HEADER,
        CORRELATION_HEADER,
    }
)
_QOS_VALUES = {b"0": 0, b"1": 1, b"2": 2}
#: The headers of a publish at QoS 0 or 1 that has nothing else to say
#: (at QoS 2, :data:`DEFAULT_QOS`, none).
_QOS_HEADERS: dict[int, list[tuple[str, bytes]]] = {
    0: [(QOS_HEADER, b"0")],
    1: [(QOS_HEADER, b"1")],
}


#: The end of the tail of a publish :func:`published_tail` writes the usual
#: way (null key, the QoS header only), and that QoS: the same length each.
_PLAIN_ENDS = {
    encode_deliver_tail(b"", None, headers)[1:]: qos for qos, headers in _QOS_HEADERS.items()
}
_PLAIN_END_SIZE = 14
#: The same ends by QoS (QoS 2's: a null key and null headers).
_ENDS = {qos: end for end, qos in _PLAIN_ENDS.items()} | {DEFAULT_QOS: b"\xf6\xf6"}
#: The heads of payloads shorter than 256 bytes in a tail (CBOR byte strings).
_SHORT_HEADS = [bytes((0x40 | n,)) if n < 24 else bytes((0x58, n)) for n in range(256)]
#: The end of a tail without key and headers (a QoS 2 publish, a native one).
_NULL_NULL = b"\xf6\xf6"
assert {len(end) for end in _PLAIN_ENDS} == {_PLAIN_END_SIZE}


def wall_ms() -> int:
    """The wall clock, in milliseconds since the Unix epoch (expiry times
    are kept in the topic logs: they must mean the same after a restart)."""
    return time.time_ns() // 1_000_000


def published_tail(
    payload: bytes,
    properties: Properties,
    *,
    retain: bool = False,
    now_ms: int | None = None,
    origin: str | None = None,
    qos: int = DEFAULT_QOS,
) -> tuple[bytes, bytes | None]:
    """The encoded Deliver tail of an MQTT PUBLISH (what a topic routes and
    its log stores) and the message's key; ``retain``: marked as retained;
    ``now_ms``: when it was received (its Message Expiry Interval counts
    from then; None: it does not expire); ``origin``: the client id No
    Local subscriptions know it by; ``qos``: the QoS it was published at."""
    if properties is NO_PROPERTIES and origin is None and not retain:
        return plain_tail(payload, qos), None
    key: bytes | None = None
    headers: list[tuple[str, bytes]] | None = None
    for name, value in properties.user_properties:
        if name == KEY_PROPERTY and key is None:
            key = value.encode()
            continue
        if name in RESERVED:
            continue
        if headers is None:
            headers = []
        headers.append((name, value.encode()))
    if properties.payload_format_indicator is not None:
        headers = [*(headers or ()), (FORMAT_HEADER, b"%d" % properties.payload_format_indicator)]
    if properties.content_type is not None:
        headers = [*(headers or ()), (CONTENT_TYPE_HEADER, properties.content_type.encode())]
    if properties.response_topic is not None:
        headers = [*(headers or ()), (RESPONSE_TOPIC_HEADER, properties.response_topic.encode())]
    if properties.correlation_data is not None:
        headers = [*(headers or ()), (CORRELATION_HEADER, properties.correlation_data)]
    interval = properties.message_expiry_interval
    if interval is not None and now_ms is not None:
        headers = [*(headers or ()), (EXPIRY_HEADER, str(now_ms + interval * 1000).encode())]
    if origin is not None:
        headers = [*(headers or ()), (ORIGIN_HEADER, origin.encode())]
    if qos != DEFAULT_QOS:
        headers = [*(headers or ()), (QOS_HEADER, str(qos).encode())]
    if retain:
        headers = [*(headers or ()), (RETAIN_HEADER, b"1")]
    return encode_deliver_tail(payload, key, headers), key


def plain_delivery(tail: bytes) -> tuple[bytes, int] | None:
    """The payload and QoS of ``tail`` if it is the tail of a usual
    publish (no key, no header but an MQTT publish's QoS; what
    :func:`delivered` reads of it, cheaper); None for any other tail."""
    size = len(tail) - _PLAIN_END_SIZE
    qos = _PLAIN_ENDS.get(tail[size:]) if size > 0 else None
    if qos is None:
        if tail[-2:] != _NULL_NULL or len(tail) < 3:
            return None
        size = len(tail) - 2
        qos = DEFAULT_QOS
    head = tail[0]
    if head == 0x58:
        start = 2
        length = tail[1]
    elif 0x40 <= head <= 0x57:
        start = 1
        length = head - 0x40
    elif head == 0x59:
        start = 3
        length = tail[1] << 8 | tail[2]
    else:
        return None
    if start + length != size:
        return None
    return tail[start:size], qos


def plain_tail(payload: bytes, qos: int) -> bytes:
    """:func:`published_tail` of a publish at ``qos`` without properties
    and retain flag, of a client with no No Local subscription (the
    usual one: its key null, its headers only its QoS's)."""
    size = len(payload)
    if size < 256 and type(payload) is bytes and qos in _ENDS:
        return b"".join((_SHORT_HEADS[size], payload, _ENDS[qos]))
    return encode_deliver_tail(payload, None, _QOS_HEADERS.get(qos))


class Delivered(NamedTuple):
    """A routed tail as an MQTT PUBLISH: its payload and properties, whether
    it was published retained, the client id of its ``mqtt-origin`` (None:
    none), whether it expired (then it is not to be delivered), and the
    QoS it was published at."""

    payload: bytes
    properties: Properties
    retained: bool
    origin: str | None
    expired: bool
    qos: int = DEFAULT_QOS


def delivered(tail: bytes, version: int, now_ms: int = 0) -> Delivered:
    """The payload, the PUBLISH properties (user properties: the key, then
    the headers; 5.0's Message Expiry Interval, what is left of it at
    ``now_ms``) of a routed tail, for a client of protocol ``version``,
    and what the headers of ours say."""
    payload, key, headers = decode_deliver_tail(tail)
    if not headers and (version != MQTT_5 or key is None):
        return Delivered(payload, NO_PROPERTIES, False, None, False)
    if headers and len(headers) == 1 and (version != MQTT_5 or key is None):
        name, value = headers[0]
        if name == QOS_HEADER:  # (the usual MQTT publish: its QoS only)
            return Delivered(
                payload, NO_PROPERTIES, False, None, False, _QOS_VALUES.get(value, DEFAULT_QOS)
            )
    retained = False
    origin: str | None = None
    left: int | None = None
    qos = DEFAULT_QOS
    forwarded: dict[str, object] = {}
    pairs: list[tuple[str, str]] = []
    if key is not None:
        pairs.append((KEY_PROPERTY, key.decode(errors="replace")))
    for name, value in headers or ():
        if name in RESERVED:
            if name == RETAIN_HEADER:
                retained = True
            elif name == ORIGIN_HEADER:
                origin = value.decode(errors="replace")
            elif name == QOS_HEADER:
                qos = _QOS_VALUES.get(value, DEFAULT_QOS)
            elif name == FORMAT_HEADER:
                forwarded["payload_format_indicator"] = 1 if value == b"1" else 0
            elif name == CONTENT_TYPE_HEADER:
                forwarded["content_type"] = value.decode(errors="replace")
            elif name == RESPONSE_TOPIC_HEADER:
                forwarded["response_topic"] = value.decode(errors="replace")
            elif name == CORRELATION_HEADER:
                forwarded["correlation_data"] = value
            else:
                left = _left(value, now_ms)
            continue
        pairs.append((name, value.decode(errors="replace")))
    expired = left is not None and left <= 0
    if version != MQTT_5 or expired:
        return Delivered(payload, NO_PROPERTIES, retained, origin, expired, qos)
    properties = Properties(user_properties=tuple(pairs)) if pairs else NO_PROPERTIES
    if left is not None:
        properties = replace(properties, message_expiry_interval=left)
    if forwarded:
        properties = replace(properties, **forwarded)  # type: ignore[arg-type]
    return Delivered(payload, properties, retained, origin, False, qos)


def _left(value: bytes, now_ms: int) -> int | None:
    """The whole seconds left (rounded up; 0: expired) of an expiry header
    at ``now_ms`` (None: not one of ours: it does not expire)."""
    try:
        expires = int(value)
    except ValueError:
        return None
    return max(0, -((now_ms - expires) // 1000))


def expired(tail: bytes, now_ms: int) -> bool:
    """Whether the message of ``tail`` has an expiry, passed at ``now_ms``."""
    _, _, headers = decode_deliver_tail(tail)
    for name, value in headers or ():
        if name == EXPIRY_HEADER:
            left = _left(value, now_ms)
            return left is not None and left <= 0
    return False
