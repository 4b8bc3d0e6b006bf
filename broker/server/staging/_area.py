"""Staged publishing: publishes held in the broker until a commit makes them visible.

A client binds a topic handle with a :class:`~broker.protocol.Stage`
(``batch``, ``member``): what it publishes on that handle is confirmed as
usual but kept here instead of being routed. A ``Commit`` of the batch lists
the members to make visible, with the number of publishes each staged; they
are routed in that order and the batch's other members (failed or
duplicate attempts) are discarded. An ``Abort`` discards what the batch has
staged so far; the batch may be staged and committed afresh later (a
streaming micro-batch run again after a failure). A committed batch is
remembered (the last ``remember`` of them), so committing it again changes
nothing (a retried commit is idempotent) and anything staged into it later
is dropped (a late attempt must never become visible).

Batches belong to the principal that staged them (``None`` without
authentication); only it may commit or abort them. Staged publishes are
loans on one ``staging`` account, so broker memory and its metrics count
them; the area refuses to hold more than ``limit`` bytes, and discards a
batch neither committed nor aborted within ``ttl`` seconds.

With a :class:`~broker.log.StateJournal` (a broker with a data directory)
both survive a restart: every staged publish is put in the journal as it is
staged (and deleted once its batch is committed, aborted or expired), and a
committed batch is put there once its publishes are routed
(:meth:`StagingArea.routed`), bounded by ``remember`` as in memory. A new
area on the same journal restores them: a batch staged before the restart
commits, one committed before it is a duplicate. The area only puts; the
broker writes the journal (see :meth:`StagingArea.routed`).

A commit is atomic across a crash of the process (not a power cut: the
journal is written, not fsynced, at each step): its members are put in the journal
(``committing``) before anything is routed, and before each run of its
publishes is appended to a topic's log, where in the log it goes
(:meth:`StagingArea.progress`). A stop that cuts the routing off leaves
the batch in :attr:`StagingArea.unfinished`; at start-up the broker finds
how much of each topic's share is in the log and routes only the rest
(:meth:`StagingArea.resume`), so the batch is then visible wholly and
once, and a retried commit is a duplicate.
"""

from __future__ import annotations

import itertools
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from accounts import Account, LoanedItem, unlimited
from broker.log import StateJournal
from broker.protocol import OutcomeStatus, Stage

from .._peer_logging import shown
from ._records import (
    SPACE_COMMITTED,
    SPACE_COMMITTING,
    SPACE_PROGRESS,
    SPACE_STAGED,
    Gap,
    Members,
    Origin,
    Progress,
    batch_id,
    origin_of,
    parse_batch_id,
    parse_members,
    parse_progress,
    parse_staged,
    progress_id,
)
from ._records import BatchKey as BatchKey  # (re-exported)
from ._stream import StagedRun

log = logging.getLogger("broker.server")

#: What a staged publish holds besides its Deliver tail's bytes (its records
#: and its loan; measured with tracemalloc on CPython 3.11: about 168 bytes),
#: so that ``staging_limit`` bounds the memory really used.
STAGED_PUBLISH_OVERHEAD = 176

#: The reason of a "committed" Outcome for a batch whose first commit a stop
#: cut off while it was routing, by a broker that did not record its
#: members (before commits were completed at start-up).
INTERRUPTED = (
    "the broker stopped while it routed this batch before: the messages routed "
    "then are now routed a second time"
)


#: The sort key of runs without an origin (kept in the order stored).
_NONE = (b"", 0, 0)

#: The reason of a "duplicate" Outcome.
COMMITTED_BEFORE = "the batch was committed before"


@dataclass(slots=True, eq=False)
class StagedPublish:
    """One staged publish: its topic, its encoded Deliver tail (as a loan on
    the staging account) and its key (``latest`` subscriptions keep one per key)."""

    topic: str
    loan: LoanedItem[bytes]
    key: bytes | None


@dataclass(slots=True, eq=False)
class StagedBatch:
    """The members of one batch, each with its publishes in the order staged."""

    #: When the batch last staged a publish (its ttl counts from then);
    #: None for a batch restored from the journal until the next
    #: :meth:`StagingArea.expire` (its ttl starts again after a restart).
    last_staged: float | None
    members: dict[str, list[StagedPublish]] = field(default_factory=dict)
    size: int = 0
    #: The journal keys of its publishes (empty without a journal).
    journal_keys: list[str] = field(default_factory=list)
    #: Per (client session, topic handle): the highest index staged (a
    #: publish staged again, at or below it, is held already).
    origins: dict[tuple[bytes, int], int] = field(default_factory=dict)

    @property
    def messages(self) -> int:
        return sum(len(publishes) for publishes in self.members.values())


@dataclass(slots=True, eq=False)
class UnfinishedCommit:
    """A commit a stop cut off while it routed, restored from the journal:
    its publishes in commit order and where each topic's share was going."""

    publishes: list[StagedPublish]
    #: The journal keys of the batch's staged publishes (all its members').
    journal_keys: list[str]
    #: Per topic, the last run of its publishes put before being appended.
    progress: dict[str, Progress] = field(default_factory=dict)
    #: Why the broker cannot complete it here ("" until it tried): a commit
    #: or abort of the batch is refused with this.
    blocked: str = ""
    #: The members its commit listed, with their counts.
    members: Members = field(default_factory=list)

    def routed_before(self, topic: str, next_offset: int, gaps: Iterable[Gap] = ()) -> int:
        """Of the batch's publishes to ``topic``, how many its log holds: those
        before the last run put, and of that run those from its offset up to a
        gap or ``next_offset`` (a run goes in whole; ``gaps``: a torn tail's)."""
        place = self.progress.get(topic)
        if place is None:
            return 0
        index, offset, count = place
        end = min([next_offset, *(first for first, _ in gaps if first >= offset)])
        return index + min(max(end - offset, 0), count)


@dataclass(slots=True)
class CommitDecision:
    """A Commit's Outcome and, ``COMMITTED``, the publishes to route in order."""

    status: OutcomeStatus
    messages: int = 0
    reason: str = ""
    publishes: list[StagedPublish] = field(default_factory=list)


@dataclass(slots=True)
class StagingCounters:
    """Totals since the broker started (for metrics)."""

    #: Outcomes sent: committed, duplicate, aborted, refused.
    outcomes: dict[str, int] = field(
        default_factory=lambda: {status.name.lower(): 0 for status in OutcomeStatus}
    )
    #: Staged publishes discarded: by an abort, as members a commit left out,
    #: past the ttl, or staged into a batch already committed.
    discarded: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(("aborted", "superseded", "expired", "late"), 0)
    )
    committed_messages: int = 0


class StagingArea:
    """The broker's staged batches (see the module's description)."""

    def __init__(
        self,
        parent: Account,
        *,
        limit: int,
        ttl: float,
        remember: int,
        journal: StateJournal | None = None,
    ) -> None:
        """With ``journal``, restore what it holds (staged publishes are
        charged to :attr:`account` again, even beyond ``limit``) and keep it
        up to date from then on."""
        #: Every staged publish is a loan on this account.
        self.account = unlimited("staging", parent=parent, kind="staging")
        self.limit = limit
        self.ttl = ttl
        self.remember = remember
        self.batches: dict[BatchKey, StagedBatch] = {}
        #: Batches committed (oldest first).
        self.finished: OrderedDict[BatchKey, None] = OrderedDict()
        self.counters = StagingCounters()
        self.size = 0
        #: Bytes of publishes on their way to the cluster's staging stream
        #: (cluster mode), counted against ``limit`` with :attr:`size`.
        self.pending = 0
        self.journal = journal
        #: Committed batches being routed: the journal keys of their publishes.
        self._routing: dict[BatchKey, list[str]] = {}
        #: Batches whose commit a stop cut off while routing (restored from
        #: the journal's ``committing`` marks): the broker completes them
        #: at start-up (:meth:`resume`) or says why not (:meth:`block`).
        self.unfinished: dict[BatchKey, UnfinishedCommit] = {}
        #: Those restored from a broker that did not record the members:
        #: staged again, their next commit says so (:data:`INTERRUPTED`).
        self.interrupted: set[BatchKey] = set()
        #: Per commit being routed, the topics it put progress for.
        self._progress_topics: dict[BatchKey, set[str]] = {}
        #: Per commit being routed, the members it listed with their counts.
        self.routing_members: dict[BatchKey, Members] = {}
        self._serial = 0
        #: Per (session, handle): the highest index of its publishes restored.
        self._held_origins: dict[tuple[bytes, int], int] = {}
        if journal is not None:
            self._restore(journal)

    def held_origins(self) -> dict[tuple[bytes, int], int]:
        """Per client (session, topic handle): the highest index of the
        publishes of its the journal held staged when this area was made."""
        return self._held_origins

    @property
    def messages(self) -> int:
        """Publishes staged now."""
        return sum(batch.messages for batch in self.batches.values())

    def stage(
        self,
        owner: str | None,
        stage: Stage,
        topic: str,
        tail: bytes,
        key: bytes | None,
        cost: int,
        now: float,
        origin: Origin | None = None,
    ) -> str | None:
        """Stage one publish (``tail``: its encoded Deliver tail; ``cost``: the
        bytes it holds; ``origin``: its client session, handle and index,
        journalled with it). Returns why it cannot be staged, or None. One
        whose origin the batch holds already is not staged again.

        A publish into a batch already committed is accepted and dropped at
        once (a late attempt of a finished batch: its data must never become
        visible).
        """
        batch_key = (owner, stage.batch)
        if self.decided(batch_key):
            self.counters.discarded["late"] += 1
            return None
        refusal = self.no_room(cost)
        if refusal is not None:
            return refusal
        batch = self.batches.get(batch_key)
        if batch is None:
            batch = self.batches[batch_key] = StagedBatch(now)
        batch.last_staged = now
        self._hold(batch, batch_key, stage.member, topic, tail, key, cost, origin)
        return None

    def stored(self, run: StagedRun, now: float) -> None:
        """Cluster mode: stage the publishes of ``run``, which the staging
        stream stored (their room was counted in :attr:`pending`, and is
        taken from there): as :meth:`stage` for each, without the limit."""
        self.pending -= sum(entry[2] for entry in run.entries)
        batch_key = run.batch
        if self.decided(batch_key):
            self.counters.discarded["late"] += len(run.entries)
            return
        batch = self.batches.get(batch_key)
        if batch is None:
            batch = self.batches[batch_key] = StagedBatch(now)
        batch.last_staged = now
        member, topic, session, handle = run.member, run.topic, run.session, run.handle
        for index, (key, tail, cost) in enumerate(run.entries, run.first):
            origin = (session, handle, index) if session else None
            self._hold(batch, batch_key, member, topic, tail, key, cost, origin)

    def no_room(self, cost: int) -> str | None:
        """Why a publish of ``cost`` bytes cannot be staged now (None: it can)."""
        if self.size + self.pending + cost > self.limit:
            return (
                f"the staging area is full ({self.size + self.pending} of {self.limit} bytes): "
                "commit or abort staged batches, or raise staging_limit"
            )
        return None

    def _hold(
        self,
        batch: StagedBatch,
        batch_key: BatchKey,
        member: str,
        topic: str,
        tail: bytes,
        key: bytes | None,
        cost: int,
        origin: Origin | None,
    ) -> None:
        """Add one publish to ``batch`` (and the journal), unless its origin
        says the batch holds it already."""
        if origin is not None:
            place = origin[:2]
            if origin[2] <= batch.origins.get(place, 0):
                return
            batch.origins[place] = origin[2]
        publish = StagedPublish(topic, LoanedItem(self.account, cost, tail), key)
        batch.members.setdefault(member, []).append(publish)
        batch.size += cost
        self.size += cost
        if self.journal is not None:
            self._serial += 1
            journal_key = f"{self._serial:020d}"
            record = [*batch_key, member, topic, key, tail, cost, *(origin or ())]
            self.journal.put(SPACE_STAGED, journal_key, record)
            batch.journal_keys.append(journal_key)

    def decided(self, batch_key: BatchKey) -> bool:
        """Whether ``batch_key`` was committed here (or is being completed):
        what is staged into it now is dropped."""
        return batch_key in self.finished or batch_key in self.unfinished

    def holds(self, batch_key: BatchKey, members: Members) -> bool:
        """Whether each of ``members`` staged here exactly the publishes listed
        (or the batch was decided here)."""
        if self.decided(batch_key):
            return True
        batch = self.batches.get(batch_key)
        staged = {} if batch is None else batch.members
        return all(len(staged.get(member, ())) == count for member, count in members)

    def adopt(self, batch_key: BatchKey, runs: Iterable[StagedRun], now: float) -> int:
        """Cluster mode: replace what is staged here of ``batch_key`` by
        ``runs`` (read from the cluster's staging stream: what the batch
        staged through any front end), each publish once by its origin, even
        beyond ``limit`` (they are staged already). Returns how many publishes
        it now holds. A batch decided here is left as it is."""
        if self.decided(batch_key):
            return 0
        old = self.batches.pop(batch_key, None)
        if old is not None:
            self.size -= old.size
            for member in old.members.values():
                for publish in member:
                    publish.loan.repay()
            self._unjournal(old)
        batch = self.batches[batch_key] = StagedBatch(now)
        # (Each channel's runs in the order of their publishes: a run sent
        # again may be stored after the next one.)
        for run in sorted(
            runs, key=lambda r: (r.session, r.handle, r.first) if r.session else _NONE
        ):
            for index, (key, tail, cost) in enumerate(run.entries, run.first):
                origin = (run.session, run.handle, index) if run.session else None
                self._hold(batch, batch_key, run.member, run.topic, tail, key, cost, origin)
        if not batch.members:
            del self.batches[batch_key]
        return batch.messages

    def commit(
        self,
        owner: str | None,
        batch_name: str,
        members: Members,
        elsewhere: Callable[[str], str | None] | None = None,
    ) -> CommitDecision:
        """Decide a Commit of ``batch_name`` listing ``members`` with their counts.

        Refused (nothing changes) if a listed member staged a different
        number of publishes than listed: a publish lost on the way must fail
        the commit, not vanish; or if ``elsewhere(topic)`` says why one of
        its topics is not served here. A batch committed before is a
        duplicate, and anything staged into it since is discarded.
        """
        batch_key = (owner, batch_name)
        unfinished = self.unfinished.get(batch_key)
        if unfinished is not None:
            return self.refuse(unfinished.blocked or "the batch is being committed")
        if batch_key in self.finished:
            self._count(OutcomeStatus.DUPLICATE)
            return CommitDecision(OutcomeStatus.DUPLICATE, 0, COMMITTED_BEFORE)
        batch = self.batches.get(batch_key)
        staged = {} if batch is None else batch.members
        names = [member for member, _ in members]
        if len(set(names)) != len(names):
            return self.refuse("a member is listed twice")
        for member, count in members:
            have = len(staged.get(member, ()))
            if have != count:
                return self.refuse(
                    f"member {member!r} staged {have} publishes, the commit lists {count}"
                )
        publishes = [publish for member in names for publish in staged.get(member, ())]
        if elsewhere is not None:
            for topic in sorted({publish.topic for publish in publishes}):
                why = elsewhere(topic)
                if why is not None:
                    return self.refuse(why)
        if batch is not None:
            del self.batches[batch_key]
            self.size -= batch.size
            left_out = [m for m in staged if m not in set(names)]
            self._discard([p for m in left_out for p in staged[m]], "superseded")
        self._finish(batch_key)
        self.counters.committed_messages += len(publishes)
        if publishes:
            self.routing_members[batch_key] = list(members)
        if self.journal is not None:
            journal_keys = [] if batch is None else batch.journal_keys
            if publishes:
                # Remembered as committed only once routed (:meth:`routed`);
                # until then its members, to complete it after a stop.
                listed = [[member, count] for member, count in members]
                self.journal.put(SPACE_COMMITTING, batch_id(batch_key), listed)
                self._routing[batch_key] = journal_keys
            else:
                self._committed(batch_key, journal_keys)
        reason = ""
        if batch_key in self.interrupted:
            self.interrupted.discard(batch_key)
            reason = INTERRUPTED
        return CommitDecision(OutcomeStatus.COMMITTED, len(publishes), reason, publishes)

    def progress(
        self, batch_key: BatchKey, topic: str, index: int, count: int
    ) -> Callable[[int], None] | None:
        """For a commit being routed: what the topic calls with its log's
        next offset before it appends the batch's publishes to ``topic``
        from its ``index``-th (``count`` of them): it puts where they go in
        the journal and writes it (raising :class:`~broker.log.LogError`
        if it cannot: the publishes then wait). None without a journal."""
        journal = self.journal
        if journal is None:
            return None
        self._progress_topics.setdefault(batch_key, set()).add(topic)
        key = progress_id(batch_key, topic)

        def before_append(offset: int) -> None:
            journal.put(SPACE_PROGRESS, key, [index, offset, count])
            journal.write()

        return before_append

    def resume(self, batch_key: BatchKey) -> list[StagedPublish]:
        """Take up unfinished commit ``batch_key`` (the broker routes what
        its topics' logs do not hold yet, then calls :meth:`routed`): the
        batch is committed from now on; returns its publishes, in order."""
        unfinished = self.unfinished.pop(batch_key)
        self.routing_members[batch_key] = unfinished.members
        self.finished[batch_key] = None
        self._forget_oldest()
        self._routing[batch_key] = unfinished.journal_keys
        self._progress_topics[batch_key] = set(unfinished.progress)
        return unfinished.publishes

    def block(self, batch_key: BatchKey, reason: str) -> None:
        """Unfinished commit ``batch_key`` cannot be completed here: keep it
        (in the journal too, for a start that can), refusing its commit and
        abort with ``reason``."""
        self.unfinished[batch_key].blocked = reason

    def routed(self, batch_key: BatchKey) -> None:
        """The publishes of committed batch ``batch_key`` are routed (in the
        topic logs): put it in the journal as committed (its staged publishes
        there are deleted by :meth:`forget_routed`, once this is written).
        Without a journal, or for a batch not being routed, nothing happens.

        The broker calls this once ``route_commit`` returns, before the
        Outcome is sent, and then writes the journal (``journal.write()``)
        before sending it: an Outcome "committed" then means a rerun is
        answered "duplicate" after a kill -9. A commit cut off before this
        (a crash while routing) is in the journal as committing, with the
        progress of its publishes into each topic's log: the next start
        completes it (see the module).
        """
        if batch_key in self._routing:
            self._committed(batch_key, [])

    def forget_routed(self, batch_key: BatchKey) -> None:
        """After :meth:`routed` was written: delete the batch's staged
        publishes from the journal (apart: 200,000 deletes take about 0.3 s;
        a restart drops those of a committed batch left in the journal)."""
        self.routing_members.pop(batch_key, None)
        journal_keys = self._routing.pop(batch_key, None)
        if journal_keys is not None:
            self._delete_staged(journal_keys)

    def topics_of(self, batch_key: BatchKey, members: Iterable[str]) -> set[str]:
        """The topics of what ``members`` of ``batch_key`` staged here."""
        batch = self.batches.get(batch_key)
        staged = {} if batch is None else batch.members
        return {publish.topic for member in members for publish in staged.get(member, ())}

    def committed_elsewhere(self, batch_key: BatchKey) -> CommitDecision:
        """Cluster mode: the cluster's commit registry says ``batch_key``
        was committed (through another front end, or this one before its
        disk was replaced): it is remembered as committed here too, what it
        staged here is discarded (as late), and the commit is a duplicate."""
        batch = self.batches.pop(batch_key, None)
        if batch is not None:
            self.size -= batch.size
            self._discard([p for member in batch.members.values() for p in member], "late")
        self.finished[batch_key] = None
        self.finished.move_to_end(batch_key)
        self._forget_oldest()
        if self.journal is not None:
            self._committed(batch_key, [] if batch is None else batch.journal_keys)
        self._count(OutcomeStatus.DUPLICATE)
        return CommitDecision(OutcomeStatus.DUPLICATE, 0, COMMITTED_BEFORE)

    def abort(self, owner: str | None, batch_name: str) -> CommitDecision:
        """Discard everything staged in ``batch_name`` so far (refused if it
        was committed)."""
        batch_key = (owner, batch_name)
        if batch_key in self.finished:
            return self.refuse("the batch was committed")
        unfinished = self.unfinished.get(batch_key)
        if unfinished is not None:
            return self.refuse(unfinished.blocked or "the batch is being committed")
        batch = self.batches.pop(batch_key, None)
        discarded = 0
        if batch is not None:
            self.size -= batch.size
            publishes = [p for member in batch.members.values() for p in member]
            discarded = len(publishes)
            self._discard(publishes, "aborted")
            self._unjournal(batch)
        self._count(OutcomeStatus.ABORTED)
        return CommitDecision(OutcomeStatus.ABORTED, discarded)

    def expire(
        self, now: float, dropped: Callable[[BatchKey, set[str]], None] | None = None
    ) -> int:
        """Discard batches that staged nothing for ``ttl`` seconds; returns how
        many, and tells ``dropped`` of each (with its topics). (The ttl of a
        batch restored from the journal starts now.)"""
        for batch in self.batches.values():
            if batch.last_staged is None:
                batch.last_staged = now
        old = [
            key
            for key, batch in self.batches.items()
            if batch.last_staged is not None and now - batch.last_staged > self.ttl
        ]
        for key in old:
            batch = self.batches.pop(key)
            self.size -= batch.size
            publishes = [p for member in batch.members.values() for p in member]
            self._discard(publishes, "expired")
            self._unjournal(batch)
            if dropped is not None:
                dropped(key, {publish.topic for publish in publishes})
            log.warning(
                "staged batch %s of %s discarded: neither committed nor aborted within %s s",
                shown(key[1]),
                "anonymous clients" if key[0] is None else repr(key[0]),
                self.ttl,
            )
        return len(old)

    def clear(self) -> None:
        """Discard everything (the broker is stopping). What the journal holds
        stays there, for the next start."""
        for batch in self.batches.values():
            publishes = [p for member in batch.members.values() for p in member]
            if self.journal is None:
                self._discard(publishes, "expired")
            else:
                for publish in publishes:
                    publish.loan.repay()
        for unfinished in self.unfinished.values():
            for publish in unfinished.publishes:
                publish.loan.repay()
        self.batches.clear()
        self.unfinished.clear()
        self._routing.clear()
        self.routing_members.clear()
        self.size = self.pending = 0

    def refuse(self, reason: str) -> CommitDecision:
        """A Commit or Abort refused with ``reason`` (counted)."""
        self._count(OutcomeStatus.REFUSED)
        return CommitDecision(OutcomeStatus.REFUSED, 0, reason)

    def _count(self, status: OutcomeStatus) -> None:
        self.counters.outcomes[status.name.lower()] += 1

    def _finish(self, batch_key: BatchKey) -> None:
        self._count(OutcomeStatus.COMMITTED)
        self.finished[batch_key] = None
        self.finished.move_to_end(batch_key)
        self._forget_oldest()

    def _forget_oldest(self) -> None:
        """Forget the oldest committed batches beyond ``remember``, but not
        one still routing (forgotten, its retry would route it again)."""
        excess = max(len(self.finished) - self.remember, 0)
        settled = (key for key in self.finished if key not in self._routing)
        for batch_key in list(itertools.islice(settled, excess)):  # (oldest first)
            del self.finished[batch_key]
            if self.journal is not None:
                self.journal.delete(SPACE_COMMITTED, batch_id(batch_key))

    def _discard(self, publishes: list[StagedPublish], reason: str) -> None:
        for publish in publishes:
            publish.loan.repay()
        self.counters.discarded[reason] += len(publishes)

    # ---------------------------------------------------------------- journal

    def _committed(self, batch_key: BatchKey, journal_keys: list[str]) -> None:
        """Put ``batch_key`` in the journal as committed (if still remembered),
        then delete its staged publishes: in that order, so a torn write
        never loses the one while keeping the others."""
        assert self.journal is not None
        key = batch_id(batch_key)
        if batch_key in self.finished:
            self._serial += 1
            self.journal.put(SPACE_COMMITTED, key, self._serial)
        self._delete_staged(journal_keys)
        self.journal.delete(SPACE_COMMITTING, key)
        for topic in sorted(self._progress_topics.pop(batch_key, ())):
            self.journal.delete(SPACE_PROGRESS, progress_id(batch_key, topic))

    def _unjournal(self, batch: StagedBatch) -> None:
        """Delete an aborted or expired batch's publishes from the journal."""
        if self.journal is not None:
            self._delete_staged(batch.journal_keys)

    def _delete_staged(self, journal_keys: list[str]) -> None:
        """Delete staged publishes (their journal keys) from the journal."""
        assert self.journal is not None
        for journal_key in journal_keys:
            self.journal.delete(SPACE_STAGED, journal_key)

    def _restore(self, journal: StateJournal) -> None:
        """Load the committed batches, staged publishes and unfinished
        commits ``journal`` holds."""
        committed: list[tuple[int, BatchKey]] = []
        for batch_key_id, order in journal.items(SPACE_COMMITTED):
            batch_key = parse_batch_id(batch_key_id)
            if batch_key is None or not isinstance(order, int):
                log.warning("state journal: dropped a malformed committed batch %r", batch_key_id)
                journal.delete(SPACE_COMMITTED, batch_key_id)
                continue
            committed.append((order, batch_key))
            self._serial = max(self._serial, order)
        for _, batch_key in sorted(committed):
            self.finished[batch_key] = None
        self._forget_oldest()
        for journal_key, record in journal.items(SPACE_STAGED):
            restored = parse_staged(record)
            if restored is None:
                log.warning("state journal: dropped a malformed staged publish %s", journal_key)
                journal.delete(SPACE_STAGED, journal_key)
                continue
            origin = origin_of(record)
            if origin is not None:
                held = self._held_origins
                held[origin[:2]] = max(held.get(origin[:2], 0), origin[2])
            owner, batch_name, member, topic, key, tail, cost = restored
            batch_key = (owner, batch_name)
            if batch_key in self.finished:  # left over from a commit (or late)
                journal.delete(SPACE_STAGED, journal_key)
                continue
            batch = self.batches.get(batch_key)
            if batch is None:
                batch = self.batches[batch_key] = StagedBatch(None)
            publish = StagedPublish(topic, LoanedItem(self.account, cost, tail), key)
            batch.members.setdefault(member, []).append(publish)
            batch.journal_keys.append(journal_key)
            if origin is not None:
                place = origin[:2]
                batch.origins[place] = max(batch.origins.get(place, 0), origin[2])
            batch.size += cost
            self.size += cost
            if journal_key.isdigit():
                self._serial = max(self._serial, int(journal_key))
        for batch_key_id, value in journal.items(SPACE_COMMITTING):
            batch_key = parse_batch_id(batch_key_id)
            if batch_key is None or batch_key in self.finished:
                journal.delete(SPACE_COMMITTING, batch_key_id)  # (done: routed, remembered)
            elif not self._restore_commit(batch_key, value):
                journal.delete(SPACE_COMMITTING, batch_key_id)
        for progress_key, value in journal.items(SPACE_PROGRESS):
            parsed = parse_progress(progress_key, value)
            unfinished = None if parsed is None else self.unfinished.get(parsed[0])
            if parsed is None or unfinished is None:  # (its commit was done, or is lost)
                journal.delete(SPACE_PROGRESS, progress_key)
                continue
            unfinished.progress[parsed[1]] = parsed[2]
        if self.batches or self.finished or self.unfinished:
            log.info(
                "staging restored from the state journal: %d batches staged (%d bytes), "
                "%d committed batches remembered, %d commits to complete",
                len(self.batches),
                self.size,
                len(self.finished),
                len(self.unfinished),
            )

    def _restore_commit(self, batch_key: BatchKey, value: object) -> bool:
        """Restore the commit of ``batch_key`` that a stop cut off (its
        ``committing`` record's ``value``) as unfinished; False if it cannot
        be (then its batch, if any, is staged again)."""
        members = parse_members(value)
        batch = self.batches.get(batch_key)
        what = f"staged batch {shown(batch_key[1])} of " + (
            "anonymous clients" if batch_key[0] is None else repr(batch_key[0])
        )
        if members is None and batch is None:
            log.warning("state journal: dropped a malformed commit record of %s", what)
            return False
        if members is None:  # (an older broker's record: ``true``)
            self.interrupted.add(batch_key)
            log.warning(
                "%s was being committed when the broker stopped, and the journal does not "
                "say which members: it is staged again, and a retried commit routes all of "
                "it (what was routed before the stop is then routed twice)",
                what,
            )
            return False
        publishes: list[StagedPublish] = []
        for member, count in members:
            staged = [] if batch is None else batch.members.get(member, [])
            if len(staged) != count:  # (damage: the journal lost staged records)
                log.error(
                    "%s was being committed when the broker stopped, but member %s has "
                    "%d staged messages in the state journal, not %d: it cannot be "
                    "completed (a retried commit is refused)",
                    what,
                    shown(member),
                    len(staged),
                    count,
                )
                return False
            publishes += staged
        if batch is None:
            return False
        del self.batches[batch_key]
        self.size -= batch.size
        listed = {member for member, _ in members}
        self._discard(
            [p for m, ps in batch.members.items() if m not in listed for p in ps], "superseded"
        )
        unfinished = UnfinishedCommit(publishes, batch.journal_keys, members=members)
        self.unfinished[batch_key] = unfinished
        return True
