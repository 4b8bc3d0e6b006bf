"""The peer benchmark's floor relays' one rule, sans-IO: what an MQTT packet
from a client makes the least of a broker send, and to whom.

It answers CONNECT (CONNACK) and SUBSCRIBE (SUBACK, granting what was asked),
forwards each PUBLISH to the topic's subscribers at the publisher's QoS and
acknowledges it (PUBACK) at QoS 1; subscribers' PUBACKs are dropped.
Nothing else: no accounts, no flow control, no sessions, no bounds on
memory, no checks on what clients send. The two floors drive it: with trio
(``_trio_floor``) and with nothing but the operating system's readiness
calls (``_python_floor``).
"""

from __future__ import annotations

from typing import Generic, TypeVar

from . import _mqtt as mqtt

__all__ = ["RelayTable"]

#: A client, as its driver names it (a stream, a file descriptor).
C = TypeVar("C")

#: CONNACK: session not present, connection accepted.
_CONNACK = bytes([0x20, 2, 0, 0])


class RelayTable(Generic[C]):
    """The subscribers of each topic, and what each packet makes the relay send."""

    def __init__(self) -> None:
        self.subscribers: dict[str, list[C]] = {}

    def packet(self, sender: C, packet: mqtt.Packet) -> list[tuple[C, bytes]]:
        """What to send, to whom and in this order, for ``packet`` from
        ``sender`` (raises :class:`~._mqtt.MqttError` on a malformed PUBLISH)."""
        if packet.type == mqtt.PUBLISH:
            message = mqtt.parse_publish(packet)
            out = mqtt.publish(message.topic, message.payload, message.qos, message.packet_id)
            sends = [(subscriber, out) for subscriber in self.subscribers.get(message.topic, ())]
            if message.qos:
                sends.append((sender, mqtt.puback(message.packet_id)))
            return sends
        if packet.type == mqtt.CONNECT:
            return [(sender, _CONNACK)]
        if packet.type == mqtt.SUBSCRIBE:
            body = packet.body
            length = int.from_bytes(body[2:4], "big")
            topic = body[4 : 4 + length].decode()
            self.subscribers.setdefault(topic, []).append(sender)
            granted = body[4 + length : 5 + length]
            return [(sender, bytes([mqtt.SUBACK << 4, 3]) + body[:2] + granted)]
        return []

    def forget(self, client: C) -> None:
        """``client`` is gone: it subscribes to nothing any more."""
        for clients in self.subscribers.values():
            if client in clients:
                clients.remove(client)
