"""MQTT's data representations (spec 1.5): integers, variable byte
integers, UTF-8 strings, binary data; a reader over one packet's bytes and
the writers' helpers.

Every fault in received bytes raises :class:`MQTTProtocolError` with 0x81
Malformed Packet: running off the end, a variable byte integer longer than
four bytes, a string that is not UTF-8, holds U+0000 or a surrogate.
"""

from __future__ import annotations

from ._codes import ReasonCode
from ._errors import MQTTProtocolError, MQTTUsageError

__all__ = [
    "MAX_VARINT",
    "Reader",
    "binary",
    "string",
    "string_problem",
    "u16",
    "u32",
    "varint",
    "varint_size",
]

#: The largest variable byte integer (four bytes of seven bits).
MAX_VARINT = 268_435_455
#: The longest string or binary field (a two-byte length).
MAX_FIELD = 65_535


def malformed(message: str) -> MQTTProtocolError:
    """A Malformed Packet error with ``message``."""
    return MQTTProtocolError(ReasonCode.MALFORMED_PACKET, message)


def string_problem(text: str) -> str | None:
    """``None`` if ``text`` may be an MQTT UTF-8 string (no U+0000, no
    surrogates, at most 65,535 bytes encoded), else why not."""
    if "\x00" in text:
        return "a string holds U+0000"
    try:
        size = len(text.encode())
    except UnicodeEncodeError:
        return "a string holds a surrogate"
    if size > MAX_FIELD:
        return f"a string of {size} bytes is longer than 65535"
    return None


class Reader:
    """Reads MQTT fields from one packet's bytes, front to back."""

    __slots__ = ("data", "end", "pos")

    def __init__(self, data: bytes, pos: int = 0) -> None:
        self.data = data
        self.pos = pos
        self.end = len(data)

    @property
    def remaining(self) -> int:
        """Bytes not read yet."""
        return self.end - self.pos

    def _take(self, count: int, what: str) -> bytes:
        start = self.pos
        stop = start + count
        if stop > self.end:
            raise malformed(f"the packet ends inside {what}")
        self.pos = stop
        return self.data[start:stop]

    def u8(self, what: str = "a byte") -> int:
        """One byte."""
        if self.pos >= self.end:
            raise malformed(f"the packet ends before {what}")
        value = self.data[self.pos]
        self.pos += 1
        return value

    def u16(self, what: str = "a two-byte integer") -> int:
        """A big-endian two-byte integer."""
        return int.from_bytes(self._take(2, what), "big")

    def u32(self, what: str = "a four-byte integer") -> int:
        """A big-endian four-byte integer."""
        return int.from_bytes(self._take(4, what), "big")

    def varint(self, what: str = "a variable byte integer") -> int:
        """A variable byte integer of at most four bytes, in its shortest form
        or not (the spec asks senders for the shortest; receivers accept both)."""
        value = 0
        for shift in (0, 7, 14, 21):
            byte = self.u8(what)
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
        raise malformed(f"{what} is longer than four bytes")

    def binary(self, what: str = "binary data") -> bytes:
        """Binary data: a two-byte length, then that many bytes."""
        return self._take(self.u16(what), what)

    def string(self, what: str = "a string") -> str:
        """A UTF-8 string: a two-byte length, then UTF-8 without U+0000
        (Python's strict decoder also refuses encoded surrogates)."""
        raw = self._take(self.u16(what), what)
        try:
            text = raw.decode()
        except UnicodeDecodeError:
            raise malformed(f"{what} is not well-formed UTF-8") from None
        if "\x00" in text:
            raise malformed(f"{what} holds U+0000")
        return text

    def rest(self) -> bytes:
        """Every byte not read yet."""
        return self._take(self.remaining, "the rest")


def u16(value: int) -> bytes:
    """A two-byte big-endian integer."""
    return value.to_bytes(2, "big")


def u32(value: int) -> bytes:
    """A four-byte big-endian integer."""
    return value.to_bytes(4, "big")


def varint(value: int) -> bytes:
    """``value`` (0 to :data:`MAX_VARINT`) as a variable byte integer."""
    if not 0 <= value <= MAX_VARINT:
        raise MQTTUsageError(
            ReasonCode.PACKET_TOO_LARGE, f"{value} does not fit a variable byte integer"
        )
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def varint_size(value: int) -> int:
    """How many bytes :func:`varint` makes of ``value``."""
    return 1 if value < 0x80 else 2 if value < 0x4000 else 3 if value < 0x200000 else 4


def string(text: str) -> bytes:
    """``text`` as an MQTT UTF-8 string (refused if :func:`string_problem`)."""
    problem = string_problem(text)
    if problem is not None:
        raise MQTTUsageError(ReasonCode.MALFORMED_PACKET, problem)
    raw = text.encode()
    return len(raw).to_bytes(2, "big") + raw


def binary(data: bytes) -> bytes:
    """``data`` as MQTT binary data (at most 65,535 bytes)."""
    if len(data) > MAX_FIELD:
        raise MQTTUsageError(
            ReasonCode.MALFORMED_PACKET, f"binary data of {len(data)} bytes is longer than 65535"
        )
    return len(data).to_bytes(2, "big") + bytes(data)
