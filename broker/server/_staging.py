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
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass, field

from accounts import Account, LoanedItem, unlimited
from broker.protocol import OutcomeStatus, Stage

from ._peerlog import shown

log = logging.getLogger("broker.server")

#: What a staged publish holds besides its Deliver tail's bytes (its records
#: and its loan; measured with tracemalloc on CPython 3.11: about 168 bytes),
#: so that ``staging_limit`` bounds the memory really used.
STAGED_PUBLISH_OVERHEAD = 176

#: ``(principal, batch)``: batches of different principals never mix.
BatchKey = tuple[str | None, str]


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

    #: When the batch last staged a publish (its ttl counts from then).
    last_staged: float
    members: dict[str, list[StagedPublish]] = field(default_factory=dict)
    size: int = 0

    @property
    def messages(self) -> int:
        return sum(len(publishes) for publishes in self.members.values())


@dataclass(slots=True)
class CommitDecision:
    """What a Commit comes to: the Outcome to send, and the publishes to route
    (in order: listed members in the order listed) when it is ``COMMITTED``."""

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

    def __init__(self, parent: Account, *, limit: int, ttl: float, remember: int) -> None:
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
    ) -> str | None:
        """Stage one publish (``tail``: its encoded Deliver tail; ``cost``: the
        bytes it holds). Returns why it cannot be staged, or None.

        A publish into a batch already committed is accepted and dropped at
        once (a late attempt of a finished batch: its data must never become
        visible).
        """
        batch_key = (owner, stage.batch)
        if batch_key in self.finished:
            self.counters.discarded["late"] += 1
            return None
        if self.size + cost > self.limit:
            return (
                f"the staging area is full ({self.size} of {self.limit} bytes): "
                "commit or abort staged batches, or raise staging_limit"
            )
        batch = self.batches.get(batch_key)
        if batch is None:
            batch = self.batches[batch_key] = StagedBatch(now)
        batch.last_staged = now
        publish = StagedPublish(topic, LoanedItem(self.account, cost, tail), key)
        batch.members.setdefault(stage.member, []).append(publish)
        batch.size += cost
        self.size += cost
        return None

    def commit(
        self, owner: str | None, batch_name: str, members: list[tuple[str, int]]
    ) -> CommitDecision:
        """Decide a Commit of ``batch_name`` listing ``members`` with their counts.

        Refused (nothing changes) if a listed member staged a different
        number of publishes than listed: a publish lost on the way must fail
        the commit, not vanish. A batch committed before is a duplicate, and
        anything staged into it since is discarded.
        """
        batch_key = (owner, batch_name)
        if batch_key in self.finished:
            self._count(OutcomeStatus.DUPLICATE)
            return CommitDecision(OutcomeStatus.DUPLICATE, 0, "the batch was committed before")
        batch = self.batches.get(batch_key)
        staged = {} if batch is None else batch.members
        names = [member for member, _ in members]
        if len(set(names)) != len(names):
            return self._refuse("a member is listed twice")
        for member, count in members:
            have = len(staged.get(member, ()))
            if have != count:
                return self._refuse(
                    f"member {member!r} staged {have} publishes, the commit lists {count}"
                )
        publishes = [publish for member in names for publish in staged.get(member, ())]
        if batch is not None:
            del self.batches[batch_key]
            self.size -= batch.size
            left_out = [m for m in staged if m not in set(names)]
            self._discard([p for m in left_out for p in staged[m]], "superseded")
        self._finish(batch_key)
        self.counters.committed_messages += len(publishes)
        return CommitDecision(OutcomeStatus.COMMITTED, len(publishes), "", publishes)

    def abort(self, owner: str | None, batch_name: str) -> CommitDecision:
        """Discard everything staged in ``batch_name`` so far (refused if it
        was committed)."""
        batch_key = (owner, batch_name)
        if batch_key in self.finished:
            return self._refuse("the batch was committed")
        batch = self.batches.pop(batch_key, None)
        discarded = 0
        if batch is not None:
            self.size -= batch.size
            publishes = [p for member in batch.members.values() for p in member]
            discarded = len(publishes)
            self._discard(publishes, "aborted")
        self._count(OutcomeStatus.ABORTED)
        return CommitDecision(OutcomeStatus.ABORTED, discarded)

    def expire(self, now: float) -> int:
        """Discard batches that staged nothing for ``ttl`` seconds; returns how many."""
        old = [key for key, batch in self.batches.items() if now - batch.last_staged > self.ttl]
        for key in old:
            batch = self.batches.pop(key)
            self.size -= batch.size
            self._discard([p for member in batch.members.values() for p in member], "expired")
            log.warning(
                "staged batch %s of %s discarded: neither committed nor aborted within %s s",
                shown(key[1]),
                "anonymous clients" if key[0] is None else repr(key[0]),
                self.ttl,
            )
        return len(old)

    def clear(self) -> None:
        """Discard everything (the broker is stopping)."""
        for batch in self.batches.values():
            self._discard([p for member in batch.members.values() for p in member], "expired")
        self.batches.clear()
        self.size = 0

    def _refuse(self, reason: str) -> CommitDecision:
        self._count(OutcomeStatus.REFUSED)
        return CommitDecision(OutcomeStatus.REFUSED, 0, reason)

    def _count(self, status: OutcomeStatus) -> None:
        self.counters.outcomes[status.name.lower()] += 1

    def _finish(self, batch_key: BatchKey) -> None:
        self._count(OutcomeStatus.COMMITTED)
        self.finished[batch_key] = None
        self.finished.move_to_end(batch_key)
        while len(self.finished) > self.remember:
            self.finished.popitem(last=False)

    def _discard(self, publishes: list[StagedPublish], reason: str) -> None:
        for publish in publishes:
            publish.loan.repay()
        self.counters.discarded[reason] += len(publishes)
