"""The topic log: a retained, replayable, crash-safe log per topic.

Records (opaque bytes: the broker stores the encoded Deliver tail) are
appended at the tail of fixed-capacity *terms*, one file each, named by the
offset of their first record; whole terms are deleted by retention. Reads
return slices of the term buffers, so delivering a run of records to a
subscriber needs no copy and no re-encoding. See ``docs/topic-log.md``.

- :class:`LogStore`: a data directory (locked) holding the topics' logs.
- :class:`TopicLog`: one topic: append, read, flush, retention.
- :class:`Reader`: a position in a log; :class:`Run`: what a read returns.
- :class:`StoredTopic`, :func:`list_stored_topics`: the stored topics, read
  cheaply without opening their logs (``store.list_topics()``).
- :func:`encode_run`, :func:`decode_run`: consecutive records as one
  message body (a replicated topic's runs), checked when read back.
- :class:`StateJournal`: the broker's own state (cursors, sessions, staged
  batches), crash-safe, in ``<data_dir>/state.journal`` (``store.journal``).

How a broker uses it (time is always passed in, ms since the epoch)::

    store = LogStore(data_dir, LogConfig(retain_bytes=..., flush="batch"))
    log = store.topic(name)
    offset = log.append(encode_deliver_tail(payload, key, headers), now_ms)
    ...
    log.flush_due(now_ms)              # at the end of each batch of publishes
    log.expire(now_ms)                 # now and then (retain_seconds)

    reader = log.reader(Start.from_time(t))          # per replaying subscription
    run = reader.read(max_records=credit)
    sent = connection.deliver_encoded_many(sub, seq, run.tails)   # run.gap: missed
    reader.advance_to(run.first_offset + sent)
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
from ._files import DirLock, unopened_due
from ._format import HEADER_SIZE
from ._journal import JournalFormatError, StateJournal
from ._listing import StoredTopic, list_stored_topics
from ._log import Reader, TopicLog
from ._runs import DecodedRun, RunDamaged, decode_run, encode_run
from ._store import JOURNAL_NAME, WORKERS, LogStore
from ._types import FlushPolicy, LogConfig, Recovery, Run, Start, WhenFull

__all__ = [
    "HEADER_SIZE",
    "JOURNAL_NAME",
    "WORKERS",
    "DataDirLocked",
    "DecodedRun",
    "DirLock",
    "DiskFull",
    "FlushPolicy",
    "JournalFormatError",
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
    "RunDamaged",
    "Start",
    "StateJournal",
    "StoredTopic",
    "TopicDirMismatch",
    "TopicLog",
    "WhenFull",
    "decode_run",
    "encode_run",
    "list_stored_topics",
    "unopened_due",
]
