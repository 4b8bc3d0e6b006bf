"""Subscriptions that drop rather than slow their publishers: ``lossy`` and ``latest``.

- ``lossy``: a bounded queue; when it is full, the oldest delivery is dropped.
- ``latest``: at most one delivery per key waits (a newer one replaces it:
  the stock-ticker case); the queue is bounded the same way.

Their queued deliveries are charged to the subscription's own account, not
to the publishers' channels: a lossy subscriber can never slow a publisher,
and what it holds is bounded by its queue limits instead (its own, and the
broker's ``lossy_budget`` for all of one connection's such queues). Each delivery gets
its sequence number when it is queued; the subscriber learns what it missed
from a ``Gap(first_seq, count)`` sent just before the next delivery.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, cast

from accounts import Account, LoanedItem, unlimited
from broker.protocol import DeliveryMode
from broker.protocol.frames import encode_deliver

from ._topic import DELIVER_HEAD_ESTIMATE, PUMP_BATCH, Subscriber, Subscription, Topic

#: Default and largest ``max_queued`` (deliveries waiting per subscription).
DEFAULT_MAX_QUEUED = 1000
LIMIT_MAX_QUEUED = 1_000_000
#: Default ``max_queued_bytes``: what their loans amount to (each delivery's
#: bytes, its Deliver head and the accounts' per-event cost).
DEFAULT_MAX_QUEUED_BYTES = 1024 * 1024
LIMIT_MAX_QUEUED_BYTES = 1024 * 1024 * 1024


class DropCounts(Protocol):
    """Where a connection counts the deliveries its dropping queues dropped."""

    deliveries_overflowed: int
    deliveries_replaced: int


class DroppingSubscriber(Subscriber, Protocol):
    """A :class:`Subscriber` that also keeps the books of its dropping queues:
    what they hold together (bounded by ``lossy_budget``) and what they dropped."""

    #: What this connection's lossy and latest queues hold, in bytes.
    dropping_bytes: int

    @property
    def name(self) -> str:
        """The connection's name (for the queues' accounts)."""
        ...

    @property
    def counters(self) -> DropCounts: ...

    @property
    def lossy_budget(self) -> int:
        """The most its dropping queues hold together."""
        ...

    @property
    def root_account(self) -> Account:
        """The account the queues' own accounts roll up to (never blocks)."""
        ...


class OptionError(ValueError):
    """A Subscribe option the broker cannot accept (the client gets Goodbye 1)."""


@dataclass(frozen=True, slots=True)
class QueueLimits:
    """How much a dropping subscription keeps before it drops the oldest."""

    max_queued: int = DEFAULT_MAX_QUEUED
    max_queued_bytes: int = DEFAULT_MAX_QUEUED_BYTES

    @classmethod
    def from_options(cls, options: Mapping[str, object]) -> QueueLimits:
        """The limits a Subscribe's options ask for (unknown options are refused)."""
        unknown = set(options) - {"max_queued", "max_queued_bytes"}
        if unknown:
            raise OptionError(f"unknown subscribe option(s) {sorted(unknown)[:4]}")
        count = options.get("max_queued", DEFAULT_MAX_QUEUED)
        size = options.get("max_queued_bytes", DEFAULT_MAX_QUEUED_BYTES)
        if type(count) is not int or not 1 <= count <= LIMIT_MAX_QUEUED:
            raise OptionError(f"max_queued must be an integer in 1..{LIMIT_MAX_QUEUED}")
        if type(size) is not int or not 1024 <= size <= LIMIT_MAX_QUEUED_BYTES:
            raise OptionError(
                f"max_queued_bytes must be an integer in 1024..{LIMIT_MAX_QUEUED_BYTES}"
            )
        return cls(count, size)


class _Entry:
    """One queued delivery: its sequence number, its loan (None once dropped), its key."""

    __slots__ = ("key", "loan", "seq")

    def __init__(self, seq: int, loan: LoanedItem[bytes], key: bytes | None) -> None:
        self.seq = seq
        self.loan: LoanedItem[bytes] | None = loan
        self.key = key


class DroppingSubscription(Subscription):
    """A ``lossy`` or ``latest`` subscription (see the module documentation)."""

    __slots__ = (
        "_assigned",
        "_bytes",
        "_entries",
        "_live",
        "_newest",
        "account",
        "dropped_overflow",
        "dropped_replaced",
        "gaps_sent",
        "limits",
    )

    charges_publishers = False

    def __init__(
        self,
        connection: DroppingSubscriber,
        handle: int,
        topic: Topic,
        mode: str,
        limits: QueueLimits,
    ) -> None:
        super().__init__(connection, handle, topic, mode)
        self.connection: DroppingSubscriber = connection
        self.limits = limits
        #: Pays for this subscription's queue; rolls up to the broker's root
        #: account and never blocks anybody.
        self.account: Account = unlimited(
            f"{connection.name}/{mode}/{handle}", parent=connection.root_account, kind=mode
        )
        #: Deliveries dropped because the queue was full, and because a newer
        #: delivery with the same key replaced them (``latest``).
        self.dropped_overflow = 0
        self.dropped_replaced = 0
        #: Gap notices sent.
        self.gaps_sent = 0
        self._entries: deque[_Entry] = deque()
        self._newest: dict[bytes | None, _Entry] = {}
        self._assigned = self.next_seq  # the sequence number of the next queued delivery
        self._live = 0
        self._bytes = 0

    @property
    def queued(self) -> int:
        return self._live

    @property
    def unacked_deliveries(self) -> int:
        return 0  # nothing is kept once sent

    @property
    def dropped(self) -> int:
        """Deliveries dropped, for every reason."""
        return self.dropped_overflow + self.dropped_replaced

    def offer(self, account: Account, tails: list[bytes], keys: list[bytes | None]) -> None:
        """Queue ``tails`` on this subscription's own account (``account``, the
        publisher's, is not charged), send what the subscriber's guarantees
        allow, then drop what still exceeds the limits."""
        latest = self.mode == DeliveryMode.LATEST
        cost = DELIVER_HEAD_ESTIMATE
        connection = self.connection
        for tail, key in zip(tails, keys, strict=True):
            loan = LoanedItem(self.account, len(tail) + cost, tail)
            entry = _Entry(self._assigned, loan, key)
            self._assigned += 1
            if latest:
                older = self._newest.get(key)
                if older is not None:
                    self._drop(older)
                    self.dropped_replaced += 1
                    connection.counters.deliveries_replaced += 1
                self._newest[key] = entry
            self._entries.append(entry)
            self._live += 1
            self._bytes += loan.amount
            connection.dropping_bytes += loan.amount
        self.pump()
        self._enforce_limits()
        if len(self._entries) > 2 * self._live + PUMP_BATCH:
            # Entries replaced (latest) wait in the deque until they reach its
            # head; compact it so that they cannot pile up behind a stalled one.
            self._entries = deque(entry for entry in self._entries if entry.loan is not None)

    def _enforce_limits(self) -> None:
        """Drop this queue's oldest deliveries beyond its own limits, then the
        largest of the connection's dropping queues' oldest while all of them
        together exceed ``lossy_budget``."""
        limits = self.limits
        while self._live > limits.max_queued or self._bytes > limits.max_queued_bytes:
            self._drop_oldest()
        connection = self.connection
        budget = connection.lossy_budget
        while connection.dropping_bytes > budget:
            largest = max(
                (
                    s
                    for s in connection.subscriptions.values()
                    if isinstance(s, DroppingSubscription)
                ),
                key=lambda s: s._bytes,
                default=self,
            )
            if not largest._live:
                break
            largest._drop_oldest()

    def _drop_oldest(self) -> None:
        entries = self._entries
        while entries:
            oldest = entries.popleft()
            if oldest.loan is not None:
                self._drop(oldest)
                self.dropped_overflow += 1
                self.connection.counters.deliveries_overflowed += 1
                return

    def _drop(self, entry: _Entry) -> None:
        loan = entry.loan
        self._forget(entry)
        assert loan is not None
        loan.repay()

    def _forget(self, entry: _Entry) -> None:
        """``entry`` leaves the queue (sent or dropped)."""
        loan = entry.loan
        assert loan is not None
        entry.loan = None
        self._live -= 1
        self._bytes -= loan.amount
        self.connection.dropping_bytes -= loan.amount
        if self._newest.get(entry.key) is entry:
            del self._newest[entry.key]

    def pump(self) -> None:
        """Send queued deliveries while the subscriber's guarantees allow,
        each run of consecutive sequence numbers after a Gap for what was
        dropped before it.

        A Gap is sent only with a delivery that the subscriber has room for,
        or, for drops at the very end of the queue, once the queue is empty
        and the subscriber has room again: a subscriber that stopped reading
        is not sent an ever longer series of Gaps. (A lossy subscription
        never marks itself stalled: its queue charges no account of its
        connection, so the connection's reader may pause as usual.)
        """
        entries = self._entries
        connection = self.connection
        while True:
            while entries and entries[0].loan is None:
                entries.popleft()
            if not entries:
                if self._assigned != self.next_seq and connection.has_room(self, 1):
                    self._send_gap(self._assigned)
                return
            head = entries[0]
            assert head.loan is not None
            if head.seq != self.next_seq:
                frame, tail = encode_deliver(self.handle, head.seq, head.loan.item)
                if not connection.has_room(self, len(frame) + len(tail)):
                    return
                if not self._send_gap(head.seq):
                    return
            first = head.seq
            run: list[_Entry] = []
            loans: list[LoanedItem[bytes]] = []
            for entry in entries:
                if entry.loan is None or entry.seq != first + len(run) or len(run) == PUMP_BATCH:
                    break
                run.append(entry)
                loans.append(entry.loan)
            taken = connection.deliver(self, loans)
            for entry in run[:taken]:
                entries.popleft()
                self._forget(entry)  # the writer holds (and repays) its loan now
            if taken < len(run):
                return

    def _send_gap(self, upto: int) -> bool:
        """Report the sequence numbers from ``next_seq`` up to ``upto`` as dropped."""
        if not self.connection.gap(self, self.next_seq, upto - self.next_seq):
            return False  # the connection is closing or the subscription going
        self.gaps_sent += 1
        self.next_seq = upto
        return True

    def attach(self, connection: Subscriber, processed: int) -> int:
        """A resumed connection takes over. Deliveries sent after ``processed``
        were lost with the old connection: they are reported as a Gap (a
        dropping subscription keeps nothing once sent). Returns 0 (nothing
        is sent again)."""
        dropping = cast(DroppingSubscriber, connection)  # (a broker's always is)
        self.connection.dropping_bytes -= self._bytes
        dropping.dropping_bytes += self._bytes
        self.connection = dropping
        lost_from = max(processed + 1, self.acked + 1)
        if lost_from < self.next_seq:
            connection.gap(self, lost_from, self.next_seq - lost_from)
            self.gaps_sent += 1
        self.acked = self.next_seq - 1
        self.pump()
        return 0

    def ack(self, seq: int) -> None:
        """Acknowledgements only matter to reliable subscriptions."""

    def close(self) -> None:
        """Leave the topic and repay every queued delivery."""
        self.topic.unsubscribe(self)
        for entry in self._entries:
            if entry.loan is not None:
                entry.loan.repay()
                entry.loan = None
        self._entries.clear()
        self._newest.clear()
        self.connection.dropping_bytes -= self._bytes
        self._live = self._bytes = 0
        self.account.close()
