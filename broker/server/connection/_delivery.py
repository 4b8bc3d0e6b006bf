"""The sending side of a connection's subscriptions: what a subscription
queues its Delivers and Gaps through (a :class:`~._topic.Subscriber`)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, cast

import trio

from accounts import Account, LoanedItem
from broker.groups import GroupError, Outcome
from broker.protocol import Channel, ChannelKind, Connection, HandleType, LocalProtocolError
from broker.protocol.connection import MIN_PART

from ..topics._topic import GroupMember, Subscription
from ..transport._wake import Wake


@dataclass(slots=True)
class ConnectionCounters:
    messages_in: int = 0
    bytes_in: int = 0
    messages_out: int = 0
    bytes_out: int = 0
    reader_pauses: int = 0
    #: Deliveries dropped from lossy/latest queues: overflow, and replaced by a newer one.
    deliveries_overflowed: int = 0
    deliveries_replaced: int = 0


class Deliveries:
    """One connection's subscriptions and what they send (a ``DroppingSubscriber``).

    Delivers are queued on the protocol only within the subscriber's
    guarantees; the loans of those that keep nothing once sent wait in
    :attr:`inflight` until the writer has written them. A subscription that
    waits for this client's guarantees or Acks is noted in :attr:`stalled`,
    and cancels :attr:`funds_scope` (the reader's wait for the connection's
    account): only this client's reading can clear that debt.
    """

    __slots__ = (
        "_wake",
        "acked_dirty",
        "counters",
        "dropping_bytes",
        "funds_scope",
        "inflight",
        "lossy_budget",
        "name",
        "protocol",
        "root_account",
        "stalled",
        "subscriptions",
    )

    def __init__(
        self,
        name: str,
        protocol: Connection,
        counters: ConnectionCounters,
        wake: Wake,
        *,
        lossy_budget: int,
        root_account: Account,
    ) -> None:
        self.name = name
        self.protocol = protocol
        self.counters = counters
        self._wake = wake
        #: The session's subscriptions (the session's own dict once welcomed).
        self.subscriptions: dict[int, Subscription] = {}
        #: What this connection's lossy and latest queues hold.
        self.dropping_bytes = 0
        self.lossy_budget = lossy_budget
        self.root_account = root_account
        #: Loans of Delivers queued and not written yet (the writer repays them).
        self.inflight: list[LoanedItem[Any]] = []
        #: Subscriptions waiting for this client (see the class).
        self.stalled: set[int] = set()
        #: The reader's wait for the connection's account, while it waits.
        self.funds_scope: trio.CancelScope | None = None
        #: Log subscriptions acknowledged since their session's record was written.
        self.acked_dirty: set[int] = set()

    @property
    def open(self) -> bool:
        return not self.protocol.closed

    def send_deliveries(self, subscription: Subscription, tails: list[bytes]) -> int | None:
        """Queue Delivers of ``tails`` (see ``encode_deliver_tail``), in order
        from the subscription's next sequence number, as far as the
        subscriber's guarantees allow; returns how many were taken, or None
        if the subscription can take nothing more (it is being freed)."""
        protocol = self.protocol
        if protocol.closed:
            return 0  # they wait in the subscription: for a resume, or to be repaid
        queued = protocol.bytes_to_send
        try:
            count = protocol.deliver_encoded_many(subscription.handle, subscription.next_seq, tails)
        except LocalProtocolError:
            # The client is freeing the subscription (the event saying so may
            # still be on its way to us).
            return None
        return self._sent(subscription, count, queued)

    def _sent(self, subscription: Subscription, count: int, queued: int) -> int:
        """``count`` deliveries of ``subscription`` were queued: count them
        (with none, the parts of a large one may have been: ``queued`` was
        the output before)."""
        if count:
            subscription.next_seq += count
            subscription.delivered += count
            self.counters.messages_out += count
            self._wake.set()
        elif self.protocol.bytes_to_send != queued:
            self._wake.set()
        return count

    def send_timed(
        self, subscription: Subscription, tails: list[bytes], times: list[int]
    ) -> int | None:
        """:meth:`send_deliveries` with each record's receive time
        (``times[i]`` for ``tails[i]``), as DeliverTimed frames (for a log
        subscription that asked for ``"timestamps"``)."""
        protocol = self.protocol
        if protocol.closed:
            return 0
        queued = protocol.bytes_to_send
        try:
            count = protocol.deliver_timed(subscription.handle, subscription.next_seq, tails, times)
        except LocalProtocolError:
            return None  # the client is freeing the subscription
        return self._sent(subscription, count, queued)

    def send_group(
        self,
        subscription: Subscription,
        first_seq: int,
        tails: list[bytes],
        offsets: list[int],
        delivered: list[int],
    ) -> int | None:
        """Queue DeliverGroup frames of a group member's deliveries numbered
        from ``first_seq`` (each with its record's offset and how many times
        it was delivered before), as far as the guarantees allow; returns
        how many were taken, or None if the subscription is being freed."""
        protocol = self.protocol
        if protocol.closed:
            return 0
        queued = protocol.bytes_to_send
        try:
            count = protocol.deliver_group(
                subscription.handle, first_seq, tails, offsets, delivered
            )
        except LocalProtocolError:
            return None  # the client is freeing the subscription
        if count:
            self.counters.messages_out += count
            self._wake.set()
        elif protocol.bytes_to_send != queued:
            self._wake.set()
        return count

    def send_matched(
        self, subscription: Subscription, tails: list[bytes], match: int, first: int
    ) -> int | None:
        """Queue DeliverMatched frames of a pattern subscription: records
        ``first`` on of the topic matched as ``match``, numbered from the
        subscription's ``next_seq``, as far as the guarantees allow; how
        many were taken, or None if the subscription is being freed."""
        protocol = self.protocol
        if protocol.closed:
            return 0
        queued = protocol.bytes_to_send
        try:
            count = protocol.deliver_matched(
                subscription.handle, subscription.next_seq, tails, match, first
            )
        except LocalProtocolError:
            return None  # the client is freeing the subscription
        return self._sent(subscription, count, queued)

    def matched(self, subscription: Subscription, match: int, topic: str | None) -> bool:
        """Say which topic a pattern subscription's match index is (None:
        that topic was deleted); False if nothing more can be said on it."""
        if self.protocol.closed:
            return False
        try:
            self.protocol.matched(subscription.handle, match, topic)
        except LocalProtocolError:
            return False  # the client is freeing the subscription
        self._wake.set()
        return True

    def matched_gap(self, subscription: Subscription, match: int, first: int, count: int) -> bool:
        """A pattern subscription's Gap: ``count`` records of match ``match``
        from ``first`` were dropped; False if nothing more can be said."""
        if self.protocol.closed:
            return False
        try:
            self.protocol.matched_gap(subscription.handle, match, first, count)
        except LocalProtocolError:
            return False
        self._wake.set()
        return True

    def settle(
        self, handle: int, ranges: list[tuple[int, int]], outcome: int, detail: int | str | None
    ) -> str | None:
        """The client settles deliveries of subscription ``handle``; why that
        is a protocol error (None: it is not)."""
        subscription = self.subscriptions.get(handle)
        if subscription is None:
            return None  # (being freed: the Settle crossed the FreeHandle)
        if not subscription.group_member:
            return f"Settle on subscription {handle}: it is not a consumer group's member"
        try:
            cast(GroupMember, subscription).settle(ranges, Outcome(outcome), detail)
        except GroupError as error:
            return f"Settle on subscription {handle}: {error}"
        return None

    def deliver(self, subscription: Subscription, loans: list[LoanedItem[bytes]]) -> int:
        """:meth:`send_deliveries` for a subscription that keeps nothing once
        sent: the loans taken are repaid once written to the socket, the
        others stay with the caller; returns how many were taken."""
        count = self.send_deliveries(subscription, [loan.item for loan in loans])
        if count is None:
            for loan in loans:
                loan.repay()
            return len(loans)
        if count:
            self.inflight.extend(loans if count == len(loans) else loans[:count])
        return count

    def written_later(self, loan: LoanedItem[Any]) -> None:
        """Repay ``loan`` once the Delivers queued now are written (log reads)."""
        self.inflight.append(loan)

    def has_room(self, subscription: Subscription, size: int) -> bool:
        """Whether the subscriber's guarantees cover a frame of ``size`` bytes now."""
        room = self.room(subscription)
        if size > self.protocol.peer_max_frame:
            size = MIN_PART  # (it goes in parts, or as a Gap to a client that takes none)
        return room > 0 and room >= size

    def room(self, subscription: Subscription) -> int:
        """The bytes of deliveries the subscriber's guarantees let go now (0: none)."""
        if self.protocol.closed:
            return 0
        try:
            return self.protocol.room(Channel(ChannelKind.DELIVER, subscription.handle))
        except LocalProtocolError:
            return 0  # the subscription is being freed

    def gap(self, subscription: Subscription, first_seq: int, count: int) -> bool:
        """Tell the client that ``count`` deliveries from ``first_seq`` were
        dropped; False if nothing more can be said on the subscription."""
        if self.protocol.closed:
            return False
        try:
            self.protocol.gap(subscription.handle, first_seq, count)
        except LocalProtocolError:
            return False  # the client is freeing the subscription
        self._wake.set()
        return True

    def subscription_stalled(self, subscription: Subscription) -> None:
        """A subscription of ours waits for our client's guarantees.

        Those guarantees come in on our socket, so the reader must not stop
        on debt that only this client's reading can clear.
        """
        self.stalled.add(subscription.handle)
        if self.funds_scope is not None:
            self.funds_scope.cancel()

    def refresh_stalled(self) -> bool:
        """Forget stalled subscriptions that wait no more; whether any still does."""
        if self.stalled:
            subscriptions = self.subscriptions
            self.stalled = {
                handle
                for handle in self.stalled
                if (sub := subscriptions.get(handle)) is not None and (sub.queued or sub.unacked)
            }
        return bool(self.stalled)

    def pump(self, handle: int) -> None:
        """The client issued guarantees on subscription ``handle``: send on."""
        subscription = self.subscriptions.get(handle)
        if subscription is not None:
            subscription.pump()

    def ack(self, handle: int, seq: int) -> None:
        """The client processed subscription ``handle`` up to ``seq``."""
        acked = self.subscriptions.get(handle)
        if acked is not None:
            acked.ack(seq)
            if acked.restorable:  # (only an offset is worth recording)
                self.acked_dirty.add(handle)

    def end(self, handle: int) -> None:
        """The broker ends subscription ``handle`` (its topic was deleted): a
        FreeHandle tells a connected client (its iteration ends once it has
        taken what it received), and the subscription is closed now."""
        if not self.protocol.closed:
            with contextlib.suppress(LocalProtocolError):  # (the client frees it already)
                self.protocol.free_handle(HandleType.SUBSCRIPTION, handle)
            self._wake.set()
        self.drop(handle)

    def drop(self, handle: int) -> None:
        """Subscription ``handle`` is gone: it leaves its topic, repaid."""
        subscription = self.subscriptions.pop(handle, None)
        if subscription is not None:
            subscription.close()
        self.stalled.discard(handle)
        self.acked_dirty.discard(handle)

    def close_all(self) -> None:
        """The connection is done: close what subscriptions are left (none
        if the session went on) and repay the Delivers never written."""
        for subscription in list(self.subscriptions.values()):
            subscription.close()
        self.subscriptions.clear()
        for loan in self.inflight:
            loan.repay()
        self.inflight = []
