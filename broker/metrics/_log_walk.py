"""The topic logs' part of a walk: every open log's figures, summed, and the few topics detailed.

:func:`log_walk` visits every log the broker has open (a topic's log stays
open after its topic actor is released), :data:`~._walking.Walk`-style, a
chunk at a time; :func:`add_log_families` turns its result into the
families of :mod:`._log_specs`. A memory-only broker has no logs: the walk
returns ``None`` and the families stay without series.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, cast

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from ._walk_steps import Best, Walk

if TYPE_CHECKING:
    from broker.server import Topic
    from broker.server.storage._topic_logs import TopicLogs
    from broker.server.topics._log_subscription import CursorBook

#: Longest topic name exported as a label value (a valid name never is longer).
TOPIC_LABEL_LIMIT = 256


class LogsHost(Protocol):
    """What the log figures read of the broker (``Broker`` is one)."""

    @property
    def logs(self) -> TopicLogs | None:
        """The broker's topic logs (None: memory-only)."""
        ...

    @property
    def topics(self) -> Mapping[str, Topic]: ...

    @property
    def cursors(self) -> CursorBook | None: ...


class _Named(Protocol):
    @property
    def name(self) -> str: ...


class LogReading(Protocol):
    """What a reliable subscription that reads its topic's log shows (the
    server's ``LogSubscription``; ``reads_log`` is true of it)."""

    @property
    def connection(self) -> _Named: ...
    @property
    def handle(self) -> int: ...
    @property
    def next_seq(self) -> int:
        """The next offset it sends."""
        ...

    @property
    def acked(self) -> int:
        """The last offset its subscriber processed."""
        ...

    @property
    def lag(self) -> int:
        """Records retained and not processed yet."""
        ...

    @property
    def gaps_sent(self) -> int: ...
    @property
    def cursor_key(self) -> str | None: ...


def log_readers(topic: Topic) -> list[LogReading]:
    """The subscriptions of ``topic`` that read its log."""
    return [cast("LogReading", s) for s in topic.subscriptions if s.reads_log]


def disk_usage(path: str | os.PathLike[str]) -> tuple[int, int] | None:
    """``(free, size)`` in bytes of the file system holding ``path`` (free: what
    an unprivileged process may still write), or None if it cannot be read."""
    try:
        stat = os.statvfs(path)
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize, stat.f_blocks * stat.f_frsize


@dataclass(frozen=True, slots=True)
class TopicLogFigures:
    """One topic's log as a walk saw it (no reference to the log or topic)."""

    name: str
    first_offset: int
    last_offset: int
    bytes: int
    terms: int
    #: Batches of publishes waiting for room in the log or for the disk.
    held: int
    #: The last append error, while batches wait (its text).
    error: str | None
    #: The largest lag of its reliable subscriptions, in records.
    lag: int
    #: Its reliable subscriptions (reading the log).
    subscriptions: int

    @property
    def blocked(self) -> bool:
        """Whether its publishers wait (a batch is held)."""
        return self.held > 0


@dataclass(slots=True)
class LogFigures:
    """Every open log's figures summed, the broker's log counters, and the
    detailed topics (``top``: the most bytes, blocked first, then the most lag)."""

    data_dir: str
    #: The data directory's file system: bytes free and its size (None: unreadable).
    free_bytes: int | None = None
    size_bytes: int | None = None
    logs: int = 0
    bytes: int = 0
    terms: int = 0
    blocked: int = 0
    max_lag: int = 0
    subscriptions: int = 0
    appends: int = 0
    append_errors: int = 0
    fsyncs: int = 0
    fsync_seconds: float = 0.0
    fsync_buckets: list[tuple[str, float]] = field(default_factory=list)
    truncated_records: int = 0
    truncated_bytes: int = 0
    #: Term files open now, their bound, files opened and closed for the bound.
    open_files: int = 0
    open_files_limit: int = 0
    file_opens: int = 0
    file_evictions: int = 0
    gap_records: int = 0
    top: list[TopicLogFigures] = field(default_factory=list)


def log_walk(broker: LogsHost, top: int, chunk: int) -> Walk[LogFigures | None]:
    """The figures of ``broker``'s topic logs (None for a memory-only broker),
    yielding after every ``chunk`` logs. Details ``top`` topics with the most
    bytes (blocked ones first) and up to ``top`` more with the most lag."""
    logs = broker.logs
    if logs is None:
        return None
    data_dir = logs.store.data_dir
    figures = LogFigures(data_dir=str(data_dir))
    usage = disk_usage(data_dir)
    if usage is not None:
        figures.free_bytes, figures.size_bytes = usage
    largest: Best[TopicLogFigures] = Best(top)
    lagging: Best[TopicLogFigures] = Best(top)
    topics: Mapping[str, Topic] = broker.topics
    for index, (name, topic_log) in enumerate(logs.store.open_logs().items()):
        if index and index % chunk == 0:
            yield
        if topic_log.closed:
            continue
        recovery = topic_log.recovery
        figures.truncated_records += recovery.cut_records
        figures.truncated_bytes += recovery.cut_bytes
        figures.gap_records += topic_log.gap_records
        topic = topics.get(name)
        held = lag = readers = 0
        error = None
        if topic is not None and topic.log is topic_log:
            held = len(topic.held)
            error = str(topic.log_error) if held and topic.log_error is not None else None
            for reader in log_readers(topic):
                readers += 1
                lag = max(lag, reader.lag)
        one = TopicLogFigures(
            name=name,
            first_offset=topic_log.first_offset,
            last_offset=topic_log.next_offset - 1,
            bytes=topic_log.size_bytes,
            terms=topic_log.term_count,
            held=held,
            error=error,
            lag=lag,
            subscriptions=readers,
        )
        figures.logs += 1
        figures.bytes += one.bytes
        figures.terms += one.terms
        figures.blocked += one.blocked
        figures.max_lag = max(figures.max_lag, lag)
        figures.subscriptions += readers
        largest.offer((one.blocked, one.bytes), one)
        if lag > 0:
            lagging.offer((lag, one.bytes), one)
    detailed = largest.best()
    chosen = {one.name for one in detailed}
    figures.top = detailed + [one for one in lagging.best() if one.name not in chosen]
    figures.appends = logs.appends
    figures.append_errors = logs.append_errors
    figures.fsyncs = logs.fsyncs
    files = logs.store.files
    figures.open_files, figures.open_files_limit = len(files), files.limit
    figures.file_opens, figures.file_evictions = files.opens, files.evictions
    figures.fsync_buckets, figures.fsync_seconds = logs.fsync_times.snapshot()
    return figures


def topic_label(name: str) -> str:
    """The ``topic`` label value of topic ``name``."""
    return "".join(ch if ch.isprintable() else "\ufffd" for ch in name[:TOPIC_LABEL_LIMIT])


Family = GaugeMetricFamily | CounterMetricFamily | HistogramMetricFamily


def add_log_families(families: Mapping[str, Family], figures: LogFigures | None) -> None:
    """Add the series of ``figures`` to the log ``families`` (by name; none
    for a memory-only broker)."""
    if figures is None:
        return

    def add(name: str, labels: list[str], value: float) -> None:
        family = families[name]
        assert not isinstance(family, HistogramMetricFamily)
        family.add_metric(labels, float(value))

    add("broker_topic_logs", [], figures.logs)
    add("broker_log_bytes", [], figures.bytes)
    add("broker_subscription_max_lag_records", [], figures.max_lag)
    add("broker_topics_blocked", [], figures.blocked)
    add("broker_log_appends_total", [], figures.appends)
    add("broker_log_append_errors_total", [], figures.append_errors)
    fsync = families["broker_log_fsync_seconds"]
    assert isinstance(fsync, HistogramMetricFamily)
    fsync.add_metric([], buckets=figures.fsync_buckets, sum_value=figures.fsync_seconds)
    add("broker_log_truncated_records_total", [], figures.truncated_records)
    add("broker_log_truncated_bytes_total", [], figures.truncated_bytes)
    add("broker_log_open_files", [], figures.open_files)
    add("broker_log_open_files_limit", [], figures.open_files_limit)
    add("broker_log_file_opens_total", [], figures.file_opens)
    add("broker_log_file_evictions_total", [], figures.file_evictions)
    add("broker_log_gap_records", [], figures.gap_records)
    if figures.free_bytes is not None and figures.size_bytes is not None:
        add("broker_data_dir_free_bytes", [], figures.free_bytes)
        add("broker_data_dir_size_bytes", [], figures.size_bytes)
    add("broker_topic_logs_detailed", [], len(figures.top))
    for one in figures.top:
        label = [topic_label(one.name)]
        add("broker_topic_log_bytes", label, one.bytes)
        add("broker_topic_log_first_offset", label, one.first_offset)
        add("broker_topic_log_last_offset", label, one.last_offset)
        add("broker_topic_log_terms", label, one.terms)
        add("broker_topic_blocked", label, 1 if one.blocked else 0)
        add("broker_subscription_lag_records", label, one.lag)
