"""The record format of a term, sans-IO: encode a record into a buffer and
scan a buffer for the records it holds.

A record is a 24-byte header then the record's bytes (opaque to the log)::

    0   u32  crc32 of bytes 4 .. end of record (length, offset, time, body)
    4   u32  length of the body
    8   u64  offset (topic-wide, consecutive from 1)
    16  u64  receive time, ms since the epoch (never decreasing in a topic)
    24  ...  body

All little-endian, no padding: the next record starts right after the body.
A term file is records back to back; whatever follows the last record whose
checksum, offset and time check out (zeros, a torn write, garbage) is not
part of the log.
"""

from __future__ import annotations

import mmap
import struct
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from zlib import crc32

from ._errors import RecordTooLarge

__all__ = [
    "HEADER",
    "HEADER_SIZE",
    "INDEX_HEADER",
    "MAX_BODY",
    "Scan",
    "check_size",
    "decode_index",
    "encode_index",
    "record_time",
    "record_times",
    "scan",
    "write_record",
    "write_records",
]

#: crc, length, offset, time_ms.
HEADER = struct.Struct("<IIQQ")
HEADER_SIZE = HEADER.size
_REST = struct.Struct("<IQQ")
_CRC = struct.Struct("<I")
_TIME = struct.Struct("<Q")
#: The time of a record from the start of its header.
_TIME_AT = struct.Struct("<16xQ")
#: The largest body a header can describe.
MAX_BODY = 0xFFFFFFFF


def write_record(
    view: memoryview, pos: int, body: bytes | memoryview, offset: int, time_ms: int
) -> int:
    """Write one record at ``pos`` of the writable ``view``; returns where
    the record ends. The caller checks it fits."""
    start = pos + HEADER_SIZE
    end = start + len(body)
    view[start:end] = body
    _REST.pack_into(view, pos + 4, end - start, offset, time_ms)
    _CRC.pack_into(view, pos, crc32(view[pos + 4 : end]))
    return end


def write_records(
    view: memoryview,
    limit: int,
    bodies: Sequence[bytes | memoryview],
    offset: int,
    time_ms: int,
    ends: array[int],
) -> int:
    """Write records of ``bodies`` back to back from ``ends[-1]`` of the
    writable ``view``, while they end within ``limit``: offsets from
    ``offset``, all at ``time_ms``. Appends each record's end to ``ends``;
    returns how many it wrote (the same bytes as :func:`write_record` per body)."""
    pos = ends[-1]
    pack_rest = _REST.pack_into
    pack_crc = _CRC.pack_into
    add_end = ends.append
    written = 0
    for body in bodies:
        start = pos + HEADER_SIZE
        size = len(body)
        end = start + size
        if end > limit:
            break
        view[start:end] = body
        pack_rest(view, pos + 4, size, offset + written, time_ms)
        pack_crc(view, pos, crc32(view[pos + 4 : end]))
        add_end(end)
        pos = end
        written += 1
    return written


def check_size(size: int, capacity: int) -> None:
    """Raise :class:`RecordTooLarge` unless a body of ``size`` bytes fits in
    an empty term of ``capacity`` bytes."""
    if size + HEADER_SIZE > capacity or size > MAX_BODY:
        raise RecordTooLarge(
            f"a record of {size} bytes does not fit in a term of {capacity} bytes "
            f"({HEADER_SIZE} of them its header)"
        )


def record_time(view: memoryview | bytes | bytearray, pos: int) -> int:
    """The receive time of the record whose header is at ``pos``."""
    time_ms: int = _TIME.unpack_from(view, pos + 16)[0]
    return time_ms


def record_times(view: memoryview | bytes | bytearray, positions: Iterable[int]) -> list[int]:
    """The receive times of the records whose headers are at ``positions``."""
    unpack = _TIME_AT.unpack_from
    return [unpack(view, pos)[0] for pos in positions]


@dataclass(frozen=True, slots=True)
class Scan:
    """What :func:`scan` found.

    ``positions`` holds the start of every good record then the end of the
    last one (so ``len(positions) - 1`` records); ``end`` is that end;
    ``cut`` is how many bytes after it up to the scanned limit are not
    records (0 for a clean term); ``zeros`` says whether those bytes were
    all zero (never-written space rather than damage).
    """

    positions: array[int]
    end: int
    next_offset: int
    first_time: int | None
    last_time: int | None
    cut: int
    zeros: bool

    @property
    def count(self) -> int:
        return len(self.positions) - 1


def count_cut(
    data: memoryview | bytes | bytearray | mmap.mmap, start: int, limit: int, first_offset: int
) -> int:
    """How many records ``data[start:limit]`` (what :func:`scan` stopped at)
    seems to hold, for the report of what recovery cut: the bad record, then
    the headers that follow it by their sizes with consecutive offsets
    (checksums not checked); a torn last record is no record. When the bad
    record's own size is what is damaged (nothing follows it by that size),
    the record after it is looked for by its offset and checksum, and
    counted on from there."""
    view = data if isinstance(data, memoryview) else memoryview(data)
    count = _count_from(view, start, limit, first_offset)
    if count <= 1:
        after = _find_record(view, start + 1, limit, first_offset + 1)
        if after is not None:
            return 1 + _count_from(view, after, limit, first_offset + 1)
    return count


def _count_from(view: memoryview, start: int, limit: int, first_offset: int) -> int:
    unpack = HEADER.unpack_from
    pos = start
    count = 0
    while pos + HEADER_SIZE <= limit:
        _, size, offset, _ = unpack(view, pos)
        end = pos + HEADER_SIZE + size
        if end > limit or (count and offset != first_offset + count):
            break
        count += 1
        pos = end
    return count


def _find_record(view: memoryview, start: int, limit: int, offset: int) -> int | None:
    """Where in ``view[start:limit]`` a whole record of ``offset`` with a good
    checksum starts (None if nowhere)."""
    wanted = struct.pack("<Q", offset)
    raw = bytes(view[:limit])
    at = raw.find(wanted, start + 8)
    while at != -1:
        pos = at - 8  # (crc and size come before the offset)
        crc, size, _, _ = HEADER.unpack_from(raw, pos)
        end = pos + HEADER_SIZE + size
        if end <= limit and crc32(raw[pos + 4 : end]) == crc:
            return pos
        at = raw.find(wanted, at + 1)
    return None


def scan(
    data: memoryview | bytes | bytearray | mmap.mmap,
    limit: int,
    first_offset: int,
    min_time: int = 0,
) -> Scan:
    """Find the records at the start of ``data[:limit]``: consecutive offsets
    from ``first_offset``, times never below ``min_time`` nor decreasing,
    each checksum good. Stops at the first record that breaks any of these
    or runs past ``limit`` (a torn tail)."""
    view = data if isinstance(data, memoryview) else memoryview(data)
    unpack = HEADER.unpack_from
    positions = array("I", [0])
    pos = 0
    expected = first_offset
    last_time = min_time
    first_time: int | None = None
    while pos + HEADER_SIZE <= limit:
        crc, size, offset, time_ms = unpack(view, pos)
        end = pos + HEADER_SIZE + size
        if (
            offset != expected
            or end > limit
            or time_ms < last_time
            or crc32(view[pos + 4 : end]) != crc
        ):
            break
        if first_time is None:
            first_time = time_ms
        last_time = time_ms
        expected += 1
        pos = end
        positions.append(pos)
    cut = limit - pos
    zeros = cut == 0 or view[pos:limit].tobytes().count(0) == cut
    return Scan(
        positions=positions,
        end=pos,
        next_offset=expected,
        first_time=first_time,
        last_time=None if first_time is None else last_time,
        cut=cut,
        zeros=zeros,
    )


# ---------------------------------------------------------------- term index

#: magic, record count, term bytes, first time, last time, crc32 of the
#: whole term, crc32 of the positions that follow.
INDEX_HEADER = struct.Struct("<4sIQQQII")
INDEX_MAGIC = b"TLX1"


def encode_index(positions: array[int], first_time: int, last_time: int, term_crc: int) -> bytes:
    """The index of a sealed term: its header, then ``positions`` as u32."""
    table = array("I", positions)
    if table.itemsize != 4:  # pragma: no cover - every platform we run on
        raise RuntimeError("array('I') is not 32-bit here")
    raw = table.tobytes() if _LITTLE else _swapped(table)
    header = INDEX_HEADER.pack(
        INDEX_MAGIC,
        len(positions) - 1,
        positions[-1],
        first_time,
        last_time,
        term_crc,
        crc32(raw),
    )
    return header + raw


def decode_index(data: bytes, term_size: int, base: int) -> tuple[Scan, int] | None:
    """The records of a sealed term of ``term_size`` bytes from offset
    ``base`` as its index
    describes them, and the crc32 of the whole term it promises (to check
    against the term file); ``None`` if the index is torn, corrupt or not
    for a term of that size."""
    size = INDEX_HEADER.size
    if len(data) < size:
        return None
    magic, count, used, first_time, last_time, term_crc, table_crc = INDEX_HEADER.unpack_from(data)
    raw = data[size:]
    if (
        magic != INDEX_MAGIC
        or used != term_size
        or len(raw) != 4 * (count + 1)
        or crc32(raw) != table_crc
        or count == 0
    ):
        return None
    positions = array("I")
    positions.frombytes(raw)
    if not _LITTLE:  # pragma: no cover
        positions.byteswap()
    if positions[0] != 0 or positions[-1] != used:
        return None
    scan = Scan(positions, used, base + count, first_time, last_time, 0, True)
    return scan, term_crc


_LITTLE = array("I", [1]).tobytes()[0] == 1


def _swapped(table: array[int]) -> bytes:  # pragma: no cover - big-endian hosts
    copy = array("I", table)
    copy.byteswap()
    return copy.tobytes()
