"""Per-principal connection counts shared by the workers of one broker.

A principal's ``max_connections`` is a limit for the whole broker, but each
worker admits its own connections. The supervisor makes one small file of
counters (a row per worker, a column per principal, 8 bytes each); every
worker maps it, writes only its own row and sums a column to admit. No lock:
each cell has one writer. Two workers admitting the same principal at the
same instant may both see room, so the limit can be passed by at most one
connection per other worker, for as long as those connections last.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Sequence
from pathlib import Path

__all__ = ["SharedCounts", "clear_row", "create_counts"]

CELL = 8


def create_counts(path: Path, workers: int, names: Sequence[str]) -> None:
    """Make the counters file for ``workers`` rows and ``names`` (all zero)."""
    size = max(1, workers * len(names)) * CELL
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)


def clear_row(path: Path, row: int, names: Sequence[str]) -> None:
    """Zero ``row`` (its worker ended: its connections are gone)."""
    with SharedCounts(path, row, names) as counts:
        counts.clear()


class SharedCounts:
    """One worker's view of the counters file: its ``row``, and sums."""

    def __init__(self, path: Path | str, row: int, names: Sequence[str]) -> None:
        self._columns = {name: index for index, name in enumerate(sorted(names))}
        self._width = len(self._columns)
        self._row = row
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            self._map = mmap.mmap(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)
        self._cells = memoryview(self._map).cast("q")
        self._rows = len(self._cells) // max(1, self._width)

    def total(self, name: str) -> int:
        """Connections of principal ``name`` over every worker."""
        column = self._columns[name]
        cells, width = self._cells, self._width
        return sum(cells[row * width + column] for row in range(self._rows))

    def add(self, name: str, delta: int) -> None:
        """Change this worker's count of ``name`` by ``delta``."""
        index = self._row * self._width + self._columns[name]
        self._cells[index] += delta

    def clear(self) -> None:
        """Zero this worker's row."""
        start = self._row * self._width
        for index in range(start, start + self._width):
            self._cells[index] = 0

    def close(self) -> None:
        self._cells.release()
        self._map.close()

    def __enter__(self) -> SharedCounts:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
