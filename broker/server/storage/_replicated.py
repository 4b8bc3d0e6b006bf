"""The replicated storage engine's topic store, sans-IO: a topic whose
records count only once a replicated stream (JetStream) holds them.

A :class:`ReplicatedLog` is a :class:`~._store.TopicStore` made of two
things: a local topic log used as a cache (reads, times, readers and
retention are the local log's, so a subscriber reads at the local log's
speed), and the replication state of the stream that is the source of
truth. A record appended goes into the cache at once (readable, not yet
*written*); the manager takes the records not sent yet as *runs*
(:meth:`ReplicatedLog.runs_to_send`: up to 64 consecutive records, one
stream message each, whose body is the records' bytes as the cache stores
them, in the format :func:`~broker.log.decode_run` reads),
publishes them, and tells the log which the stream stored
(:meth:`ReplicatedLog.stored`). Only then are they written and durable
(``written_offset == durable_offset``, :attr:`sync_later` is true): the
topic confirms and delivers nothing a lost machine could take back.

The stream is written by one writer at a time. Each run carries the
stream sequence it expects to follow (``Nats-Expected-Last-Sequence``), so
a writer that lost the topic to another cannot append after it: its next
run is refused (:meth:`ReplicatedLog.fence`) and the log closes. A run
that timed out is sent again exactly as it was, with the same message id
(:attr:`OutgoingRun.msg_id`), which the stream answers as a duplicate if it
had stored it.

No I/O here beyond the cache's files, no clock: the manager passes the
time in and drives the network (``_replication``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from broker.log import DecodedRun, LogClosed, LogError, Reader, Run, Start, TopicLog
from broker.protocol import OriginRun

__all__ = ["RUN_BYTES", "RUN_RECORDS", "OutgoingRun", "ReplicatedLog", "WriterFenced"]

#: The most records in one run (one message of the stream).
RUN_RECORDS = 64
#: About the most bytes of records in one run (at least one record).
RUN_BYTES = 512 * 1024


class WriterFenced(LogError):
    """Another writer appended to the topic's stream: this one may not
    write it any more (its log is closed; the topic belongs elsewhere)."""


@dataclass(slots=True)
class OutgoingRun:
    """Consecutive records on their way to the stream as one message.

    ``msg_id`` is the same every time the run is sent (the stream drops a
    second copy); ``expected_last_seq`` is the stream sequence the run
    must follow, set each time it is (re)sent. A run of no records is a
    purge's marker: the records below ``first_offset`` are deleted.
    ``origins`` says whose publishes its records are (session, topic
    handle, first index, count), so that a front end restored from the
    stream knows which of a resuming session's publishes it holds."""

    first_offset: int
    count: int
    body: bytes
    msg_id: str
    expected_last_seq: int
    origins: list[OriginRun] = field(default_factory=list)

    @property
    def next_offset(self) -> int:
        return self.first_offset + self.count


class ReplicatedLog:
    """One topic's records: a local cache, durable once the stream has them.

    ``cache`` holds every record of the stream from its first kept one on
    (the manager restores it before the log is used) and is this log's
    alone; ``last_seq`` is the stream sequence of the last message it holds
    (0: none); ``writer`` names this writer in its message ids (a writer
    that takes a topic over must use a new one, so that its runs are never
    taken for a predecessor's)."""

    sync_later = True

    def __init__(
        self,
        cache: TopicLog,
        *,
        writer: str,
        last_seq: int = 0,
        run_records: int = RUN_RECORDS,
        run_bytes: int = RUN_BYTES,
    ) -> None:
        if run_records < 1:
            raise ValueError("run_records must be at least 1")
        self.cache = cache
        self.writer = writer
        self._run_records = run_records
        self._run_bytes = run_bytes
        #: Records before it are in the stream.
        self._stored_next = cache.next_offset
        #: Records before it were made into runs (sent, or being sent).
        self._sent_next = cache.next_offset
        #: The stream sequence of the last message stored.
        self._last_seq = last_seq
        #: Runs sent and not known stored, oldest first.
        self._in_flight: deque[OutgoingRun] = deque()
        #: (first offset, stream sequence) of the runs stored (not markers),
        #: oldest first: which messages a purge of the stream may delete.
        self._seqs: deque[tuple[int, int]] = deque()
        #: The stream sequence a purge of the stream should keep from (0: none due).
        self._purge_seq = 0
        #: Purges of the cache not yet sent as markers: the first offset kept.
        self._purges: deque[int] = deque()
        #: Whose publishes the records not yet in a run are: (offset of the
        #: first, its origin run), in offset order (see :meth:`note_origins`).
        self._origins: deque[tuple[int, OriginRun]] = deque()
        #: What the stream held at the restore of each origin (session,
        #: handle): the index of its last publish there (see :meth:`restore`).
        self.held: dict[tuple[bytes, int], int] = {}
        self._fenced: WriterFenced | None = None

    # ---------------------------------------------------------------- state

    @property
    def first_offset(self) -> int:
        return self.cache.first_offset

    @property
    def next_offset(self) -> int:
        return self.cache.next_offset

    @property
    def written_offset(self) -> int:
        """The last offset the stream holds: readers deliver no further."""
        return self._stored_next - 1

    @property
    def durable_offset(self) -> int:
        """The same: the stream stores a run durably before it answers."""
        return self._stored_next - 1

    @property
    def closed(self) -> bool:
        return self.cache.closed

    @property
    def last_seq(self) -> int:
        """The stream sequence of the last message stored."""
        return self._last_seq

    @property
    def in_flight(self) -> int:
        """Runs sent and not known stored."""
        return len(self._in_flight)

    @property
    def unsent(self) -> int:
        """Records appended and not yet in a run."""
        return self.cache.next_offset - self._sent_next

    @property
    def fenced(self) -> WriterFenced | None:
        """Why this writer lost the stream (None: it has not)."""
        return self._fenced

    # ---------------------------------------------------------------- the store

    def append_many(self, tails: Sequence[bytes], now_ms: int) -> int:
        if self._fenced is not None:
            raise self._fenced
        return self.cache.append_many(tails, now_ms)

    def write(self) -> None:
        """Hand the cache's records to the OS (it is a cache: no fsync). The
        records become written when the stream stores them (:meth:`stored`)."""
        self.cache.write()

    def read(self, offset: int, max_records: int, max_bytes: int) -> Run:
        return self.cache.read(offset, max_records, max_bytes)

    def times(self, offset: int, count: int) -> list[int]:
        return self.cache.times(offset, count)

    def reader(self, start: Start, *, register: bool) -> Reader:
        return self.cache.reader(start, register=register)

    def purge_before(self, offset: int) -> int:
        """Delete the records below ``offset`` (at most those the stream
        holds) from the cache, and note the
        stream's messages wholly below it for :meth:`take_purge` (the
        cache's own retention does the same, as runs are stored)."""
        self.cache.write()
        deleted = self.cache.purge_before(min(offset, self._stored_next))
        if deleted:
            # The purge is told to the stream in order with the runs (a
            # marker: a run of no records), so a restore makes it again.
            self._purges.append(self.cache.first_offset)
        self._trim()
        return deleted

    def _trim(self) -> None:
        """Forget the stored runs wholly below the cache's first record
        (purged, or deleted by the cache's retention), and note the stream
        sequence the stream may be purged below."""
        first = self.cache.first_offset
        seqs = self._seqs
        keep_from = 0
        # (The last message stays: a restore learns the next offset from it.)
        while len(seqs) > 1 and seqs[1][0] <= first:
            keep_from = seqs.popleft()[1] + 1
        if keep_from > self._purge_seq:
            self._purge_seq = keep_from

    def retention_ran(self) -> bool:
        """The cache's retention may have deleted records: note the stream's
        messages now wholly deleted; whether a purge of the stream is due."""
        self._trim()
        return self._purge_seq > 0

    def take_purge(self) -> int:
        """The stream sequence the stream should be purged below (0: none
        due); the manager purges the stream (a lost purge is taken again by
        the next one)."""
        seq, self._purge_seq = self._purge_seq, 0
        return seq

    def note_origins(self, offset: int, runs: list[OriginRun]) -> None:
        """The publishes of ``runs`` are appended from ``offset`` on (called
        before the append, as the publish marks are): their runs will carry
        them. A batch noted again (retried after the log refused it) replaces
        what was noted from ``offset`` on."""
        origins = self._origins
        while origins and origins[-1][0] >= offset:
            origins.pop()
        for run in runs:
            if run[0]:  # (a publish without a session has no origin)
                origins.append((offset, run))
            offset += run[3]

    def _take_origins(self, first: int, end: int) -> list[OriginRun]:
        """The origins of the records from ``first`` to ``end`` (a new run),
        forgetting those wholly before ``end``."""
        taken: list[OriginRun] = []
        origins = self._origins
        for offset, (session, handle, index, count) in origins:
            if offset >= end:
                break
            lo, hi = max(offset, first), min(offset + count, end)
            if lo < hi:
                taken.append((session, handle, index + lo - offset, hi - lo))
        while origins and origins[0][0] + origins[0][1][3] <= end:
            origins.popleft()
        return taken

    def purge_failed(self, seq: int) -> None:
        """The stream could not be purged below ``seq``: the next
        :meth:`take_purge` asks for it again."""
        self._purge_seq = max(self._purge_seq, seq)

    def close(self) -> None:
        """Close the cache, without an fsync (what matters is in the stream)."""
        self.cache.close(flush=False)

    # ---------------------------------------------------------------- replication

    def runs_to_send(self, window: int) -> list[OutgoingRun]:
        """New runs of the records not sent yet, so that at most ``window``
        are in flight: each expects the one before it (or the last stored)."""
        if self._fenced is not None or self.cache.closed:
            return []
        runs: list[OutgoingRun] = []
        cache = self.cache
        while self._purges and len(self._in_flight) < window:
            kept = self._purges.popleft()
            expected = self._last_seq + len(self._in_flight)
            marker = OutgoingRun(kept, 0, b"", f"{self.writer}:purge:{kept}", expected)
            self._in_flight.append(marker)
            runs.append(marker)
        while len(self._in_flight) < window and self._sent_next < cache.next_offset:
            run = cache.read(self._sent_next, self._run_records, self._run_bytes)
            if not run.tails or run.gap:
                raise LogError(
                    f"records {self._sent_next} on of {cache.topic!r} are gone from its "
                    "cache before the stream stored them"
                )
            count = len(run.tails)
            first = run.first_offset
            # (The records as the cache stores them: the run's body, not
            # encoded again; checked by their checksums when read back.)
            body = bytes(cache.stored(first, count))
            expected = self._last_seq + len(self._in_flight)
            origins = self._take_origins(first, first + count)
            outgoing = OutgoingRun(first, count, body, f"{self.writer}:{first}", expected, origins)
            self._in_flight.append(outgoing)
            self._sent_next = first + count
            runs.append(outgoing)
        return runs

    def stored(self, run: OutgoingRun, seq: int) -> None:
        """The stream holds ``run`` at sequence ``seq`` (the oldest in flight:
        a stream stores one writer's messages in the order sent)."""
        if not self._in_flight or self._in_flight[0] is not run:
            raise ValueError(f"run at offset {run.first_offset} is not the oldest in flight")
        self._in_flight.popleft()
        self._last_seq = seq
        if run.count:  # (a purge's marker is not where records start)
            self._stored_next = run.next_offset
            self._seqs.append((run.first_offset, seq))
        if self._seqs[0][0] < self.cache.first_offset:
            self._trim()

    def resend(self) -> list[OutgoingRun]:
        """Every run in flight, to send again in order (a timeout, the stream
        unavailable): the same bodies and ids, each expecting the one before."""
        for index, run in enumerate(self._in_flight):
            run.expected_last_seq = self._last_seq + index
        return list(self._in_flight)

    def fence(self, why: str) -> WriterFenced:
        """The stream refused a run for following another writer's message:
        this log takes no more appends; what is in flight is not stored."""
        if self._fenced is None:
            self._fenced = WriterFenced(
                f"topic {self.cache.topic!r} was written by another front end: {why}"
            )
        return self._fenced

    def restore(self, run: DecodedRun, seq: int, origins: Sequence[OriginRun] = ()) -> None:
        """Put a run read back from the stream (sequence ``seq``) into the
        cache: it must follow what the cache holds, and nothing of this
        writer may be waiting (restoring comes before writing). Its
        ``origins`` raise :attr:`held`."""
        cache = self.cache
        if cache.closed:
            raise LogClosed(f"the log of {cache.topic!r} is closed")
        if self._sent_next != cache.next_offset or self._in_flight:
            raise LogError("a run is restored into a log with records of its own")
        self._last_seq = seq
        held = self.held
        for session, handle, index, count in origins:
            last = index + count - 1
            if held.get((session, handle), 0) < last:
                held[(session, handle)] = last
        if not run.tails:  # a purge's marker: the records below it are gone
            cache.purge_before(run.first_offset)
            self._trim()
            return
        if run.first_offset != cache.next_offset:
            raise LogError(
                f"the stream of {cache.topic!r} holds offset {run.first_offset} where "
                f"{cache.next_offset} was expected"
            )
        tails, times = run.tails, run.times
        done = 0
        while done < len(tails):
            same = done + 1
            while same < len(tails) and times[same] == times[done]:
                same += 1
            done += cache.append_many(tails[done:same], times[done])
        cache.write()
        self._stored_next = self._sent_next = cache.next_offset
        self._seqs.append((run.first_offset, seq))
