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

Sans-IO: nothing here does I/O.
"""

from __future__ import annotations

from broker.mqtt import MQTT_5, NO_PROPERTIES, Properties
from broker.protocol.frames import decode_deliver_tail, encode_deliver_tail

__all__ = ["KEY_PROPERTY", "RETAIN_HEADER", "delivered", "published_tail"]

#: The user property that carries the broker's message key.
KEY_PROPERTY = "key"
#: The header that marks a message published with the retain flag.
RETAIN_HEADER = "mqtt-retain"


def published_tail(
    payload: bytes, properties: Properties, *, retain: bool = False
) -> tuple[bytes, bytes | None]:
    """The encoded Deliver tail of an MQTT PUBLISH (what a topic routes and
    its log stores) and the message's key; ``retain``: marked as retained."""
    key: bytes | None = None
    headers: list[tuple[str, bytes]] | None = None
    for name, value in properties.user_properties:
        if name == KEY_PROPERTY and key is None:
            key = value.encode()
            continue
        if name == RETAIN_HEADER:
            continue
        if headers is None:
            headers = []
        headers.append((name, value.encode()))
    if retain:
        headers = [*(headers or ()), (RETAIN_HEADER, b"1")]
    return encode_deliver_tail(payload, key, headers), key


def delivered(tail: bytes, version: int) -> tuple[bytes, Properties, bool]:
    """The payload, the PUBLISH properties (user properties: the key, then
    the headers) of a routed tail, for a client of protocol ``version``,
    and whether it was published retained."""
    payload, key, headers = decode_deliver_tail(tail)
    if not headers and (version != MQTT_5 or key is None):
        return payload, NO_PROPERTIES, False
    retained = False
    pairs: list[tuple[str, str]] = []
    if key is not None:
        pairs.append((KEY_PROPERTY, key.decode(errors="replace")))
    for name, value in headers or ():
        if name == RETAIN_HEADER:
            retained = True
            continue
        pairs.append((name, value.decode(errors="replace")))
    if version != MQTT_5 or not pairs:
        return payload, NO_PROPERTIES, retained
    return payload, Properties(user_properties=tuple(pairs)), retained
