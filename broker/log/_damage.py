"""Finding the intact records of a damaged term file, sans-IO.

A term file whose records do not all check out (a flipped byte, a zeroed
range, a torn write) still holds intact records after the damage: they are
found again by the term's index (where each record starts, if the index
file is whole) or else by searching for the next offset's header with a
good checksum. What recovery keeps of the file is the runs of intact
records (:class:`Segment`); what lies between and after them is damage.
"""

from __future__ import annotations

import mmap
import struct
from array import array
from dataclasses import dataclass
from zlib import crc32

from ._format import HEADER, HEADER_SIZE, INDEX_HEADER, INDEX_MAGIC, Scan, scan

__all__ = ["Findings", "Segment", "find_intact", "index_table"]

_OFFSET = struct.Struct("<Q")
#: Bytes a search for the records after a damaged one may scan in one term
#: (without an index to say where they are): past it, the rest is damage.
SEARCH_BUDGET = 256 << 20

Data = bytes | mmap.mmap


@dataclass(frozen=True, slots=True)
class Segment:
    """A run of consecutive intact records at byte ``start`` of a term file
    (``scan.positions`` count from ``start``)."""

    start: int
    scan: Scan

    @property
    def base(self) -> int:
        """The offset of its first record."""
        return self.scan.next_offset - self.scan.count

    @property
    def next_offset(self) -> int:
        return self.scan.next_offset

    @property
    def end(self) -> int:
        """Where its last record ends in the file."""
        return self.start + self.scan.end


@dataclass(frozen=True, slots=True)
class Findings:
    """What :func:`find_intact` found in a term file: its intact ``segments``
    in order; ``tail`` bytes after the last one (from ``tail_start``) are
    not records, and ``tail_seen`` records can be told there by their
    headers (offsets following the last record, the last maybe torn)."""

    segments: list[Segment]
    tail_start: int
    tail: int
    tail_seen: int

    @property
    def whole(self) -> bool:
        """Whether the file is records from its first byte to its last."""
        return self.tail == 0 and (
            not self.segments or (len(self.segments) == 1 and self.segments[0].start == 0)
        )

    @property
    def tail_only(self) -> bool:
        """Whether the only damage is at its end (the records from its first
        byte on are intact up to ``tail_start``)."""
        return not self.segments or (len(self.segments) == 1 and self.segments[0].start == 0)


def index_table(raw: bytes | None) -> array[int] | None:
    """The record positions an index file holds, if it is whole (its magic
    and the checksum of its table), whatever the term file's size now."""
    if raw is None or len(raw) < INDEX_HEADER.size:
        return None
    magic, count, _, _, _, _, table_crc = INDEX_HEADER.unpack_from(raw)
    table = raw[INDEX_HEADER.size :]
    if magic != INDEX_MAGIC or len(table) != 4 * (count + 1) or crc32(table) != table_crc:
        return None
    positions = array("I")
    positions.frombytes(table)
    if positions.tobytes() != table:  # pragma: no cover - big-endian hosts
        positions.byteswap()
    return positions


def find_intact(
    data: Data,
    base: int,
    min_time: int,
    *,
    table: array[int] | None = None,
    last_offset: int | None = None,
) -> Findings:
    """The intact records of the term file ``data`` whose first offset is
    ``base``: consecutive offsets, times never below ``min_time`` nor
    decreasing, good checksums. After a record that is not, the next intact
    one is found by ``table`` (the positions of the term's index) or by its
    header, up to offset ``last_offset`` (None: as many as could fit)."""
    view = memoryview(data)
    limit = len(data)
    segments: list[Segment] = []
    pos = 0
    expected = base
    time_ms = min_time
    budget = [SEARCH_BUDGET]
    while True:
        found = scan(view[pos:], limit - pos, expected, time_ms)
        if found.count:
            segments.append(Segment(pos, found))
            expected = found.next_offset
            assert found.last_time is not None
            time_ms = found.last_time
        end = pos + found.end
        if end >= limit:
            break
        if table is not None:
            hit = _by_table(view, table, base, end, expected + 1, time_ms)
        else:
            top = (
                last_offset if last_offset is not None else expected + (limit - end) // HEADER_SIZE
            )
            hit = _by_search(data, view, end, expected + 1, top, time_ms, budget)
        if hit is None:
            break
        pos, expected = hit
    tail_start = segments[-1].end if segments else 0
    tail = limit - tail_start
    seen = _seen(view, tail_start, limit, expected) if tail else 0
    return Findings(segments, tail_start, tail, seen)


def _intact_at(view: memoryview, pos: int, offset: int, min_time: int, size: int = -1) -> bool:
    """Whether a whole record of ``offset`` (of ``size`` bytes of body, if
    given) with a good checksum and a time not below ``min_time`` starts at ``pos``."""
    if pos < 0 or pos + HEADER_SIZE > len(view):
        return False
    crc, length, found, time_ms = HEADER.unpack_from(view, pos)
    end = pos + HEADER_SIZE + length
    return bool(
        found == offset
        and (size < 0 or length == size)
        and end <= len(view)
        and time_ms >= min_time
        and crc32(view[pos + 4 : end]) == crc
    )


def _by_table(
    view: memoryview, table: array[int], base: int, start: int, first: int, min_time: int
) -> tuple[int, int] | None:
    """The position and offset of the first intact record from offset
    ``first`` on, at or after byte ``start``, where the index says it is."""
    for offset in range(first, base + len(table) - 1):
        index = offset - base
        pos = table[index]
        size = table[index + 1] - pos - HEADER_SIZE
        if pos >= start and _intact_at(view, pos, offset, min_time, size):
            return pos, offset
    return None


def _by_search(
    data: Data,
    view: memoryview,
    start: int,
    first: int,
    last: int,
    min_time: int,
    budget: list[int],
) -> tuple[int, int] | None:
    """The position and offset of the first intact record of offsets
    ``first .. last`` after byte ``start``, found by its offset field (and
    then its checksum); None once ``budget`` bytes were searched."""
    limit = len(view)
    for offset in range(first, last + 1):
        wanted = _OFFSET.pack(offset)
        at = data.find(wanted, start + 1 + 8)
        while at != -1:
            if _intact_at(view, at - 8, offset, min_time):
                return at - 8, offset
            at = data.find(wanted, at + 1)
        budget[0] -= limit - start
        if budget[0] <= 0:
            return None
    return None


def _seen(view: memoryview, pos: int, limit: int, offset: int) -> int:
    """How many records from ``offset`` on the headers at ``pos`` tell of
    (checksums not checked, the last maybe torn): what a cut tail held."""
    count = 0
    while pos + 16 <= limit:
        found = _OFFSET.unpack_from(view, pos + 8)[0]
        if found != offset + count:
            break
        count += 1
        if pos + HEADER_SIZE > limit:
            break
        pos += HEADER_SIZE + HEADER.unpack_from(view, pos)[1]
    return count
