"""The typed errors of the topic log.

Every error the log raises on purpose is a :class:`LogError`; the ones that
come from the disk are also :class:`OSError` (with the original ``errno``),
so a caller may catch either.
"""

from __future__ import annotations

__all__ = [
    "DataDirLocked",
    "DiskFull",
    "LogClosed",
    "LogError",
    "LogFull",
    "LogWriteError",
    "RecordTooLarge",
    "TopicDirMismatch",
]


class LogError(Exception):
    """Base class of everything the topic log raises on purpose."""


class LogFull(LogError):
    """The log refused an append: retention wants to delete its oldest term
    (``when_full="block"``) but a registered reader still needs it.

    Nothing was appended; the log accepts appends again once the readers
    holding the oldest term move past it (or close).
    """


class RecordTooLarge(LogError, ValueError):
    """A record does not fit in one term (raise ``term_bytes``)."""


class LogClosed(LogError):
    """The log (or its store) was closed."""


class LogWriteError(LogError, OSError):
    """Writing or syncing a term file failed.

    The append that hit it did not happen (nothing of it is visible to
    readers or on disk), or, for a failed :meth:`TopicLog.flush`, the records
    stay in memory and are written by a later flush; the log stays
    consistent and accepts appends again once the disk does.
    """


class DiskFull(LogWriteError):
    """:class:`LogWriteError` for a full disk or quota (``ENOSPC``, ``EDQUOT``)."""


class DataDirLocked(LogError):
    """Another process (or another :class:`LogStore` in this one) holds the
    data directory's lock."""


class TopicDirMismatch(LogError):
    """A topic directory's metadata names another topic (or a newer format)."""
