"""How many topic log files a store holds open at once: a bound, kept by
closing the least recently used one.

A log holds descriptors for its active term's file and for each sealed
term it keeps mapped for reads (CPython's ``mmap`` keeps a duplicate of
the file's descriptor for the map's life, until Python 3.13's
``trackfd=False``); directory syncs, index files and recovery open theirs
only for the call. A store of thousands of topics would otherwise hold
thousands of descriptors and leave none for connections. The store's
:class:`OpenFiles` admits each file and map as it opens and, at the limit,
gives back the descriptor of the least recently used one first. A term
file opens again at its next write (a ``pwrite`` and, at the batch's end,
an fsync: its append position and what is durable live in the log, not
the file); a map is made again at the next read of its term.

A file is never closed with a write not fsynced: one that is not synced
yet is synced first (on the caller's thread), and kept open if that sync
fails (the log's own next sync reports it).
"""

from __future__ import annotations

import resource
from collections import OrderedDict
from collections.abc import Callable
from itertools import islice
from typing import Protocol

__all__ = ["DEFAULT_SHARE", "MIN_OPEN_FILES", "OpenFiles", "TermMaps", "default_open_files"]

#: The default bound is this share of the process's open-file limit: the
#: rest is for connections, listeners, the journal and files opened briefly.
DEFAULT_SHARE = 4
#: The smallest bound (and the default's floor).
MIN_OPEN_FILES = 16
#: The limit assumed when the process has none (Linux's default ``nr_open``).
UNLIMITED = 1 << 20
#: How many of the least recently used files eviction looks at for one it
#: can close without a sync, before it syncs the least recently used one.
_SCAN = 16


class Evictable(Protocol):
    """A file :class:`OpenFiles` can close (a ``TermFile``)."""

    @property
    def clean(self) -> bool:
        """Whether every write to it is fsynced (closing it costs nothing)."""
        ...

    def evict(self) -> bool:
        """Give back the descriptor until the next use, fsynced first if
        need be; False if it stays open (the sync failed)."""
        ...


class Mapped:
    """A sealed term's map in the bound: closing it drops the map (``unmap``;
    reads in flight keep it until they are done)."""

    __slots__ = ("_unmap",)

    #: A map has nothing to sync.
    clean = True

    def __init__(self, unmap: Callable[[], None]) -> None:
        self._unmap = unmap

    def evict(self) -> bool:
        self._unmap()
        return True


def default_open_files() -> int:
    """The default bound: a quarter of the soft ``RLIMIT_NOFILE`` (read now:
    ``broker serve`` has raised it to the hard limit), at least 16."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft > UNLIMITED:
        soft = UNLIMITED
    return max(MIN_OPEN_FILES, soft // DEFAULT_SHARE)


class OpenFiles:
    """The open term files of a store's logs, least recently used first,
    at most ``limit`` of them (see the module)."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"the open file bound must be at least 1, got {limit}")
        self.limit = limit
        self._open: OrderedDict[Evictable, None] = OrderedDict()
        #: Files opened (first opens and opens again), for a metric.
        self.opens = 0
        #: Files closed to stay within the limit, and of those, how many had
        #: to be fsynced first.
        self.evictions = 0
        self.eviction_syncs = 0

    def __len__(self) -> int:
        """How many are open now."""
        return len(self._open)

    def make_room(self) -> None:
        """Before a file opens: close the least recently used ones until one
        more fits (as many as can be closed)."""
        while len(self._open) >= self.limit and self.evict_one():
            pass

    def evict_one(self) -> bool:
        """Close one open file, preferring among the least recently used
        one that needs no sync; False if none could be closed."""
        oldest = list(islice(self._open, _SCAN))
        for file in oldest:
            if file.clean and file.evict():
                self.evictions += 1
                return True
        for file in oldest:
            if file.evict():
                self.evictions += 1
                self.eviction_syncs += 1
                return True
        return False

    def opened(self, file: Evictable) -> None:
        """``file`` has just opened: the most recently used."""
        self._open[file] = None
        self._open.move_to_end(file)
        self.opens += 1

    def used(self, file: Evictable) -> None:
        """``file`` is being used: the most recently used."""
        if file in self._open:
            self._open.move_to_end(file)

    def closed(self, file: Evictable) -> None:
        """``file`` gave its descriptor back."""
        self._open.pop(file, None)


class TermMaps:
    """A log's sealed terms kept mapped for reads, each one counted in the
    store's bound (``files``; none: not counted) while it is mapped: one
    closed for room is dropped with ``unmap(base)``."""

    __slots__ = ("_files", "_maps", "_unmap")

    def __init__(self, files: OpenFiles | None, unmap: Callable[[int], None]) -> None:
        self._files = files
        self._unmap = unmap
        self._maps: dict[int, Mapped] = {}

    def used(self, base: int) -> None:
        """Term ``base`` is mapped and was just read."""
        files = self._files
        if files is None:
            return
        entry = self._maps.get(base)
        if entry is not None:
            files.used(entry)
            return
        files.make_room()
        entry = self._maps[base] = Mapped(lambda: self._unmap(base))
        files.opened(entry)

    def closed(self, base: int) -> None:
        """Term ``base`` is no longer mapped (or never was)."""
        entry = self._maps.pop(base, None)
        if entry is not None and self._files is not None:
            self._files.closed(entry)
