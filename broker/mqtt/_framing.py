"""Cutting a byte stream into MQTT packets: bytes split anywhere in, one
packet's fixed-header byte and body out.

The maximum packet size counts the whole packet, fixed header included (as
5.0's Maximum Packet Size does), and is checked as soon as a packet's
remaining length is read, before its body arrives: a larger packet raises
:class:`MQTTProtocolError` with 0x95 Packet too large. A remaining length
longer than four bytes raises 0x81 Malformed Packet.
"""

from __future__ import annotations

from ._codes import ReasonCode
from ._errors import MQTTProtocolError
from ._wire import malformed, varint_size

__all__ = ["DEFAULT_MAX_PACKET_SIZE", "MAX_PACKET_SIZE", "Framer"]

#: The largest packet MQTT can express: a 268,435,455-byte body, a
#: four-byte remaining length and the first byte.
MAX_PACKET_SIZE = 268_435_460
#: What a :class:`Framer` accepts unless told otherwise (1 MiB).
DEFAULT_MAX_PACKET_SIZE = 1 << 20


class Framer:
    """Buffers received bytes and hands out whole packets in order."""

    __slots__ = ("_buffer", "max_packet_size")

    def __init__(self, max_packet_size: int = DEFAULT_MAX_PACKET_SIZE) -> None:
        if not 2 <= max_packet_size <= MAX_PACKET_SIZE:
            raise ValueError(f"max_packet_size must be 2-{MAX_PACKET_SIZE}")
        #: The largest packet accepted, fixed header included, in bytes.
        self.max_packet_size = max_packet_size
        self._buffer = bytearray()

    def feed(self, data: bytes) -> None:
        """Add received bytes."""
        self._buffer += data

    @property
    def buffered(self) -> int:
        """Bytes received and not yet handed out as packets."""
        return len(self._buffer)

    @property
    def first_byte(self) -> int | None:
        """The first byte of the next packet (its type and flags), as soon
        as it is received; ``None`` while nothing is buffered."""
        return self._buffer[0] if self._buffer else None

    def next_packet(self) -> tuple[int, bytes] | None:
        """The next whole packet as (first byte, body), or ``None`` until
        more bytes arrive."""
        buffer = self._buffer
        size = len(buffer)
        if size < 2:
            return None
        length = 0
        pos = 1
        for shift in (0, 7, 14, 21):
            if pos >= size:
                return None
            byte = buffer[pos]
            pos += 1
            length |= (byte & 0x7F) << shift
            if not byte & 0x80:
                break
        else:
            raise malformed("the remaining length is longer than four bytes")
        total = pos + length
        if total > self.max_packet_size:
            raise MQTTProtocolError(
                ReasonCode.PACKET_TOO_LARGE,
                f"a packet of {total} bytes is larger than the maximum of {self.max_packet_size}",
            )
        if size < total:
            return None
        first = buffer[0]
        body = bytes(buffer[pos:total])
        del buffer[:total]
        return first, body


def packet_size(body_length: int) -> int:
    """The size of a whole packet whose body is ``body_length`` bytes."""
    return 1 + varint_size(body_length) + body_length
