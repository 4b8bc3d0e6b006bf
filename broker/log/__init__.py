"""The topic log: a retained, replayable, crash-safe log per topic.

Records (opaque bytes: the broker stores the encoded Deliver tail) are
appended at the tail of fixed-capacity *terms*, one file each, named by the
offset of their first record; whole terms are deleted by retention. Reads
return slices of the term buffers, so delivering a run of records to a
subscriber needs no copy and no re-encoding. See ``docs/topic-log.md``.

- :class:`LogStore`: a data directory (locked) holding the topics' logs.
- :class:`TopicLog`: one topic: append, read, flush, retention.
- :class:`Reader`: a position in a log; :class:`Run`: what a read returns.
"""

from __future__ import annotations

from ._errors import (
    DataDirLocked,
    DiskFull,
    LogClosed,
    LogError,
    LogFull,
    LogWriteError,
    RecordTooLarge,
    TopicDirMismatch,
)
from ._format import HEADER_SIZE
from ._log import Reader, TopicLog
from ._store import LogStore
from ._types import FlushPolicy, LogConfig, Recovery, Run, Start, WhenFull

__all__ = [
    "HEADER_SIZE",
    "DataDirLocked",
    "DiskFull",
    "FlushPolicy",
    "LogClosed",
    "LogConfig",
    "LogError",
    "LogFull",
    "LogStore",
    "LogWriteError",
    "Reader",
    "RecordTooLarge",
    "Recovery",
    "Run",
    "Start",
    "TopicDirMismatch",
    "TopicLog",
    "WhenFull",
]
