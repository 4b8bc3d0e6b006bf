"""Replication: the topics' runs sent to a replicated stream per topic, and
the topics' caches restored from those streams.

The stream engine (JetStream in cluster mode; an in-memory one in tests)
is seen through :class:`RunStreams` and :class:`RunStream`: a stream per
topic that stores runs in order, each under a message id and the sequence
it expects to follow, and reads them back from a sequence on. A
:class:`Replicator` sends each topic's runs (:class:`ReplicatedLog`) one
at a time, in order, and tells the topic once the stream holds them
(``Topic.synced``: then the topic confirms and delivers them). While the
stream does not answer (an election, a lost quorum), the run is sent again,
the same message with the same id, after a jittered backoff: the
publishers' loans stay unpaid meanwhile, so they are throttled and nothing
piles up here. A stream that says another writer appended fences the log:
it takes nothing more.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

import trio

from broker.backoff import Backoff
from broker.log import DecodedRun, LogError, TopicLog, decode_run
from broker.protocol import OriginRun

from ..sessions._session import Histogram
from ..transport._wake import Outbox
from ._replicated import OutgoingRun, ReplicatedLog

log = logging.getLogger("broker.server")

__all__ = [
    "READ_BOUNDS",
    "STORE_FAILURES",
    "Replicator",
    "RunStream",
    "RunStreams",
    "StoredRun",
    "StreamFenced",
    "StreamUnavailable",
    "restore_log",
]

#: Waits between sends of a run the stream did not take (seconds).
RESEND_FIRST = 0.05
RESEND_MOST = 2.0
#: Runs in flight per topic at once (each expects the one before it).
WINDOW = 4
#: Seconds after a stream is opened in which a new leader is taken as its
#: first (a stream just made elects one): runs in flight are not sent again.
NEW_STREAM_QUIET = 2.0
#: Messages asked for at a time while restoring a topic.
RESTORE_BATCH = 256
#: Upper bounds (seconds) of the store times' histogram: from a quick
#: acknowledgement to an election's (4 to 9 s with JetStream).
_STORE_MS = (0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10_000)
STORE_BOUNDS = tuple(ms / 1000 for ms in _STORE_MS)
#: Upper bounds (seconds) of the reads' histogram (a batch of up to
#: :data:`RESTORE_BATCH` messages; a read waits out an election too).
_READ_MS = (1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10_000, 30_000, 60_000)
READ_BOUNDS = tuple(ms / 1000 for ms in _READ_MS)

#: Why a stream did not store a run (``StreamUnavailable.reason``; the
#: label values of ``broker_cluster_store_failures_total``): no answer in
#: time; no responders (no stream leader, the 503 of a NATS request);
#: JetStream said it cannot store now (its own 503, or a resend still "in
#: process": no quorum); the connection was lost or not up; any other refusal.
STORE_FAILURES = ("timeout", "no_responders", "unavailable", "connection", "refused")


class StreamUnavailable(LogError):
    """The stream did not answer in time, or has no leader now: send the
    same run again (a duplicate answer then means it was stored).
    ``reason``: one of :data:`STORE_FAILURES`."""

    def __init__(self, message: str, reason: str = "unavailable") -> None:
        super().__init__(message)
        self.reason = reason


class StreamFenced(LogError):
    """The stream's last message is not the one the run expected to follow:
    another writer appended to it."""


@dataclass(frozen=True, slots=True)
class StoredRun:
    """One message of a topic's stream: a run from ``first_offset`` of
    ``count`` records (0: a purge's marker), at stream sequence ``seq``;
    the ``origins`` of its publishes."""

    seq: int
    first_offset: int
    count: int
    body: bytes
    #: Whose publishes its records are (see ``OutgoingRun.origins``).
    origins: list[OriginRun] = field(default_factory=list)


class PendingStore(Protocol):
    """A run sent and not answered yet (:meth:`RunStream.start_publish`)."""

    #: Once :meth:`wait` returned: whether the stream answered that it held
    #: the run already (a resend of a run whose first answer was lost).
    duplicate: bool

    @property
    def done(self) -> bool:
        """Whether its answer (or failure) came: :meth:`wait` returns at once."""
        ...

    async def wait(self) -> int:
        """The run's sequence once stored; raises as :meth:`RunStream.publish`."""
        ...

    def cancel(self) -> None:
        """Stop waiting for the answer (the run is sent again, or not needed)."""
        ...


class RunStream(Protocol):
    """One topic's stream."""

    async def start_publish(self, run: OutgoingRun) -> PendingStore:
        """Send ``run`` now, behind those sent before it (in that order the
        stream takes them), and return its answer to come: any number may
        be in flight. Waits only while the connection's output is full."""
        ...

    async def publish(self, run: OutgoingRun) -> int:
        """Store ``run`` after the message at ``run.expected_last_seq``; its
        sequence (the first copy's, if ``run.msg_id`` was stored before).
        Raises :class:`StreamUnavailable` or :class:`StreamFenced`."""
        ...

    async def fetch(self, from_seq: int, max_messages: int) -> list[StoredRun]:
        """Up to ``max_messages`` messages from sequence ``from_seq`` on, in
        order (the first one there is at or after it); none past the last.
        Raises :class:`StreamUnavailable`."""
        ...

    async def purge_below(self, seq: int) -> None:
        """Delete the messages before sequence ``seq``. Raises :class:`StreamUnavailable`."""
        ...


class RunStreams(Protocol):
    """The streams of every topic."""

    async def open_stream(self, topic: str) -> RunStream:
        """``topic``'s stream, created if it has none. Raises :class:`StreamUnavailable`."""
        ...

    async def topics(self) -> list[str]:
        """The topics that have a stream. Raises :class:`StreamUnavailable`."""
        ...

    async def delete_stream(self, topic: str) -> bool:
        """Delete ``topic``'s stream; whether it had one. Raises :class:`StreamUnavailable`."""
        ...

    async def watch_leaders(self, elected: Callable[[str], None]) -> None:
        """Call ``elected(topic)`` (synchronously) each time a topic's stream
        has a new leader, until cancelled (an engine without elections never
        calls it)."""
        ...


async def restore_log(
    stream: RunStream,
    open_cache: Callable[[int], TopicLog],
    writer: str,
    read_times: Histogram | None = None,
) -> ReplicatedLog:
    """A replicated log holding everything ``stream`` holds: its cache
    (``open_cache(first_offset)``: an empty local log starting there) made
    from the stream's messages, in order; the seconds of each read (a batch
    of messages) observed in ``read_times``. Raises :class:`LogError`
    (:class:`~broker.log.RunDamaged`: a message that does not hold what it
    says; the topic is then not served, never served with a hole)."""
    replicated: ReplicatedLog | None = None
    #: Before the first run: the highest purge's marker, and its sequence
    #: (the stream's purge took the runs below it, or not yet all of them).
    floor = last_seq = 0
    try:
        while True:
            began = _now()
            batch = await stream.fetch(last_seq + 1, RESTORE_BATCH)
            if read_times is not None:
                read_times.observe(_now() - began)
            if not batch:
                break
            for stored in batch:
                last_seq = stored.seq
                if replicated is None:
                    if not stored.count:
                        floor = max(floor, stored.first_offset)
                        continue
                    replicated = ReplicatedLog(open_cache(stored.first_offset), writer=writer)
                run = decode_run(stored.body, stored.first_offset, stored.count)
                replicated.restore(run, stored.seq, stored.origins)
                if floor:
                    replicated.restore(DecodedRun(floor, [], []), stored.seq)
                    floor = 0
    except BaseException:
        if replicated is not None:
            replicated.close()
        raise
    if replicated is None:
        # No records: offsets go on after the last purge's marker.
        replicated = ReplicatedLog(open_cache(max(floor, 1)), writer=writer, last_seq=last_seq)
    return replicated


def _now() -> float:
    return time.perf_counter()


def _cancel(in_flight: deque[tuple[OutgoingRun, PendingStore, float]]) -> None:
    """Stop waiting for the answers of the runs in flight (they are sent again)."""
    while in_flight:
        in_flight.popleft()[1].cancel()


class Replicator:
    """Sends the topics' runs to their streams, and deletes the streams of
    deleted topics (see the module). Per topic one task at a time does
    both, in the order asked: a topic deleted and made again writes its
    new records to a new stream, never to the old one."""

    def __init__(self, streams: RunStreams, *, window: int = WINDOW) -> None:
        self.streams = streams
        self._window = window
        self._streams: dict[str, RunStream] = {}
        #: Topics whose log has records to send.
        self._asked: dict[str, ReplicatedLog] = {}
        #: Who to tell when a topic's records are stored (its topic's ``synced``).
        self._told: dict[str, Callable[[], None]] = {}
        #: Topics whose stream is to be deleted (before anything asked after).
        self._deleting: dict[str, None] = {}
        #: Topics a task works for now.
        self._running: set[str] = set()
        self._wake = trio.Event()
        #: Counters for metrics: runs sent (once each), sent again (the
        #: stream did not answer), records the streams stored, logs fenced;
        #: runs the streams answered as held already (resends of a run
        #: stored before); sends not stored, by why (:data:`STORE_FAILURES`).
        self.runs_sent = 0
        self.runs_resent = 0
        self.records_stored = 0
        self.fenced = 0
        self.duplicates = 0
        self.store_failures = dict.fromkeys(STORE_FAILURES, 0)
        #: Seconds from each publish of a run to its stream's acknowledgement
        #: (publishes that were answered; one not answered is resent).
        self.store_times = Histogram(STORE_BOUNDS)
        #: Per topic: the scope of its sender's wait for an answer or a
        #: backoff, cancelled when its stream has a new leader.
        self._waits: dict[str, trio.CancelScope] = {}
        #: When each topic's stream was opened (made, perhaps).
        self._opened: dict[str, float] = {}
        #: Elections of a stream leader heard, and the waits they cut short.
        self.elections = 0
        self.elections_resent = 0
        #: Told each run stored: its topic and its publishes' origins (what
        #: a resumed session is counted from; see ``Broker.stored``).
        self.origins_stored: Callable[[str, list[OriginRun]], None] | None = None
        #: The broker's outbox: what a stored run releases (Confirms, live
        #: deliveries to every subscriber) is written from this task, each
        #: connection's at once (see ``transport._wake``), not by waking
        #: each connection's writer.
        self.outbox: Outbox | None = None

    def leader_elected(self, topic: str) -> None:
        """``topic``'s stream has a new leader: runs in flight that its
        old leader took and did not answer are sent again now (to the new
        one; a resend is never stored twice), not after the answer's
        timeout and a backoff."""
        self.elections += 1
        opened = self._opened.get(topic)
        if opened is not None and _now() - opened < NEW_STREAM_QUIET:
            return  # (the first leader of a stream just made: nothing was lost)
        scope = self._waits.get(topic)
        if scope is not None:
            scope.cancel()

    def ask(
        self, topic: str, replicated: ReplicatedLog, on_stored: Callable[[], None] | None = None
    ) -> None:
        """``replicated`` (``topic``'s log) has records to send, or a purge
        (its cache's retention): the stream is told soon. ``on_stored``
        (the topic's ``synced``) is called each time the stream stored
        some, from now on (None: whoever was told before still is)."""
        if on_stored is not None:
            self._told[topic] = on_stored
        self._asked[topic] = replicated
        self._wake.set()

    def delete_soon(self, topic: str) -> None:
        """Delete ``topic``'s stream (the topic was deleted), before
        anything asked for it from now on is sent."""
        self._asked.pop(topic, None)
        self._told.pop(topic, None)
        self._deleting[topic] = None
        self._streams.pop(topic, None)
        self._opened.pop(topic, None)
        self._wake.set()

    @property
    def busy(self) -> int:
        """Topics with runs or a deletion to send."""
        return len(self._running | self._asked.keys() | self._deleting.keys())

    async def stream(self, topic: str) -> RunStream:
        """``topic``'s stream, opened (created) once."""
        stream = self._streams.get(topic)
        if stream is None:
            stream = await self.streams.open_stream(topic)
            self._streams[topic] = stream
            self._opened[topic] = _now()
        return stream

    async def run(self) -> None:
        """Send, until cancelled: a task per topic with something to send
        (and one that hears of the streams' elections)."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.streams.watch_leaders, self.leader_elected)
            while True:
                await self._wake.wait()
                self._wake = trio.Event()
                for topic in [*self._deleting, *self._asked]:
                    if topic not in self._running:
                        self._running.add(topic)
                        nursery.start_soon(self._serve, topic)

    async def _serve(self, topic: str) -> None:
        """Do what is asked for ``topic`` (a deletion first) until nothing is."""
        try:
            while True:
                if topic in self._deleting:
                    await self._delete(topic)
                    del self._deleting[topic]
                elif topic in self._asked:
                    await self._send(topic, self._asked.pop(topic))
                else:
                    return
        finally:
            self._running.discard(topic)

    async def _delete(self, topic: str) -> None:
        backoff = Backoff(RESEND_FIRST, RESEND_MOST)
        while True:
            try:
                await self.streams.delete_stream(topic)
                return
            except LogError as error:
                delay = backoff.next()
                log.warning(
                    "topic %r: deleting its stream failed (%s): tried again in %.2f s",
                    topic[:64],
                    error,
                    delay,
                )
                await trio.sleep(delay)

    async def _send(self, topic: str, replicated: ReplicatedLog) -> None:
        """Send ``replicated``'s runs in order until none is left (or it is
        closed, or its topic deleted), up to the window in flight one behind
        the other (each expects the one before it), telling the topic as
        each is stored; then the purge it asks for. A run not stored (no
        answer in time, the stream without a leader) has every run in
        flight sent again, in order, after a backoff."""
        backoff = Backoff(RESEND_FIRST, RESEND_MOST)
        in_flight: deque[tuple[OutgoingRun, PendingStore, float]] = deque()
        try:
            while not self._stopped(topic, replicated):
                try:
                    stream = await self.stream(topic)
                    if not in_flight and replicated.in_flight:
                        # (Sent before and not answered: again, in order.)
                        again = replicated.resend()
                        self.runs_resent += len(again)
                        for run in again:
                            in_flight.append((run, await stream.start_publish(run), _now()))
                    new = replicated.runs_to_send(self._window)
                    self.runs_sent += len(new)
                    for run in new:
                        in_flight.append((run, await stream.start_publish(run), _now()))
                    if not in_flight:
                        break
                    pending = in_flight[0][1]
                    with self._interruptible(topic) as wait:
                        seq = await pending.wait()
                    if wait.cancelled_caught:  # (a new leader: the runs in flight again)
                        self.elections_resent += 1
                        _cancel(in_flight)
                        backoff.reset()
                        continue
                    if self._stopped(topic, replicated):
                        return
                    try:
                        self._stored(topic, replicated, in_flight.popleft(), seq)
                        # (The answers that came with it: the topic is told once.)
                        while in_flight and in_flight[0][1].done:
                            seq = await in_flight[0][1].wait()
                            if self._stopped(topic, replicated):
                                return
                            self._stored(topic, replicated, in_flight.popleft(), seq)
                    finally:
                        self._tell(topic)
                    backoff.reset()
                except StreamFenced as error:
                    self.fenced += 1
                    fenced = replicated.fence(str(error))
                    log.error("%s: its log takes no more records", fenced)
                    return
                except LogError as error:  # (unavailable, or refused: tried again)
                    _cancel(in_flight)
                    reason = error.reason if isinstance(error, StreamUnavailable) else ""
                    self.store_failures[reason if reason in STORE_FAILURES else "refused"] += 1
                    delay = backoff.next()
                    log.warning(
                        "topic %r: the stream did not store a run (%s): sent again in %.2f s",
                        topic[:64],
                        error,
                        delay,
                    )
                    with self._interruptible(topic):
                        await trio.sleep(delay)
        finally:
            _cancel(in_flight)
        if not self._stopped(topic, replicated):
            purge = replicated.take_purge()
            if purge:
                await self._purge(topic, replicated, purge)

    def _stored(
        self,
        topic: str,
        replicated: ReplicatedLog,
        sent: tuple[OutgoingRun, PendingStore, float],
        seq: int,
    ) -> None:
        """The oldest run in flight, ``sent``, is stored at ``seq``."""
        run, pending, at = sent
        self.store_times.observe(_now() - at)
        if pending.duplicate:
            self.duplicates += 1
        replicated.stored(run, seq)
        self.records_stored += run.count
        if run.origins and self.origins_stored is not None:
            self.origins_stored(topic, run.origins)

    def _tell(self, topic: str) -> None:
        """Tell ``topic`` (its ``synced``) that runs were stored: what they
        release goes out through the outbox (see :attr:`outbox`)."""
        told = self._told.get(topic)
        if told is None:
            return
        outbox = self.outbox
        if outbox is None:
            told()
            return
        outbox.open()
        try:
            told()
        finally:
            outbox.close()

    @contextmanager
    def _interruptible(self, topic: str) -> Iterator[trio.CancelScope]:
        """A scope for ``topic``'s sender to wait in that an election of its
        stream's leader cancels (see :meth:`leader_elected`)."""
        with trio.CancelScope() as scope:
            self._waits[topic] = scope
            try:
                yield scope
            finally:
                if self._waits.get(topic) is scope:
                    del self._waits[topic]

    def _stopped(self, topic: str, replicated: ReplicatedLog) -> bool:
        """Whether sending ``replicated``'s runs is over: it was closed, or its
        topic deleted."""
        return replicated.closed or topic in self._deleting

    async def _purge(self, topic: str, replicated: ReplicatedLog, seq: int) -> None:
        """Delete the stream's messages below ``seq`` (the records the log
        purged or retention deleted); a failure is logged and asked again
        with the next run (the purge's marker is in the stream already)."""
        try:
            stream = await self.stream(topic)
            await stream.purge_below(seq)
        except LogError as error:
            replicated.purge_failed(seq)
            log.warning("topic %r: purging its stream failed (%s)", topic[:64], error)
