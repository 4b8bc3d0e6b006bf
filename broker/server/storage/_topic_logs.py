"""The broker's topic logs: opening them, flushing and expiring them in time,
retrying appends that failed, and where durable cursors are kept.

A broker with a data directory has one :class:`TopicLogs`; a memory-only
broker has none. It is the :class:`~._topic.TopicLogHost` of every topic,
and the manager of its storage engine: the topics see each log as a
:class:`~._store.TopicStore`. The local engine keeps each topic in a
:class:`~broker.log.TopicLog`; in cluster mode (a :class:`Replication`)
each is a :class:`~._replicated.ReplicatedLog` whose local log is a cache,
restored from the topic's replicated stream at the start and durable only
once the stream holds its records.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Protocol, TypeVar

import trio

from broker.backoff import Backoff
from broker.errors import BrokerError
from broker.log import (
    DiskFull,
    LogConfig,
    LogError,
    LogFull,
    LogStore,
    LogWriteError,
    StateJournal,
    TopicLog,
    unopened_due,
)
from broker.protocol import OriginRun

from ..cluster._rehome import rehome_state
from ..sessions._cluster_records import RecordsUnavailable
from ..sessions._session import Histogram
from ..topics._groups import GROUPS, SETTLED, GroupJournal
from ..topics._log_subscription import CURSORS, CursorBook, cursor_topic
from ..topics._topic import Topic
from ._cluster_cursors import ClusterCursors
from ._cluster_groups import ClusterGroups
from ._jetstream import JetStreamRuns
from ._kv_state import StateBuckets
from ._publish_marks import PublishMarks
from ._replicated import ReplicatedLog
from ._replication import READ_BOUNDS, Replicator, RunStreams, StreamUnavailable, restore_log
from ._store import TopicStore

log = logging.getLogger("broker.server")

T = TypeVar("T")

#: How often the logs are looked at: fsyncs due, batches waiting for room.
TEND_INTERVAL = 0.1
#: How often retention by age runs.
EXPIRE_INTERVAL = 10.0
#: How long (ms) a log's active term file stays open with nothing appended:
#: then its descriptor is given back (opened again by the next write), so a
#: broker holds a descriptor per topic written lately, not per topic ever.
IDLE_FILE_MS = 30_000
#: How often a batch waiting for the disk is retried.
RETRY_INTERVAL = 1.0
#: How long after a failed write or fsync of a log it is tried again (ms).
SYNC_RETRY_MS = 1000
#: Upper bounds (seconds) of the fsync time histogram: an SSD syncs in about
#: a millisecond, a busy disk or network volume in tens to hundreds.
FSYNC_BOUNDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class TopicUnavailable(BrokerError):
    """A topic's log cannot be opened (the disk, a corrupt directory, no file
    descriptors left): the client that asked for the topic gets a Goodbye
    with this one line, the broker goes on."""


class LogSettings(Protocol):
    """The configuration the logs follow."""

    def log_config(self, topic: str) -> LogConfig:
        """The log settings of ``topic`` (retention, flushing, term size)."""
        ...


class JournalCursors:
    """A :class:`~._log_subscription.CursorBook` in the data directory's state journal."""

    SPACE = CURSORS

    def __init__(self, journal: StateJournal) -> None:
        self._journal = journal

    def position(self, key: str) -> int | None:
        value = self._journal.get(self.SPACE, key)
        return value if type(value) is int else None

    def items(self) -> list[tuple[str, int]]:
        return [(k, v) for k, v in self._journal.items(self.SPACE) if type(v) is int]

    def store(self, key: str, position: int) -> None:
        self._journal.put(self.SPACE, key, position)
        write_journal(self._journal)

    def put(self, key: str, position: int) -> None:
        self._journal.put(self.SPACE, key, position)

    def write(self) -> None:
        write_journal(self._journal)

    def delete(self, key: str) -> bool:
        if self._journal.get(self.SPACE, key) is None:
            return False
        self._journal.delete(self.SPACE, key)
        write_journal(self._journal)
        return True


def write_journal(journal: StateJournal) -> None:
    """Write ``journal``'s pending changes; a failure is logged and the
    changes stay pending (the next write tries again)."""
    if journal.pending:
        try:
            journal.write()
        except LogError as error:
            log.error("writing the state journal failed: %s", error)


def local_log(store: TopicStore) -> TopicLog:
    """The local topic log behind ``store``: every topic these logs host
    has one (another storage engine comes with its own host)."""
    if not isinstance(store, TopicLog):
        raise TypeError(f"not a local topic log: {type(store).__name__}")
    return store


def wall_ms() -> int:
    """Now, in ms since the Unix epoch (records' receive time)."""
    return time.time_ns() // 1_000_000


class EngineConnection(Protocol):
    """The connection a stream engine works over (JetStream's NATS client)."""

    @property
    def connected(self) -> bool:
        """Whether it is up now."""
        ...


#: Seconds the start-up asks JetStream again while it does not answer.
START_PATIENCE = 60.0


async def patiently(
    what: str,
    call: Callable[[], Awaitable[T]],
    unavailable: type[Exception] = StreamUnavailable,
) -> T:
    """``await call()``, asked again with a backoff while it raises
    ``unavailable`` (JetStream not answering: an election, a server
    restarting), for up to :data:`START_PATIENCE` seconds; then that error."""
    backoff = Backoff(0.05, 2.0)
    deadline = trio.current_time() + START_PATIENCE
    while True:
        try:
            return await call()
        except unavailable as error:
            if trio.current_time() >= deadline:
                raise
            log.warning("cluster mode: %s: %s (asked again)", what, error)
            await trio.sleep(backoff.next())


async def _read_state(what: str, load: Callable[[], Awaitable[int]]) -> int:
    """``load()`` (state read from the cluster), asked again while the
    cluster does not answer; raises :class:`StreamUnavailable` at last."""
    try:
        return await patiently(f"reading the {what}", load, RecordsUnavailable)
    except RecordsUnavailable as error:
        raise StreamUnavailable(f"reading the {what}: {error}") from None


class Replication:
    """Cluster mode's storage engine as the logs use it: the replicated logs
    (restored from their streams, then made as topics are), and the
    :class:`Replicator` that sends their records. ``writer`` names this
    broker's run in its messages' ids (new at every start)."""

    def __init__(self, streams: RunStreams, writer: str, max_topics: int = 1000) -> None:
        self.streams = streams
        self.writer = writer
        self.max_topics = max_topics
        self.replicator = Replicator(streams)
        self.logs: dict[str, ReplicatedLog] = {}
        #: Topics whose stream could not be restored, and why: not served.
        self.broken: dict[str, str] = {}
        #: Seconds of each read of a stream while restoring (a batch of runs).
        self.read_times = Histogram(READ_BOUNDS)
        #: The engine's connection (JetStream's NATS client; None: an engine
        #: without one, the tests' in-memory streams).
        self.connection: EngineConnection | None = (
            streams.js.client if isinstance(streams, JetStreamRuns) else None
        )

    @property
    def connected(self) -> bool:
        """Whether the streams can be reached now (their engine's connection
        is up; an engine without a connection always can)."""
        return self.connection is None or self.connection.connected

    @property
    def runs_in_flight(self) -> int:
        """Runs sent to the streams and not yet acknowledged (those to be
        sent again included), over every topic this front end writes (a
        fenced or closed log's are not sent any more: not counted)."""
        return sum(
            replicated.in_flight
            for replicated in self.logs.values()
            if not replicated.closed and replicated.fenced is None
        )

    async def restore(
        self, store: LogStore, settings: LogSettings, owns: Callable[[str], bool] | None = None
    ) -> int:
        """Restore every topic that has a stream (that this front end ``owns``,
        if given) into a cache of ``store`` (an empty one: the caches of an
        earlier run are not trusted); returns how many records. A topic
        whose stream cannot be restored (a message damaged, or not the
        broker's) is set aside in :attr:`broken`, reported, and not served;
        the others are. Raises :class:`StreamUnavailable` if the streams
        cannot be read now."""
        records = 0
        for name in await patiently("listing the topics' streams", self.streams.topics):
            if owns is not None and not owns(name):
                continue
            stream = await patiently(
                f"opening the stream of {name[:64]!r}", partial(self.replicator.stream, name)
            )
            config = settings.log_config(name)

            def cache(first: int, name: str = name, config: LogConfig = config) -> TopicLog:
                return store.topic(name, config, wall_ms(), first_offset=first)

            try:
                replicated = await restore_log(stream, cache, self.writer, self.read_times)
            except LogError as error:
                if isinstance(error, StreamUnavailable):
                    raise
                # Set aside: the other topics are served; this one is not
                # (never served with a hole, never written over).
                self.broken[name] = str(error)
                store.delete_topic(name)
                log.error("topic %r is not served: its stream: %s", name[:64], error)
                continue
            self.logs[name] = replicated
            records += replicated.next_offset - replicated.first_offset
        return records

    def open(self, store: LogStore, name: str, config: LogConfig) -> ReplicatedLog:
        """The replicated log of ``name``: restored, or a new one (its
        stream is made when its first run is sent)."""
        if name in self.broken:
            raise LogError(f"its stream cannot be read: {self.broken[name]}")
        replicated = self.logs.get(name)
        if replicated is None or replicated.closed:
            if replicated is None and len(self.logs) >= self.max_topics:
                raise LogError(
                    f"this front end writes at most {self.max_topics} topics "
                    "(cluster_max_topics): delete one, or raise the setting"
                )
            cache = store.topic(name, config, wall_ms())
            replicated = self.logs[name] = ReplicatedLog(cache, writer=self.writer)
        return replicated

    def delete(self, name: str) -> None:
        """``name`` is deleted: its log closed and its stream deleted soon
        (a stream that could not be restored too: the topic starts afresh)."""
        self.broken.pop(name, None)
        replicated = self.logs.pop(name, None)
        if replicated is not None:
            replicated.close()
        self.replicator.delete_soon(name)


class TopicLogs:
    """The topic logs of one data directory (see the module)."""

    def __init__(
        self, store: LogStore, settings: LogSettings, replication: Replication | None = None
    ) -> None:
        self.store = store
        #: Cluster mode: the replicated engine (None: the local one).
        self.replication = replication
        self._settings = settings
        #: Logs with records written and not fsynced.
        self._dirty: set[TopicLog] = set()
        #: Topics with batches waiting for room or for the disk.
        self._failing: set[Topic] = set()
        #: Broker state that survives a restart: cursors, staged batches, commits.
        self.journal = store.journal
        if self.journal.recovered_cut_bytes:
            log.warning("state journal: %s", self.journal.recovery_detail)
        if store.worker is None:  # (a supervisor moves them for its workers)
            rehome_state(store.data_dir, lambda _t: None, lambda _s: None, (None, self.journal))
        self.cursors: CursorBook = JournalCursors(self.journal)
        #: Cluster mode: the durable cursors kept in the cluster (then
        #: :attr:`cursors` too; None: in the journal).
        self.cluster_cursors: ClusterCursors | None = None
        #: Where consumer groups keep their state: the journal, or in
        #: cluster mode the cluster (then :attr:`cluster_groups` too).
        self.group_journal: GroupJournal = self.journal
        self.cluster_groups: ClusterGroups | None = None
        #: Where each session's publishes went in the logs (no duplicate after a crash).
        self.marks = PublishMarks(self.journal)
        #: Counters for metrics: records appended, fsyncs (and their time),
        #: appends that failed (full, or the disk).
        self.appends = 0
        self.fsyncs = 0
        self.fsync_seconds = 0.0
        #: The time of each timed fsync (the batch flushes :meth:`tend` does).
        self.fsync_times = Histogram(FSYNC_BOUNDS)
        self.append_errors = 0
        #: Whether this broker (worker) serves a topic's log: the only ones
        #: retention by age opens for itself.
        self.owns: Callable[[str], bool] = lambda _topic: True
        #: Cluster mode: told, once per topic restored from its stream, the
        #: highest publish index its runs hold of each (session, handle).
        self.origins_restored: Callable[[str, dict[tuple[bytes, int], int]], None] | None = None
        #: Logs whose last write or fsync failed: when to try again (wall ms).
        self._sync_failing: dict[TopicLog, int] = {}
        #: The logs opened so far, by topic (their recovery logged, their
        #: cursors checked: each once).
        self._opened: dict[str, TopicLog] = {}
        #: The same of the replicated logs (cluster mode).
        self._opened_replicated: dict[str, ReplicatedLog] = {}
        #: :meth:`gather` calls not yet released.
        self._gathering = 0
        #: Topics holding gathered batches, in the order they got their first.
        self._gathered: list[Topic] = []
        #: ``flush="always"`` topics whose written records wait for an fsync
        #: (in the order asked), and the wake-up of the task that does them.
        self._to_sync: dict[Topic, None] = {}
        self._sync_asked = trio.Event()
        #: Those whose fsync failed, and when (trio time) to ask again.
        self._sync_retry: dict[Topic, float] = {}

    @classmethod
    def open_store(
        cls,
        log_dir: Path | None,
        settings: LogSettings,
        worker: str | None,
        open_files: int,
        replication: Replication | None = None,
    ) -> TopicLogs | None:
        """The logs of data directory ``log_dir`` (None: memory-only), their
        term files open within ``open_files`` (0: the default share of the
        open-file limit); raises :class:`DataDirLocked` (one line) if
        another broker has the directory. With ``replication`` (cluster
        mode) the topics' directories are caches: those of an earlier run
        are deleted (:meth:`restore` makes them again from the streams)."""
        if log_dir is None:
            return None
        store = LogStore(log_dir, worker=worker, open_files=open_files or None)
        if replication is not None:
            try:
                store.discard_topics()
            except BaseException:
                store.close()
                raise
        return cls(store, settings, replication)

    def keep_state_in(self, buckets: StateBuckets) -> None:
        """Cluster mode: keep the durable cursors and the consumer groups in
        ``buckets``, not in the journal (read by :meth:`restore`, written
        by :meth:`run`)."""
        self.cursors = self.cluster_cursors = ClusterCursors(buckets.cursors)
        self.group_journal = self.cluster_groups = ClusterGroups(buckets.groups)

    async def restore(self, owns: Callable[[str], bool] | None = None) -> int:
        """Cluster mode: restore every topic from its stream (see
        :meth:`Replication.restore`), and read the durable cursors of those
        it ``owns`` and their groups if they are kept in the cluster (the
        groups claimed); how many records.
        Nothing to do with the local engine (its logs are opened as they
        are used)."""
        if self.replication is None:
            return 0
        records = await self.replication.restore(self.store, self._settings, owns)
        if self.cluster_cursors is not None and self.cluster_groups is not None:
            cursors = await _read_state("durable cursors", partial(self.cluster_cursors.load, owns))
            groups = await _read_state("consumer groups", partial(self.cluster_groups.load, owns))
            log.info("cluster mode: %d durable cursors and %d groups read", cursors, groups)
            self._journal_to_cluster(self.cluster_cursors, self.cluster_groups, owns)
        return records

    def _journal_to_cluster(
        self, cursors: ClusterCursors, groups: ClusterGroups, owns: Callable[[str], bool] | None
    ) -> None:
        """The journal's durable cursors and groups of the topics this front
        end ``owns`` (kept there before they moved to the cluster) go to the
        cluster, unless it has them, and leave the journal (with what groups
        settled after their last state: a stop writes none of that)."""
        moved = 0
        for space in (CURSORS, GROUPS, SETTLED):
            for key, value in self.journal.items(space):
                topic = cursor_topic(key.rpartition("\x00")[0] if space == SETTLED else key)
                if topic is None or (owns is not None and not owns(topic)):
                    continue
                self.journal.delete(space, key)
                if space == CURSORS and type(value) is int and cursors.position(key) is None:
                    cursors.store(key, value)
                elif space == GROUPS and groups.get(GROUPS, key) is None:
                    groups.put(GROUPS, key, value)
                else:
                    continue
                moved += 1
        write_journal(self.journal)
        if moved:
            log.info("cluster mode: %d durable cursors and groups moved from the journal", moved)

    async def flush_state(self) -> None:
        """Cluster mode: return once the cluster holds every durable
        cursor's position and every group's state written so far (at once
        with the journal's)."""
        if self.cluster_cursors is None or self.cluster_groups is None:
            return
        writers = (self.cluster_cursors.writes, self.cluster_groups.writes)
        try:
            for writer in writers:
                await writer.flush()
        finally:
            if any(writer.pending for writer in writers):  # (the shutdown's deadline)
                log.warning(
                    "cluster mode: the last positions of %d durable cursors and states of "
                    "%d groups were not written (the cluster did not take them in time): "
                    "what was acknowledged or settled since is delivered again",
                    *(writer.pending for writer in writers),
                )

    def open(self, name: str) -> TopicStore:
        """The log of topic ``name`` (recovered on first use); raises
        :class:`TopicUnavailable` if it cannot be opened."""
        if self.replication is not None:
            try:
                replicated = self.replication.open(
                    self.store, name, self._settings.log_config(name)
                )
            except (LogError, OSError) as error:
                raise self._unavailable(name, "open", "opened", error) from None
            if self._opened_replicated.get(name) is not replicated:
                # Once per log: its end is what the stream held at the start,
                # and its runs said whose publishes it holds.
                self._opened_replicated[name] = replicated
                self._cursors_within(name, replicated.written_offset + 1)
                self.marks.restored(name, replicated.held)
                if self.origins_restored is not None:
                    self.origins_restored(name, replicated.held)
                replicated.held = {}
                self.marks.opened(name, replicated.next_offset)
            return replicated
        try:
            topic_log = self.store.topic(name, self._settings.log_config(name), wall_ms())
        except (LogError, OSError) as error:
            raise self._unavailable(name, "open", "opened", error) from None
        if self._opened.get(name) is topic_log:
            return topic_log
        # Once per opening of the log: the store hands out the same log to
        # every later caller (a ListOffsets, a subscription).
        self._opened[name] = topic_log
        # flush="always": fsynced by _serve_syncs, off the event loop, and
        # confirmed once durable (not one fsync per append on the loop).
        topic_log.sync_later = topic_log.config.flush == "always"
        self._cursors_within(name, topic_log.written_offset + 1)
        self.marks.opened(name, topic_log.next_offset)
        recovery = topic_log.recovery
        if not recovery.clean:
            log.warning(
                "topic %r: %d record%s lost from its log (readers get a Gap for them), "
                "%d bytes cut or set aside: %s",
                name[:64],
                recovery.cut_records,
                "" if recovery.cut_records == 1 else "s",
                recovery.cut_bytes,
                "; ".join(recovery.details)[:400],
            )
        elif recovery.gaps:
            log.info(
                "topic %r: %d records missing from its log, as found before: %s",
                name[:64],
                recovery.gap_records,
                "; ".join(recovery.details)[:400],
            )
        return topic_log

    def set_aside(self, name: str) -> str | None:
        """Why topic ``name`` is not served (cluster mode: its stream could
        not be restored), or None; deleting the topic ends it."""
        return None if self.replication is None else self.replication.broken.get(name)

    @staticmethod
    def gaps_of(store: TopicStore) -> list[tuple[int, int]]:
        """The ranges ``(first offset, count)`` missing inside ``store``, as
        its opening found them (a replicated log has none: its restore
        refuses a hole)."""
        return store.recovery.gaps if isinstance(store, TopicLog) else []

    def config_of(self, name: str) -> LogConfig:
        """The log settings of topic ``name`` (retention, flushing)."""
        return self._settings.log_config(name)

    def delete(self, name: str) -> bool:
        """Delete the log of topic ``name`` (closed first if open: its
        readers must be gone); whether there was one. Raises
        :class:`TopicUnavailable` if its directory cannot be removed."""
        opened = self._opened.pop(name, None)
        if opened is not None:
            self._dirty.discard(opened)
            self._sync_failing.pop(opened, None)
        if self.replication is not None:
            self._opened_replicated.pop(name, None)
            self.replication.delete(name)
        try:
            return self.store.delete_topic(name)
        except (LogError, OSError) as error:
            raise self._unavailable(name, "delete", "deleted", error) from None

    def end_of(self, name: str) -> int | None:
        """The next offset of ``name``'s log, if this broker (worker) serves
        it and it can be opened; else None."""
        if not self.owns(name):
            return None
        try:
            return self.open(name).next_offset
        except TopicUnavailable:
            return None

    def opened(self, name: str) -> TopicStore | None:
        """The log of ``name`` if it is open (None: not opened since the start)."""
        if self.replication is not None:
            replicated = self.replication.logs.get(name)
            return None if replicated is None or replicated.closed else replicated
        topic_log = self.store.opened(name)
        return None if topic_log is None or topic_log.closed else topic_log

    async def survey(self, name: str) -> tuple[int, int]:
        """The first offset kept and the next offset of ``name``'s log without
        opening it, its files read in a thread (a log of large terms takes
        a fraction of a second to scan, and the event loop goes on); raises
        :class:`TopicUnavailable` if they cannot be read. Cancelled, it
        returns at once: the thread, which only reads, is left to finish."""
        try:
            return await trio.to_thread.run_sync(self.store.survey, name, abandon_on_cancel=True)
        except (LogError, OSError) as error:
            raise self._unavailable(name, "read", "read", error) from None

    def _unavailable(
        self, name: str, verb: str, participle: str, error: Exception
    ) -> TopicUnavailable:
        """Log that ``name``'s log cannot be ``participle`` (opened, read);
        the error to raise for its client."""
        log.error("topic %r: its log cannot be %s: %s", name[:64], participle, error)
        return TopicUnavailable(
            f"the broker cannot {verb} the log of topic {name[:64]!r} now: "
            f"{self._for_clients(error)}"
        )

    def stored_topics(self) -> list[str]:
        """The topics with a log in the data directory; raises
        :class:`TopicUnavailable` if it cannot be listed now."""
        try:
            return self.store.stored_topics()
        except OSError as error:  # (no file descriptor left, the disk)
            log.error("the topic logs cannot be listed: %s", error)
            raise TopicUnavailable(
                f"the broker cannot list its topics now: {self._for_clients(error)}"
            ) from None

    def _for_clients(self, error: Exception) -> str:
        """``error`` as a client is told it: paths relative to the data
        directory (where the broker keeps its files is not theirs to know)."""
        return str(error).replace(f"{self.store.data_dir}{os.sep}", "")

    def _cursors_within(self, topic: str, end: int) -> None:
        """Bring back to ``end`` the durable cursors of ``topic`` that stand
        past it: the log was cut back (recovery after a crash or damage;
        unsynced records lost with the power), and the offsets from ``end``
        on go to new records, which those cursors must not skip."""
        for key, position in self.cursors.items():
            if position <= end:
                continue
            parts = key.split("\x00")  # (principal, topic, cursor name)
            if parts[1:2] == [topic]:
                self.cursors.store(key, end)
                log.warning(
                    "topic %r: cursor %r stood at offset %d, past the log's end %d "
                    "(its log was cut back): it goes on from %d",
                    topic[:64],
                    parts[-1][:64],
                    position,
                    end,
                    end,
                )

    # --------------------------------------------------------------- TopicLogHost

    def now_ms(self) -> int:
        return wall_ms()

    def log_written(self, log: TopicStore, appended: int) -> None:
        self.appends += appended
        if isinstance(log, ReplicatedLog):
            return  # (its cache is never fsynced: the stream keeps the records)
        topic_log = local_log(log)
        if topic_log.config.flush != "always":
            self._dirty.add(topic_log)

    def mark(self, topic: str, runs: list[OriginRun], offset: int) -> None:
        self.note(topic, runs, offset)
        self.journal.write()  # (raises LogError: the batch waits)

    def note(self, topic: str, runs: list[OriginRun], offset: int) -> None:
        self.marks.note(topic, runs, offset)
        if self.replication is not None:
            replicated = self.replication.logs.get(topic)
            if replicated is not None:  # (its runs carry the origins to the stream)
                replicated.note_origins(offset, runs)

    def sync_soon(self, topic: Topic) -> None:
        replicated = topic.log
        if isinstance(replicated, ReplicatedLog):
            assert self.replication is not None
            self.replication.replicator.ask(topic.topic_name, replicated, topic.synced)
            return
        self._to_sync[topic] = None
        self._sync_asked.set()

    async def _serve_syncs(self) -> None:
        """Fsync the ``flush="always"`` logs that asked (:meth:`sync_soon`),
        one at a time in a worker thread, each covering every record written
        before it started (what was appended meanwhile asks again); then the
        topic routes and confirms what is durable. A failed fsync is logged
        and tried again a second later: nothing is confirmed until it works."""
        while True:
            await self._sync_asked.wait()
            self._sync_asked = trio.Event()
            topics, self._to_sync = list(self._to_sync), {}
            for topic in topics:
                topic_log = topic.log
                if topic_log is None or topic_log.closed:
                    continue
                if await self._sync(local_log(topic_log), wall_ms()):
                    topic.synced()
                else:
                    self._retry_sync_later(topic)

    def _retry_sync_later(self, topic: Topic) -> None:
        """Ask for ``topic``'s fsync again in ``SYNC_RETRY_MS`` (:meth:`run`
        does); meanwhile :meth:`tend` leaves its log alone."""
        if topic.log is not None:
            self._dirty.discard(local_log(topic.log))
        self._sync_retry[topic] = trio.current_time() + SYNC_RETRY_MS / 1000

    @property
    def gathering(self) -> bool:
        return self._gathering > 0

    def gathered(self, topic: Topic) -> None:
        self._gathered.append(topic)

    def gather(self) -> None:
        """Until the matching :meth:`release`, topics gather the batches
        sent to them instead of appending each at once: a connection's
        read of publishes to many topics (a batch each, often of one
        publish) then costs one journal write for all their marks, not one
        per batch. Calls nest; nothing may wait (await) in between."""
        self._gathering += 1

    def release(self) -> None:
        """End a :meth:`gather`; the outermost appends what was gathered:
        per round, the marks of the first gathered batch of every topic are
        put and the journal written once, then each of those batches is
        appended, written, read by the readers waiting at the log's end
        and routed (confirmed), in that order as one batch alone would be.
        What routing sends on meanwhile is gathered for the next round."""
        if self._gathering > 1:
            self._gathering -= 1
            return
        try:
            while self._gathered:
                topics = self._gathered
                self._gathered = []
                for topic in topics:
                    topic.mark_gathered()
                try:
                    self.journal.write()
                except LogError as error:
                    # Nothing of theirs was appended: they wait, and are
                    # marked again when retried.
                    for topic in topics:
                        topic.gathered_failed(error)
                    continue
                for topic in topics:
                    topic.append_gathered()
        finally:
            self._gathering = 0

    def log_failed(self, topic: Topic, error: LogError) -> None:
        self.append_errors += 1
        self._failing.add(topic)
        if isinstance(error, LogFull):
            log.warning(
                "topic %r is full (when_full=block): its publishers wait for its "
                "slowest reliable subscriber: %s",
                topic.topic_name[:64],
                error,
            )
        elif isinstance(error, DiskFull):
            log.error(
                "topic %r: the disk is full; its publishers wait until there is room: %s",
                topic.topic_name[:64],
                error,
            )
        else:
            log.error("topic %r: writing its log failed: %s", topic.topic_name[:64], error)

    # --------------------------------------------------------------- tending

    async def tend(self, now_ms: int) -> None:
        """Fsync the logs whose oldest unsynced record is ``flush_interval_ms``
        old, one at a time in a worker thread: the loop goes on meanwhile."""
        if not self._dirty:
            return
        failing = self._sync_failing
        due = [
            topic_log
            for topic_log in self._dirty
            if topic_log.closed
            or ((topic_log.next_flush_at or 0) <= now_ms and failing.get(topic_log, 0) <= now_ms)
        ]
        self._dirty.difference_update(due)
        for topic_log in due:
            if topic_log.closed:
                failing.pop(topic_log, None)
                continue
            await self._sync(topic_log, now_ms)

    async def _sync(self, topic_log: TopicLog, now_ms: int) -> bool:
        """Write ``topic_log`` and fsync it in a worker thread (the loop goes
        on meanwhile), timed for the metrics; whether it worked (a failure
        is logged once, and the log marked to be tried again)."""
        started = time.perf_counter()
        try:
            job = topic_log.start_sync()
        except LogError as error:
            self._sync_failed(topic_log, now_ms, f"writing its log failed: {error}")
            return False
        if job is not None:
            await trio.to_thread.run_sync(job.run)
            job.finish()
            if job.error is not None:
                self._sync_failed(topic_log, now_ms, f"fsync failed: {job.error}")
                return False
            took = time.perf_counter() - started
            self.fsyncs += 1
            self.fsync_seconds += took
            self.fsync_times.observe(took)
        self._synced(topic_log)
        return True

    def _sync_failed(self, topic_log: TopicLog, now_ms: int, what: str) -> None:
        """Writing or syncing ``topic_log`` failed: logged once until it
        succeeds again, tried again in a second (not at every tending)."""
        if topic_log not in self._sync_failing:
            log.error("topic %r: %s (tried again every second)", topic_log.topic[:64], what)
        self._sync_failing[topic_log] = now_ms + SYNC_RETRY_MS
        self._dirty.add(topic_log)

    def _synced(self, topic_log: TopicLog) -> None:
        if self._sync_failing.pop(topic_log, None) is not None:
            log.info("topic %r: its log is written and synced again", topic_log.topic[:64])

    def retry(self) -> None:
        """Retry the topics whose batches wait for room or the disk."""
        for topic in list(self._failing):
            topic.retry_held()
            if not topic.held:
                self._failing.discard(topic)
                log.info("topic %r: its log takes records again", topic.topic_name[:64])

    def persist_state(self) -> None:
        """Write the journal's pending changes (see ``Broker.persist_state``)."""
        write_journal(self.journal)

    def expire(self, now_ms: int) -> None:
        """Delete terms older than their topics' ``retain_seconds``; give
        back the file descriptors of logs idle for ``IDLE_FILE_MS``."""
        for topic_log in self.store.open_logs().values():
            if not topic_log.closed:
                topic_log.expire(now_ms)
                if topic_log not in self._dirty:
                    topic_log.release_file(now_ms, IDLE_FILE_MS)
        if self.replication is not None:
            replicator = self.replication.replicator
            for name, replicated in self.replication.logs.items():
                if not replicated.closed and replicated.retention_ran():
                    replicator.ask(name, replicated)

    async def expire_unopened(self, now_ms: int) -> None:
        """Retention by age of the logs not opened since the start (topics
        nobody has used since), without opening them: which of their sealed
        terms are due is read in a thread (by the files' times, then their
        index files), and only those files are deleted, on the loop."""
        open_dirs = {topic_log.directory for topic_log in self.store.open_logs().values()}
        retain_of = self._settings.log_config
        due = await trio.to_thread.run_sync(
            unopened_due,
            self.store.data_dir,
            open_dirs,
            lambda topic: retain_of(topic).retain_seconds,
            now_ms,
        )
        for name in due:
            if not self.owns(name) or self.store.opened(name) is not None:
                continue
            seconds = retain_of(name).retain_seconds
            assert seconds is not None  # (due: it has a retention by age)
            try:
                paths = await trio.to_thread.run_sync(
                    self.store.expired_terms, name, now_ms - int(seconds * 1000)
                )
                deleted = self.store.remove_expired(name, paths)
            except (LogError, OSError) as error:
                log.warning("topic %r: retention could not delete terms: %s", name[:64], error)
                continue
            if deleted:
                log.info("topic %r: retention deleted %d terms", name[:64], deleted)

    async def run(self) -> None:
        """Tend the logs until cancelled (and fsync the ``flush="always"``
        ones as they ask: :meth:`_serve_syncs`)."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._serve_syncs)
            if self.replication is not None:
                nursery.start_soon(self.replication.replicator.run)
            if self.cluster_cursors is not None and self.cluster_groups is not None:
                nursery.start_soon(self.cluster_cursors.run)
                nursery.start_soon(self.cluster_groups.run)
            await self._tend_forever()

    async def _tend_forever(self) -> None:
        next_expire = trio.current_time() + EXPIRE_INTERVAL
        next_retry = trio.current_time() + RETRY_INTERVAL
        while True:
            await trio.sleep(TEND_INTERVAL)
            now = trio.current_time()
            for topic, at in list(self._sync_retry.items()):
                if now >= at:
                    del self._sync_retry[topic]
                    self.sync_soon(topic)
            await self.tend(wall_ms())
            if self._failing and now >= next_retry:
                next_retry = now + RETRY_INTERVAL
                self.retry()
            if now >= next_expire:
                next_expire = now + EXPIRE_INTERVAL
                await self.expire_unopened(wall_ms())
                self.expire(wall_ms())
                if self._failing:
                    self.retry()

    def close(self) -> None:
        """Flush and close every log and the state journal; release the data
        directory. What the disk cannot take now (full, or failing) was never
        confirmed (see ``Topic._append``): the logs are closed all the same
        and the stop goes on as any other, saying so in one line."""
        self._dirty.clear()
        logs = self.store.open_logs()
        failure: LogError | None = None
        try:
            self.store.close()
        except LogWriteError as error:
            failure = error
        # Held batches' records not appended, and records appended not written.
        unwritten = sum(len(h.routed.tails) - h.appended for t in self._failing for h in t.held)
        unwritten += sum(max(0, t.next_offset - 1 - t.written_offset) for t in logs.values())
        cause = failure or next((t.log_error for t in self._failing if t.log_error), None)
        if cause is not None or unwritten:
            log.error(
                "stopping: %s%s%s",
                f"{unwritten} publishes not written, never confirmed (their clients keep them): "
                if unwritten
                else "not everything could be written: ",
                "the disk is full: " if isinstance(cause, DiskFull) else "",
                cause,
            )
