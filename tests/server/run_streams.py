"""An in-memory stream engine with JetStream's write rules, for tests of
replication without a NATS server: a message id seen before is answered
as a duplicate (with the first copy's sequence), a message that expects
another last sequence is refused, and failures can be scheduled; and a
record bucket with JetStream KV's compare-and-set; and the staging stream."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from broker.log import LogError
from broker.server.sessions._cluster_records import RecordConflict, RecordsUnavailable
from broker.server.staging._records import BatchKey
from broker.server.staging._stream import (
    StagedRun,
    StagingCounters,
    StagingUnavailable,
    decode_run,
    staged_subject,
)
from broker.server.storage._replicated import OutgoingRun
from broker.server.storage._replication import StoredRun, StreamFenced, StreamUnavailable


@dataclass
class Answered:
    """A run's answer, known already (see :meth:`MemoryStream.start_publish`)."""

    seq: int
    error: LogError | None

    #: Never answered (a leader that died with the run): waits until cancelled.
    lost: bool = False
    #: The stream held the run already (its message id seen before).
    duplicate: bool = False

    @property
    def done(self) -> bool:
        return not self.lost

    async def wait(self) -> int:
        await trio.lowlevel.checkpoint()
        if self.lost:
            await trio.sleep_forever()
        if self.error is not None:
            raise self.error
        return self.seq

    def cancel(self) -> None:
        pass


@dataclass
class MemoryStream:
    """One topic's stream."""

    messages: list[StoredRun] = field(default_factory=list)
    ids: dict[str, int] = field(default_factory=dict)
    last_seq: int = 0
    #: Failures to raise on the next publishes: "before" (nothing stored)
    #: or "after" (stored, the answer lost), oldest first; "unanswered":
    #: nothing stored and no answer ever (see :meth:`start_publish`).
    failures: list[str] = field(default_factory=list)
    publishes: int = 0

    async def publish(self, run: OutgoingRun) -> int:
        await trio.lowlevel.checkpoint()
        return self.publish_now(run)

    async def start_publish(self, run: OutgoingRun) -> Answered:
        """The run is taken (or refused) at once; its answer comes when awaited
        (an "unanswered" failure: never)."""
        if self.failures and self.failures[0] == "unanswered":
            self.failures.pop(0)
            self.publishes += 1
            return Answered(0, None, lost=True)
        held = run.msg_id in self.ids
        try:
            return Answered(self.publish_now(run), None, duplicate=held)
        except LogError as error:
            return Answered(0, error)

    def publish_now(self, run: OutgoingRun) -> int:
        """:meth:`publish` without the checkpoint (for tests outside trio)."""
        self.publishes += 1
        failure = self.failures.pop(0) if self.failures else None
        if failure == "before":
            raise StreamUnavailable("no responders (scheduled)", "no_responders")
        seq = self.ids.get(run.msg_id)
        if seq is None:
            if run.expected_last_seq != self.last_seq:
                raise StreamFenced(
                    f"wrong last sequence: {self.last_seq} (expected {run.expected_last_seq})"
                )
            seq = self.last_seq = self.last_seq + 1
            self.ids[run.msg_id] = seq
            self.messages.append(
                StoredRun(seq, run.first_offset, run.count, run.body, list(run.origins))
            )
        if failure == "after":
            raise StreamUnavailable("timed out (scheduled, stored)", "timeout")
        return seq

    async def fetch(self, from_seq: int, max_messages: int) -> list[StoredRun]:
        await trio.lowlevel.checkpoint()
        return [m for m in self.messages if m.seq >= from_seq][:max_messages]

    async def purge_below(self, seq: int) -> None:
        await trio.lowlevel.checkpoint()
        self.purge_now(seq)

    def purge_now(self, seq: int) -> None:
        self.messages = [m for m in self.messages if m.seq >= seq]

    def append_foreign(self, first_offset: int, count: int, body: bytes) -> None:
        """Another writer's message (a fence for this one)."""
        self.last_seq += 1
        self.messages.append(StoredRun(self.last_seq, first_offset, count, body))


@dataclass
class MemoryStreams:
    """The streams of every topic, kept across the front ends that open them."""

    streams: dict[str, MemoryStream] = field(default_factory=dict)
    _elected: Callable[[str], None] | None = field(default=None, repr=False)

    async def open_stream(self, topic: str) -> MemoryStream:
        await trio.lowlevel.checkpoint()
        return self.streams.setdefault(topic, MemoryStream())

    async def topics(self) -> list[str]:
        await trio.lowlevel.checkpoint()
        return sorted(self.streams)

    async def watch_leaders(self, elected: Callable[[str], None]) -> None:
        """Tell ``elected`` of each topic named to :meth:`elect` (a test's election)."""
        self._elected = elected
        await trio.sleep_forever()

    def elect(self, topic: str) -> None:
        """``topic``'s stream has a new leader (the replicator hears of it)."""
        assert self._elected is not None, "no replicator watches the leaders"
        self._elected(topic)

    async def delete_stream(self, topic: str) -> bool:
        await trio.lowlevel.checkpoint()
        return self.streams.pop(topic, None) is not None


@dataclass
class MemoryBucket:
    """A record bucket with JetStream KV's write rules (a
    ``sessions._cluster_records.RecordBucket``): every write is a
    compare-and-set on the key's last revision; failures can be scheduled
    ("unavailable": nothing written; "answer lost": written, the answer
    lost)."""

    values: dict[str, tuple[bytes, int]] = field(default_factory=dict)
    #: Each key's last revision, deletions included.
    last: dict[str, int] = field(default_factory=dict)
    revision: int = 0
    failures: list[str] = field(default_factory=list)
    writes: int = 0
    #: Key prefixes whose writes are never answered (a write still on its way).
    unanswered: set[str] = field(default_factory=set)

    async def write(self, key: str, value: bytes | None, last_revision: int) -> int:
        await trio.lowlevel.checkpoint()
        if any(key.startswith(prefix) for prefix in self.unanswered):
            await trio.sleep_forever()
        failure = self.failures.pop(0) if self.failures else None
        if failure == "unavailable":
            raise RecordsUnavailable("no answer (scheduled)")
        last = self.last.get(key, 0)
        if last_revision != last and not (last_revision == 0 and key not in self.values):
            raise RecordConflict(f"{key}: wrong last revision {last_revision} (last {last})")
        self.writes += 1
        self.revision += 1
        self.last[key] = self.revision
        if value is None:
            self.values.pop(key, None)
        else:
            self.values[key] = (value, self.revision)
        if failure == "answer lost":
            raise RecordsUnavailable("stored, the answer lost (scheduled)")
        return self.revision

    async def session(self, session: str) -> dict[str, tuple[bytes, int]]:
        await trio.lowlevel.checkpoint()
        return {k: v for k, v in self.values.items() if k.split(".", 1)[1] == session}

    async def read(self, key: str) -> tuple[bytes, int] | None:
        await trio.lowlevel.checkpoint()
        return self.values.get(key)

    async def scan(self, prefix: str) -> dict[str, tuple[bytes, int]]:
        await trio.lowlevel.checkpoint()
        failure = self.failures.pop(0) if self.failures else None
        if failure is not None:
            raise RecordsUnavailable(f"no answer (scheduled {failure!r})")
        return {k: v for k, v in self.values.items() if k.startswith(prefix)}

    def write_now(self, key: str, value: bytes) -> None:
        """Another front end's write (a takeover)."""
        self.revision += 1
        self.last[key] = self.revision
        self.values[key] = (value, self.revision)


class HeldBucket(MemoryBucket):
    """A :class:`MemoryBucket` whose next write can be held in flight
    (:meth:`hold`): it waits, sent but not yet stored, until released."""

    _held: tuple[trio.Event, trio.Event] | None = None

    def hold(self) -> tuple[trio.Event, trio.Event]:
        """Hold the next write: (set once it is in flight, set to release it)."""
        self._held = (trio.Event(), trio.Event())
        return self._held

    async def write(self, key: str, value: bytes | None, last_revision: int) -> int:
        if self._held is not None:
            (in_flight, release), self._held = self._held, None
            in_flight.set()
            await release.wait()
        return await super().write(key, value, last_revision)


@dataclass
class MemoryStaging:
    """The staging stream in memory (a ``staging._stream.StagingStore``): a
    run's message id seen before is a duplicate; while ``released`` is not
    set, appends are not answered (an election); the next ``unavailable``
    appends fail."""

    #: Encoded runs in the order stored, with their subject.
    messages: list[tuple[str, bytes]] = field(default_factory=list)
    ids: set[str] = field(default_factory=set)
    released: trio.Event | None = None
    unavailable: int = 0
    counters: StagingCounters = field(default_factory=StagingCounters)
    appended: int = 0
    duplicates: int = 0

    async def append(self, run: StagedRun) -> None:
        await trio.lowlevel.checkpoint()
        if self.unavailable:
            self.unavailable -= 1
            raise StagingUnavailable("no answer (scheduled)")
        if self.released is not None:
            await self.released.wait()
        self.appended += 1
        if run.msg_id in self.ids:
            self.duplicates += 1
            return
        self.ids.add(run.msg_id)
        self.messages.append((staged_subject(run.batch, run.topic), run.encode()))

    async def load(self, batch: BatchKey) -> list[StagedRun]:
        await trio.lowlevel.checkpoint()
        prefix = staged_subject(batch, None)[:-1]
        runs = [decode_run(body) for subject, body in self.messages if subject.startswith(prefix)]
        return [run for run in runs if run is not None]

    async def drop(self, batch: BatchKey, topics: set[str] | None) -> None:
        await trio.lowlevel.checkpoint()
        if topics is None:
            prefix = staged_subject(batch, None)[:-1]
            self.messages = [m for m in self.messages if not m[0].startswith(prefix)]
        else:
            subjects = {staged_subject(batch, topic) for topic in topics}
            self.messages = [m for m in self.messages if m[0] not in subjects]

    def publishes(self) -> int:
        """Publishes the runs stored hold."""
        return sum(len(run.entries) for _, body in self.messages if (run := decode_run(body)))
