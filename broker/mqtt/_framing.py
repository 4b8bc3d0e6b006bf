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

    __slots__ = ("_data", "_pos", "max_packet_size")

    def __init__(self, max_packet_size: int = DEFAULT_MAX_PACKET_SIZE) -> None:
        if not 2 <= max_packet_size <= MAX_PACKET_SIZE:
            raise ValueError(f"max_packet_size must be 2-{MAX_PACKET_SIZE}")
        #: The largest packet accepted, fixed header included, in bytes.
        self.max_packet_size = max_packet_size
        self._data = b""
        self._pos = 0

    def feed(self, data: bytes) -> None:
        """Add received bytes."""
        if self._pos >= len(self._data):
            self._data = bytes(data)
        else:
            self._data = self._data[self._pos :] + data
        self._pos = 0

    @property
    def buffered(self) -> int:
        """Bytes received and not yet handed out as packets."""
        return len(self._data) - self._pos

    @property
    def first_byte(self) -> int | None:
        """The first byte of the next packet (its type and flags), as soon
        as it is received; ``None`` while nothing is buffered."""
        return self._data[self._pos] if self._pos < len(self._data) else None

    def next_span(self) -> tuple[int, bytes, int, int] | None:
        """The next whole packet as its first byte, the bytes it is in
        (valid until the next :meth:`feed`) and where its body starts and
        ends there, or ``None`` until more bytes arrive."""
        data = self._data
        size = len(data)
        first = self._pos
        if size - first < 2:
            return None
        length = data[first + 1]
        pos = first + 2
        if length & 0x80:  # (a remaining length of two or more bytes)
            length = 0
            pos = first + 1
            for shift in (0, 7, 14, 21):
                if pos >= size:
                    return None
                byte = data[pos]
                pos += 1
                length |= (byte & 0x7F) << shift
                if not byte & 0x80:
                    break
            else:
                raise malformed("the remaining length is longer than four bytes")
        end = pos + length
        if end - first > self.max_packet_size:
            raise MQTTProtocolError(
                ReasonCode.PACKET_TOO_LARGE,
                f"a packet of {end - first} bytes is larger than the maximum of "
                f"{self.max_packet_size}",
            )
        if size < end:
            return None
        self._pos = end
        return data[first], data, pos, end

    def next_packet(self) -> tuple[int, bytes] | None:
        """The next whole packet as (first byte, body), or ``None`` until
        more bytes arrive."""
        span = self.next_span()
        if span is None:
            return None
        first, data, start, end = span
        return first, data[start:end]


def packet_size(body_length: int) -> int:
    """The size of a whole packet whose body is ``body_length`` bytes."""
    return 1 + varint_size(body_length) + body_length
