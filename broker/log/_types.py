"""The small value types of the topic log: its configuration, where a
reader starts, what a read returns, and what recovery cut."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ._format import HEADER_SIZE

__all__ = ["FlushPolicy", "LogConfig", "Recovery", "Run", "Start", "WhenFull"]

FlushPolicy = Literal["batch", "always"]
WhenFull = Literal["block", "drop-oldest"]

_MIN_TERM = 4 * HEADER_SIZE
_MAX_TERM = 0xFFFFFFFF  # positions are u32


@dataclass(frozen=True, slots=True)
class LogConfig:
    """How a topic log keeps its records.

    - ``term_bytes``: capacity of a term (one file, one in-memory buffer
      while active); the largest record is ``term_bytes - 24`` bytes.
    - ``retain_bytes``: delete whole terms, oldest first, once the terms
      (the active one counted at full capacity) would exceed it; the active
      and the newest sealed term are never deleted. ``None``: no limit.
    - ``retain_seconds``: a sealed term whose newest record is older than
      this is deleted by :meth:`TopicLog.expire`. ``None``: no limit.
    - ``when_full``: ``"block"`` refuses appends (:class:`LogFull`) rather
      than delete, for ``retain_bytes``, a term a registered reader still
      needs (``retain_seconds`` then simply waits); ``"drop-oldest"``
      deletes it, and such a reader is told how many records it missed.
    - ``flush``: ``"batch"`` writes appended records at the next
      :meth:`TopicLog.write`/:meth:`TopicLog.flush_due` (the end of the
      caller's batch) and fsyncs at most ``flush_interval_ms`` after;
      ``"always"`` writes and fsyncs before an append returns.
    - ``mapped_terms``: how many sealed terms to keep in memory or mapped.
    """

    term_bytes: int = 64 * 1024 * 1024
    retain_bytes: int | None = None
    retain_seconds: float | None = None
    when_full: WhenFull = "drop-oldest"
    flush: FlushPolicy = "batch"
    flush_interval_ms: int = 1000
    mapped_terms: int = 8

    def __post_init__(self) -> None:
        if not _MIN_TERM <= self.term_bytes <= _MAX_TERM:
            raise ValueError(f"term_bytes must be {_MIN_TERM} to {_MAX_TERM}")
        if self.retain_bytes is not None and self.retain_bytes <= 0:
            raise ValueError("retain_bytes must be positive (or None)")
        if self.retain_seconds is not None and self.retain_seconds <= 0:
            raise ValueError("retain_seconds must be positive (or None)")
        if self.when_full not in ("block", "drop-oldest"):
            raise ValueError('when_full must be "block" or "drop-oldest"')
        if self.flush not in ("batch", "always"):
            raise ValueError('flush must be "batch" or "always"')
        if self.flush_interval_ms < 0:
            raise ValueError("flush_interval_ms must be >= 0")
        if self.mapped_terms < 1:
            raise ValueError("mapped_terms must be >= 1")


@dataclass(frozen=True, slots=True)
class Start:
    """Where a reader starts. Build with :meth:`earliest`, :meth:`latest`,
    :meth:`at`, :meth:`from_time` or :meth:`last`."""

    kind: Literal["earliest", "latest", "offset", "time", "last"]
    value: int = 0

    @classmethod
    def earliest(cls) -> Start:
        """The first retained record."""
        return cls("earliest")

    @classmethod
    def latest(cls) -> Start:
        """The next record appended (nothing already in the log)."""
        return cls("latest")

    @classmethod
    def at(cls, offset: int) -> Start:
        """Offset ``offset`` (>= 1). Beyond the end: the reader waits for it;
        before the first retained record: starts there, reporting the gap."""
        if offset < 1:
            raise ValueError("offsets start at 1")
        return cls("offset", offset)

    @classmethod
    def from_time(cls, time_ms: int) -> Start:
        """The first record received at or after ``time_ms`` (ms since the
        epoch); the next one appended if there is none yet."""
        return cls("time", time_ms)

    @classmethod
    def last(cls, n: int) -> Start:
        """The last ``n`` records (``n >= 1``): offset ``next_offset - n``, or
        the first retained record if the log holds fewer."""
        if n < 1:
            raise ValueError("last(n) needs n >= 1")
        return cls("last", n)


@dataclass(frozen=True, slots=True)
class Run:
    """A run of consecutive records read from a log.

    ``tails[i]`` is the body of record ``first_offset + i``, a read-only
    slice of a term buffer (no copy; valid as long as it is held). ``gap``
    is how many records before ``first_offset`` the reader asked for but
    were deleted by retention or lost to damage of the log's files (see
    :class:`Recovery`; 0 normally).
    """

    first_offset: int
    tails: list[memoryview]
    gap: int = 0

    @property
    def next_offset(self) -> int:
        """The offset after the run."""
        return self.first_offset + len(self.tails)


@dataclass(frozen=True, slots=True)
class Recovery:
    """What opening a log found lost: ``cut_bytes`` of torn or corrupt data
    (cut from the end of the last term, or set aside with a damaged term),
    ``cut_records`` records lost that an earlier opening had not reported
    (damaged, in a term file gone, or missing at the end of the log),
    ``cut_terms`` term files set aside as damaged; ``details`` says which
    offsets and why, one sentence each. ``gaps`` are the ranges
    ``(first offset, count)`` missing inside the log (new or known): readers
    get a gap for them. All zero (and no gaps) after a clean close."""

    cut_bytes: int = 0
    cut_records: int = 0
    cut_terms: int = 0
    details: list[str] = field(default_factory=list)
    gaps: list[tuple[int, int]] = field(default_factory=list)

    @property
    def gap_records(self) -> int:
        """How many records are missing inside the log (readers get a gap)."""
        return sum(count for _, count in self.gaps)

    @property
    def clean(self) -> bool:
        return not (self.cut_bytes or self.cut_records or self.cut_terms)
