"""The MQTT package's errors: the peer broke the protocol, or the
application asked for something the protocol forbids."""

from __future__ import annotations

from broker.errors import BrokerError

from ._codes import ReasonCode

__all__ = ["MQTTError", "MQTTProtocolError", "MQTTUsageError", "PacketTooLargeForPeer"]


class MQTTError(BrokerError):
    """Base of this package's errors: a reason code and a one-line message."""

    def __init__(self, reason: ReasonCode, message: str) -> None:
        super().__init__(message)
        #: The MQTT 5.0 reason code that names the problem.
        self.reason = reason
        #: One line saying what was wrong (never echoes payloads).
        self.message = message

    def __str__(self) -> str:
        return f"{self.message} ({self.reason.name}, 0x{self.reason:02X})"


class MQTTProtocolError(MQTTError):
    """Bytes or packets received from the peer break MQTT: the only error
    decoding and the connection raise for what the peer sent. ``reason`` is
    what a 5.0 DISCONNECT (or CONNACK) answers with, e.g. 0x81 Malformed
    Packet, 0x82 Protocol Error, 0x95 Packet too large."""


class MQTTUsageError(MQTTError):
    """The application asked the connection or the codec for something MQTT
    forbids (sending before CONNACK, acknowledging an unknown packet id,
    exceeding the client's receive maximum...). A bug in the caller."""


class PacketTooLargeForPeer(MQTTUsageError):
    """A packet to send is larger than the client's Maximum Packet Size: MQTT
    says to drop it as if it had been sent (reason 0x95)."""
