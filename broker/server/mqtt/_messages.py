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

Sans-IO: nothing here does I/O.
"""

from __future__ import annotations

from broker.mqtt import MQTT_5, NO_PROPERTIES, Properties
from broker.protocol.frames import decode_deliver_tail, encode_deliver_tail

__all__ = ["KEY_PROPERTY", "delivered", "published_tail"]

#: The user property that carries the broker's message key.
KEY_PROPERTY = "key"


def published_tail(payload: bytes, properties: Properties) -> tuple[bytes, bytes | None]:
    """The encoded Deliver tail of an MQTT PUBLISH (what a topic routes and
    its log stores) and the message's key."""
    key: bytes | None = None
    headers: list[tuple[str, bytes]] | None = None
    for name, value in properties.user_properties:
        if name == KEY_PROPERTY and key is None:
            key = value.encode()
            continue
        if headers is None:
            headers = []
        headers.append((name, value.encode()))
    return encode_deliver_tail(payload, key, headers), key


def delivered(tail: bytes, version: int) -> tuple[bytes, Properties]:
    """The payload and the PUBLISH properties (user properties: the key,
    then the headers) of a routed tail, for a client of protocol ``version``."""
    payload, key, headers = decode_deliver_tail(tail)
    if version != MQTT_5 or (key is None and not headers):
        return payload, NO_PROPERTIES
    pairs: list[tuple[str, str]] = []
    if key is not None:
        pairs.append((KEY_PROPERTY, key.decode(errors="replace")))
    for name, value in headers or ():
        pairs.append((name, value.decode(errors="replace")))
    return payload, Properties(user_properties=tuple(pairs))
