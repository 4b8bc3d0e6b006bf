"""Staged publishes in the cluster (cluster mode): a batch staged through a
front end can be committed whatever became of that front end's disk.

A standalone broker keeps its staged publishes in its state journal
(``_area``). A front end keeps them in one JetStream stream as well,
:data:`STREAM` (``cluster_replicas`` copies, file storage, messages older
than twice ``staging_ttl`` dropped): each *staged run*, the publishes one
publish channel staged together (at most :data:`RUN_RECORDS` of them and
about :data:`RUN_BYTES`), is one message on the subject of its batch and
topic (:func:`staged_subject`) whose ``Nats-Msg-Id`` is the run's origin
(its client session, topic handle, first index and count), so a resend is
answered "duplicate" instead of being stored twice.

- **A staged publish is confirmed once its run is stored** (the stream's
  answer: a quorum has it). Until then the run is a loan on its channel's
  account, so a stream that does not answer (an election) withholds that
  channel's guarantees and TCP holds the rest; the run is sent again, with
  the same id, until it is answered (:class:`StagedSender`, at most four
  runs of a channel in flight, handed on in order). Only then is
  it put in the front end's staging area (and journal), which is a cache:
  a front end restarted on its disk completes a commit it had cut off
  without anyone asking.
- **A Commit** that lists members this front end does not hold in full
  (they staged through a front end since replaced, or this one before its
  disk was) loads the batch's runs from the stream
  (:meth:`StagingStore.load`): the publishes to the topics it owns, each
  once by its origin, replace what it held of the batch, and the commit is
  decided on them (``_registry``).
- **Dropped from the stream:** a share's subjects once its commit is
  noted "committed" in the registry; the whole batch on an Abort (an
  Abort means the batch is given up on every broker); a batch's subjects
  when it expires here. Anything left over (a front end lost before it
  dropped them) goes with the stream's age limit.
"""

from __future__ import annotations

import logging
import secrets
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import cbor2
import trio

from accounts import Account, LoanedItem
from broker.backoff import Backoff
from broker.errors import BrokerError
from broker.nats import JetStream, JetStreamError, NatsError, StreamConfig

from .._peer_logging import shown
from ..storage._jetstream import topic_token
from ._records import BatchKey, commit_origin

__all__ = [
    "RUN_BYTES",
    "RUN_RECORDS",
    "STREAM",
    "JetStreamStaging",
    "StagedRun",
    "StagedSender",
    "StagingCounters",
    "StagingStore",
    "StagingUnavailable",
    "drop_quietly",
    "open_staging_stream",
    "staged_subject",
]

log = logging.getLogger("broker.server")

#: The stream's name and the prefix of its subjects.
STREAM = "broker-staging"
SUBJECT_PREFIX = "broker.staging."
#: Publishes in one staged run at most, and about the bytes (one more
#: publish may pass it).
RUN_RECORDS = 64
RUN_BYTES = 256 * 1024
#: Staged runs of one channel sent and not yet stored, at most.
RUNS_IN_FLIGHT = 4
#: Messages read from the stream at a time by a load.
LOAD_BATCH = 256
#: Seconds between two warnings of a stream that does not store runs.
WARN_EVERY = 10.0


@dataclass(slots=True)
class StagingCounters:
    """Totals since the front end started (for metrics)."""

    #: Staged runs the stream stored (each counted once, however often sent).
    runs_stored: int = 0
    #: Sends of a staged run the stream did not answer (each sent again).
    runs_resent: int = 0
    #: Batches a commit read from the stream (not all held here).
    batches_read: int = 0


class StagingUnavailable(BrokerError):
    """The staging stream did not answer (asked again later)."""


def staged_subject(batch: BatchKey, topic: str | None) -> str:
    """The subject of ``batch``'s runs to ``topic`` (None: to any topic)."""
    token = "*" if topic is None else topic_token(topic)
    return f"{SUBJECT_PREFIX}{commit_origin(batch).hex()}.{token}"


@dataclass(slots=True, eq=False)
class StagedRun:
    """Publishes one channel staged together: their batch, member and topic,
    their origin (client session, topic handle, index of the first; no
    session: ``b""``) and each one's ``(key, Deliver tail, cost)``."""

    batch: BatchKey
    member: str
    topic: str
    session: bytes
    handle: int
    first: int
    entries: list[tuple[bytes | None, bytes, int]] = field(default_factory=list)

    @property
    def msg_id(self) -> str:
        """The run's ``Nats-Msg-Id``: its origin (a random one without a session)."""
        if not self.session:
            return "staged-" + secrets.token_hex(12)
        return f"{self.session.hex()}.{self.handle}.{self.first}.{len(self.entries)}"

    def encode(self) -> bytes:
        """The run as its message's body (CBOR)."""
        owner, name = self.batch
        entries = [[key, tail, cost] for key, tail, cost in self.entries]
        return cbor2.dumps(
            [owner, name, self.member, self.topic, self.session, self.handle, self.first, entries]
        )


def decode_run(body: bytes) -> StagedRun | None:
    """A run read from the stream, checked; None if it is not one (damage,
    or a message the broker did not write)."""
    try:
        owner, name, member, topic, session, handle, first, entries = cbor2.loads(body)
    except Exception:
        return None
    if not (
        (owner is None or isinstance(owner, str))
        and isinstance(name, str)
        and isinstance(member, str)
        and isinstance(topic, str)
        and isinstance(session, bytes)
        and isinstance(handle, int)
        and isinstance(first, int)
        and isinstance(entries, list)
    ):
        return None
    run = StagedRun((owner, name), member, topic, session, handle, first)
    for entry in entries:
        if not (
            isinstance(entry, list)
            and len(entry) == 3
            and (entry[0] is None or isinstance(entry[0], bytes))
            and isinstance(entry[1], bytes)
            and isinstance(entry[2], int)
        ):
            return None
        run.entries.append((entry[0], entry[1], entry[2]))
    return run


class StagingStore(Protocol):
    """Where staged runs are kept in the cluster (the JetStream stream, or
    the tests' memory). Each call raises :class:`StagingUnavailable` if it
    was not answered."""

    #: Its totals (the sender and the commit registry count into them).
    counters: StagingCounters

    async def append(self, run: StagedRun) -> None:
        """Store ``run`` (a resend of a stored run is not stored twice)."""
        ...

    async def load(self, batch: BatchKey) -> list[StagedRun]:
        """Every run of ``batch`` stored, in the order stored (a resend stored
        twice, past the duplicate window, is there twice)."""
        ...

    async def drop(self, batch: BatchKey, topics: set[str] | None) -> None:
        """Remove ``batch``'s runs to ``topics`` (None: all of them)."""
        ...


class JetStreamStaging:
    """The staged runs in stream :data:`STREAM` (a :class:`StagingStore`)."""

    def __init__(self, js: JetStream, *, timeout: float = 5.0) -> None:
        self.js = js
        self.timeout = timeout
        self.counters = StagingCounters()

    async def append(self, run: StagedRun) -> None:
        subject = staged_subject(run.batch, run.topic)
        try:
            await self.js.publish(subject, run.encode(), msg_id=run.msg_id, timeout=self.timeout)
        except (NatsError, trio.WouldBlock) as error:
            raise StagingUnavailable(f"storing a staged run: {error}") from None

    async def load(self, batch: BatchKey) -> list[StagedRun]:
        subject = staged_subject(batch, None)
        try:
            last = await self.js.get_last_msg(STREAM, subject)
            if last is None:
                return []
            reader = self.js.ordered(STREAM, 1, filter_subject=subject, inactive_threshold=10.0)
            runs: list[StagedRun] = []
            while reader.next_seq <= last.seq:
                for message in await reader.fetch(LOAD_BATCH, expires=1.0):
                    run = decode_run(message.payload)
                    if run is None or run.batch != batch:
                        log.error(
                            "staging stream: message %d of %s is not a staged run: left out",
                            message.stream_seq,
                            shown(batch[1]),
                        )
                        continue
                    runs.append(run)
            return runs
        except NatsError as error:
            raise StagingUnavailable(f"reading staged batch {shown(batch[1])}: {error}") from None

    async def drop(self, batch: BatchKey, topics: set[str] | None) -> None:
        subjects = (
            [staged_subject(batch, None)]
            if topics is None
            else [staged_subject(batch, topic) for topic in sorted(topics)]
        )
        try:
            for subject in subjects:
                await self.js.purge_stream(STREAM, subject=subject)
        except NatsError as error:
            raise StagingUnavailable(f"dropping staged batch {shown(batch[1])}: {error}") from None


def staging_stream_config(replicas: int, ttl: float) -> StreamConfig:
    """The configuration of :data:`STREAM`: ``replicas`` copies, messages
    kept for twice ``ttl`` (the staging ttl) at most."""
    return StreamConfig(
        name=STREAM,
        subjects=[SUBJECT_PREFIX + ">"],
        storage="file",
        num_replicas=replicas,
        discard="old",
        max_age=2 * ttl,
        description="broker: staged publishes waiting for their batch's commit",
    )


async def open_staging_stream(js: JetStream, replicas: int, ttl: float) -> JetStreamStaging:
    """The staging stream (made, or its age limit brought to ``ttl``'s);
    :class:`StagingUnavailable` if JetStream does not answer, its own
    :class:`JetStreamError` if it refuses the configuration."""
    config = staging_stream_config(replicas, ttl)
    try:
        try:
            await js.add_stream(config)
        except JetStreamError as error:
            if error.err_code != 10058:  # (exists with another configuration)
                raise
            await js.update_stream(config)
    except NatsError as error:
        if isinstance(error, JetStreamError) and error.code != 503:
            raise
        raise StagingUnavailable(f"making stream {STREAM}: {error}") from None
    return JetStreamStaging(js)


@dataclass(slots=True, eq=False)
class _Outgoing:
    """A run on its way: its loans and cost, whether a task was started
    for it, whether that task took it (nothing more is added then) and
    whether it is stored."""

    run: StagedRun
    loans: list[LoanedItem[None]] = field(default_factory=list)
    size: int = 0
    cost: int = 0
    started: bool = False
    taken: bool = False
    stored: bool = False


class StagedSender:
    """One staged publish channel's runs on their way to the stream, at most
    :data:`RUNS_IN_FLIGHT` at a time (see the module).

    :meth:`add` queues a publish as a loan on ``account`` (the channel's)
    in the channel's open run; a task in ``nursery`` takes the run when it
    starts (the publishes of one read of the socket go together) and sends
    it until it is stored (a run not answered is sent again with the same
    id, after a backoff). Stored runs are handed on in the order they were
    made: their loans repaid, ``stored(run)`` called. Cancelling
    ``nursery`` drops what was not stored (the client sends it again on
    its resume)."""

    def __init__(
        self,
        store: StagingStore,
        account: Account,
        nursery: trio.Nursery,
        stored: Callable[[StagedRun], None],
    ) -> None:
        self.store = store
        self.account = account
        self.nursery = nursery
        self.stored = stored
        #: Runs not handed on yet, in the order made (the last may be open).
        self.runs: deque[_Outgoing] = deque()
        #: Tasks sending a run.
        self.sending = 0
        self._warned = -WARN_EVERY

    def add(
        self,
        batch: BatchKey,
        member: str,
        topic: str,
        origin: tuple[bytes, int, int],
        entry: tuple[bytes | None, bytes, int],
    ) -> None:
        """Queue one staged publish (its ``origin``: session, handle, index)."""
        session, handle, index = origin
        last = self.runs[-1] if self.runs else None
        if (
            last is None
            or last.taken
            or last.run.batch != batch
            or last.run.member != member
            or len(last.run.entries) >= RUN_RECORDS
            or last.size >= RUN_BYTES
            or last.run.first + len(last.run.entries) != index
        ):
            last = _Outgoing(StagedRun(batch, member, topic, session, handle, index))
            self.runs.append(last)
        last.run.entries.append(entry)
        last.loans.append(LoanedItem(self.account, len(entry[1]), None))
        last.size += len(entry[1])
        last.cost += entry[2]
        self._start()

    def _start(self) -> None:
        for outgoing in self.runs:
            if self.sending >= RUNS_IN_FLIGHT:
                return
            if not outgoing.started:
                outgoing.started = True
                self.sending += 1
                self.nursery.start_soon(self._send, outgoing)

    async def _send(self, outgoing: _Outgoing) -> None:
        outgoing.taken = True
        run = outgoing.run
        backoff = Backoff(0.05, 2.0)
        try:
            while True:
                try:
                    await self.store.append(run)
                    break
                except StagingUnavailable as error:
                    self.store.counters.runs_resent += 1
                    now = trio.current_time()
                    if now - self._warned >= WARN_EVERY:
                        self._warned = now
                        log.warning(
                            "staging stream: a run of batch %s was not stored (%s): "
                            "sent again, its publishes not confirmed meanwhile",
                            shown(run.batch[1]),
                            error,
                        )
                    await trio.sleep(backoff.next())
        finally:
            self.sending -= 1
        self.store.counters.runs_stored += 1
        outgoing.stored = True
        runs = self.runs
        while runs and runs[0].stored:  # (handed on in order)
            done = runs.popleft()
            for loan in done.loans:
                loan.repay()
            self.stored(done.run)
        self._start()

    def close(self) -> int:
        """Drop what was not handed on (the broker stops: the client sends it
        again) and repay its loans; returns the cost of what was dropped."""
        cost = 0
        for outgoing in self.runs:
            cost += outgoing.cost
            for loan in outgoing.loans:
                loan.repay()
        self.runs.clear()
        return cost


async def drop_quietly(store: StagingStore, batch: BatchKey, topics: set[str] | None) -> None:
    """:meth:`StagingStore.drop`, once: not answered, the runs are left to
    the stream's age limit (said in the log)."""
    try:
        await store.drop(batch, topics)
    except StagingUnavailable as error:
        log.warning(
            "staging stream: staged batch %s was not dropped (%s): its runs go with "
            "the stream's age limit",
            shown(batch[1]),
            error,
        )
