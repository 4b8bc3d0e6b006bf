"""A term: a run of consecutive records in one buffer, sans-IO.

The active term appends into a preallocated buffer of its capacity (an
anonymous map, see :func:`new_buffer`);
committed bytes are never rewritten, so the memoryview slices handed to
readers stay valid (and unchanged) for as long as they are held, even after
the term is sealed, evicted or deleted. A sealed term's buffer may be
dropped (:meth:`Term.unload`) and later replaced by a read-only map of its
file (:meth:`Term.load`); its index of record positions stays in memory.
"""

from __future__ import annotations

import mmap
from array import array
from bisect import bisect_right
from collections.abc import Sequence

from ._format import HEADER_SIZE, Scan, record_time, record_times, write_record, write_records

__all__ = ["Buffer", "Term", "new_buffer"]

#: What a term's records live in: the active term's anonymous map, or a
#: sealed term's bytes or read-only map.
Buffer = bytearray | bytes | mmap.mmap


def new_buffer(capacity: int) -> mmap.mmap:
    """A zeroed, writable buffer for an active term: an anonymous map, so
    memory is only taken as records are written into it (a ``bytearray``
    would touch every page up front)."""
    return mmap.mmap(-1, capacity)


class Term:
    """Records ``base .. base + count - 1`` of one topic.

    ``positions[i]`` is where record ``base + i`` starts in the buffer and
    ``positions[count]`` where the last one ends (the bytes used).
    ``first_time``/``last_time`` (``None`` while empty) are the receive times
    of its first and last record: the sparse time index of the log.
    """

    __slots__ = (
        "_buffer",
        "_readonly",
        "_view",
        "base",
        "capacity",
        "first_time",
        "last_time",
        "positions",
    )

    def __init__(
        self,
        base: int,
        capacity: int,
        buffer: Buffer | None,
        scan: Scan | None = None,
    ) -> None:
        self.base = base
        self.capacity = capacity
        self._buffer: Buffer | None = buffer
        self._view: memoryview | None = None
        self._readonly: memoryview | None = None
        if buffer is not None:
            self.load(buffer)
        if scan is None:
            self.positions: array[int] = array("I", [0])
            self.first_time: int | None = None
            self.last_time: int | None = None
        else:
            self.positions = scan.positions
            self.first_time = scan.first_time
            self.last_time = scan.last_time

    # -------------------------------------------------------------- state

    @property
    def count(self) -> int:
        """How many records the term holds."""
        return len(self.positions) - 1

    @property
    def used(self) -> int:
        """How many bytes its records take (the size of its file when written)."""
        return self.positions[-1]

    @property
    def next_offset(self) -> int:
        """The offset after its last record."""
        return self.base + len(self.positions) - 1

    @property
    def loaded(self) -> bool:
        """Whether its records are in memory (or mapped)."""
        return self._view is not None

    @property
    def view(self) -> memoryview:
        """A memoryview of its buffer; the term must be loaded."""
        view = self._view
        if view is None:
            raise RuntimeError(f"term {self.base} is not loaded")
        return view

    def load(self, buffer: Buffer) -> None:
        """Give an unloaded term its buffer back (a map of its file)."""
        self._buffer = buffer
        self._view = memoryview(buffer)
        self._readonly = self._view.toreadonly()

    def unload(self) -> None:
        """Drop the buffer (slices already handed out keep it alive)."""
        self._buffer = None
        self._view = self._readonly = None

    # -------------------------------------------------------------- writing

    def append(self, body: bytes | memoryview, time_ms: int) -> int:
        """Append one record if it fits after the last one; returns its
        offset, or 0 (nothing written) if it does not fit. The caller
        checked that ``time_ms`` is not below :attr:`last_time`."""
        positions = self.positions
        pos = positions[-1]
        end = pos + HEADER_SIZE + len(body)
        if end > self.capacity:
            return 0
        view = self._view
        if view is None or view.readonly:
            raise RuntimeError(f"term {self.base} is not the active term")
        offset = self.base + len(positions) - 1
        write_record(view, pos, body, offset, time_ms)
        positions.append(end)
        if self.first_time is None:
            self.first_time = time_ms
        self.last_time = time_ms
        return offset

    def append_many(self, bodies: Sequence[bytes | memoryview], time_ms: int) -> int:
        """Append records of ``bodies``, in order, while they fit; returns how
        many it appended (fewer than all when the term filled). The caller
        checked that ``time_ms`` is not below :attr:`last_time`."""
        view = self._view
        if view is None or view.readonly:
            raise RuntimeError(f"term {self.base} is not the active term")
        positions = self.positions
        offset = self.base + len(positions) - 1
        count = write_records(view, self.capacity, bodies, offset, time_ms, positions)
        if count:
            if self.first_time is None:
                self.first_time = time_ms
            self.last_time = time_ms
        return count

    def truncate(self, count: int) -> None:
        """Forget every record after the first ``count`` (undo appends that
        were never written nor read)."""
        del self.positions[count + 1 :]
        if count == 0:
            self.first_time = self.last_time = None
        else:
            self.last_time = record_time(self.view, self.positions[count - 1])

    # -------------------------------------------------------------- reading

    def bodies(self, offset: int, max_records: int, max_bytes: int) -> list[memoryview]:
        """The bodies of records from ``offset`` on (read-only slices of the
        buffer, no copy): at most ``max_records``, and no more than ``max_bytes`` of
        stored bytes (headers included) unless the first alone is larger.
        Empty if ``offset`` is at or past the end; the term must be loaded."""
        positions = self.positions
        first = offset - self.base
        stop = min(len(positions) - 1, first + max_records)
        if first >= stop:
            return []
        limit = bisect_right(positions, positions[first] + max_bytes, first + 1, stop + 1) - 1
        stop = max(first + 1, min(stop, limit))
        view = self._readonly
        assert view is not None, "the term is loaded"
        starts = positions[first:stop]
        ends = positions[first + 1 : stop + 1]
        return [view[start + HEADER_SIZE : end] for start, end in zip(starts, ends, strict=True)]

    def stored(self, offset: int, count: int) -> memoryview:
        """The bytes of ``count`` records from ``offset`` as the term stores
        them (headers included: see ``_format``), a read-only slice of the
        buffer; they must be in this term and it loaded."""
        positions = self.positions
        first = offset - self.base
        if first < 0 or count < 1 or first + count > len(positions) - 1:
            raise ValueError(f"records {offset}+{count} are not all in term {self.base}")
        view = self._readonly
        assert view is not None, "the term is loaded"
        return view[positions[first] : positions[first + count]]

    def times(self, offset: int, count: int) -> list[int]:
        """The receive times of its records from ``offset`` on, at most
        ``count`` (fewer at its end); the term must be loaded."""
        first = offset - self.base
        stop = min(len(self.positions) - 1, first + count)
        return record_times(self.view, self.positions[first:stop])

    def offset_at_time(self, time_ms: int) -> int:
        """The offset of its first record received at or after ``time_ms``
        (:attr:`next_offset` if none); the term must be loaded."""
        view = self.view
        positions = self.positions
        low, high = 0, len(positions) - 1
        while low < high:
            middle = (low + high) // 2
            if record_time(view, positions[middle]) < time_ms:
                low = middle + 1
            else:
                high = middle
        return self.base + low
