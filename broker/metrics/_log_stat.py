"""The ``logs`` section of ``/stat.json``: the topic logs, their reliable
subscriptions and the durable cursors (a broker with a data directory).

Bounded like the rest of the document: the topics a walk details (see
:mod:`._log_walk`), up to :data:`LIST_LIMIT` subscriptions of each, and up
to :data:`LIST_LIMIT` durable cursors (the most lag first).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Final, TypedDict

from ._log_walk import LogFigures, LogReading, LogsHost, log_readers
from ._stat_schema import LOG_LIST_LIMIT, CursorRow, LogReaderRow, LogsSection, LogTopicRow
from ._walk_steps import Best, Walk

if TYPE_CHECKING:
    from broker.log import TopicLog

#: Most subscriptions listed per topic, and most durable cursors listed.
LIST_LIMIT: Final = LOG_LIST_LIMIT
#: Cursors (or topics) visited between two turns of the loop.
CHUNK: Final = 64


def cursor_parts(key: str) -> tuple[str | None, str, str]:
    """``(principal, topic, cursor name)`` of a durable cursor's stored key
    (principal None: an unauthenticated broker)."""
    principal, _, rest = key.partition("\x00")
    topic, _, name = rest.partition("\x00")
    return principal or None, topic, name


def reader_document(reader: LogReading) -> LogReaderRow:
    """One reliable log subscription."""
    key = reader.cursor_key
    return {
        "connection": reader.connection.name,
        "handle": reader.handle,
        "position": reader.next_seq,
        "acked": reader.acked,
        "lag": reader.lag,
        "gaps_sent": reader.gaps_sent,
        "cursor": cursor_parts(key)[2] if key is not None else None,
    }


class _Cursors(TypedDict):
    cursors_listed: str
    cursors_total: int
    cursors: list[CursorRow]


def _cursors(broker: LogsHost, logs: Mapping[str, TopicLog]) -> Walk[_Cursors]:
    """Every stored durable cursor (whether a live subscription uses it
    now); the :data:`LIST_LIMIT` with the most lag."""
    book = broker.cursors
    # (A copy: the walk gives the loop turns.)
    positions = book.items() if book is not None else []
    live: dict[str, LogReading] = {}
    for index, live_topic in enumerate(list(broker.topics.values())):
        if index and index % CHUNK == 0:
            yield
        for reader in log_readers(live_topic):
            if reader.cursor_key is not None:
                live[reader.cursor_key] = reader
    kept: Best[CursorRow] = Best(LIST_LIMIT)
    total = 0
    for index, (key, position) in enumerate(positions):
        if index and index % CHUNK == 0:
            yield
        total += 1
        principal, topic, name = cursor_parts(key)
        topic_log = logs.get(topic)
        lag = None
        if topic_log is not None and not topic_log.closed:
            lag = max(0, topic_log.next_offset - max(position, topic_log.first_offset))
        entry: CursorRow = {
            "principal": principal,
            "topic": topic,
            "cursor": name,
            "position": position,
            "lag": lag,
            "subscribed": key in live,
        }
        kept.offer((-1 if lag is None else lag,), entry)
    return {
        "cursors_listed": "stored",
        "cursors_total": total,
        "cursors": kept.best(),
    }


def logs_document(broker: LogsHost, figures: LogFigures | None) -> Walk[LogsSection | None]:
    """The ``logs`` section (None for a memory-only broker): see
    :class:`._stat_schema.LogsSection`."""
    if figures is None:
        return None
    topics: list[LogTopicRow] = []
    for one in figures.top:
        topic = broker.topics.get(one.name)
        readers = log_readers(topic) if topic is not None else []
        topics.append(
            {
                "name": one.name,
                "first_offset": one.first_offset,
                "last_offset": one.last_offset,
                "bytes": one.bytes,
                "terms": one.terms,
                "held": one.held,
                "blocked": one.blocked,
                "error": one.error,
                "lag": one.lag,
                "subscriptions_total": len(readers),
                "subscriptions": [reader_document(r) for r in readers[:LIST_LIMIT]],
            }
        )
        yield
    logs = broker.logs
    opened = logs.store.open_logs() if logs is not None else {}
    cursors = yield from _cursors(broker, opened)
    return {
        "data_dir": figures.data_dir,
        "free_bytes": figures.free_bytes,
        "size_bytes": figures.size_bytes,
        "topics_total": figures.logs,
        "bytes": figures.bytes,
        "terms": figures.terms,
        "blocked_topics": figures.blocked,
        "max_lag": figures.max_lag,
        "subscriptions": figures.subscriptions,
        "appends": figures.appends,
        "append_errors": figures.append_errors,
        "fsyncs": figures.fsyncs,
        "fsync_seconds": figures.fsync_seconds,
        "truncated_records": figures.truncated_records,
        "truncated_bytes": figures.truncated_bytes,
        "open_files": figures.open_files,
        "open_files_limit": figures.open_files_limit,
        "file_opens": figures.file_opens,
        "file_evictions": figures.file_evictions,
        "gap_records": figures.gap_records,
        "topics": topics,
        "cursors_listed": cursors["cursors_listed"],
        "cursors_total": cursors["cursors_total"],
        "cursors": cursors["cursors"],
    }
