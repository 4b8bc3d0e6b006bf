"""A consumer group's member on a worker that does not own the topic.

The group lives at the topic's owner; a member that subscribes at another
worker becomes a member there over the link (:class:`ForwardedGroupMember`):
the owner's ``DeliverGroup`` entries are relayed to the client with their
offsets and delivery counts, the client's ``Settle`` frames and ``Ack``
are passed back. Its delivery numbers are the owner member's, shifted by
:attr:`ForwardedGroupMember.shift` once the link has been made again (the
owner's member of a broken link is gone, and what it held went back to the
group: a settle of a delivery of that time changes nothing, as a late
settle at the owner does).

What waits to be sent to the client, and what was sent and not taken
(``Ack``), is kept here, charged to the member's own account with the
channel watermarks; the link issues guarantees to the owner only while
that account is not blocked.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any, Protocol

from accounts import Account, LoanedItem
from broker.groups import GroupError, Outcome
from broker.protocol import Options

from ..topics._log_subscription import CURSOR_PRINCIPAL
from ..topics._topic import DELIVER_HEAD_ESTIMATE, Subscriber, Subscription
from ._forward import ForwardTopic, SubscriptionLink, end_here

__all__ = ["ForwardedGroupMember", "GroupLink"]


class GroupLink(SubscriptionLink, Protocol):
    """What a forwarded member needs of the link besides a subscription's."""

    def settle(
        self,
        subscription: ForwardedGroupMember,
        ranges: list[tuple[int, int]],
        outcome: Outcome,
        detail: int | str | None,
    ) -> None:
        """Pass a Settle of the owner's deliveries on."""
        ...

    def subscription_account(self, name: str) -> Account:
        """A new account with the channel watermarks."""
        ...


class _Entry:
    __slots__ = ("delivered", "loan", "offset", "seq", "tail")

    def __init__(self, seq: int, tail: bytes, offset: int, delivered: int, loan: LoanedItem[None]):
        self.seq = seq
        self.tail = tail
        self.offset = offset
        self.delivered = delivered
        self.loan = loan


class ForwardedGroupMember(Subscription):
    """A group member whose group lives at another worker (see the module)."""

    __slots__ = (
        "account",
        "epoch_first",
        "link",
        "options",
        "owner_acked",
        "owner_handle",
        "paused",
        "restored",
        "sent",
        "shift",
        "waiting",
    )

    group_member = True

    charges_publishers = False
    #: Its session's record keeps it: after a restart of this worker it is
    #: made at the owner again once its client resumes (see :meth:`attach`).
    restorable = True

    def __init__(
        self,
        connection: Subscriber,
        handle: int,
        topic: ForwardTopic,
        options: Mapping[str, object],
        principal: str | None,
        *,
        restored: int | None = None,
    ) -> None:
        super().__init__(connection, handle, topic, "reliable")
        link = topic.link
        self.link: GroupLink = link  # type: ignore[assignment]  # (a Link is one)
        self.options: Options = dict(options)  # type: ignore[arg-type]
        if principal is not None:
            self.options[CURSOR_PRINCIPAL] = principal  # (the group is the client's principal's)
        self.account = link.subscription_account(f"forward/{handle}/{topic.topic_name[:64]}")
        self.owner_handle: int | None = None
        #: Local delivery number minus the owner member's, on this link connection.
        self.shift = 0
        #: The first local number of this link connection's owner member:
        #: settles below it are of a member that is gone.
        self.epoch_first = 1
        self.owner_acked = 0
        #: Deliveries relayed and not sent to the client yet; sent and not taken.
        self.waiting: deque[_Entry] = deque()
        self.sent: deque[_Entry] = deque()
        self.paused = False
        #: Restored after a restart: the last delivery its client processed,
        #: as its session's record has it; made at the owner only once the
        #: client resumes (None: made at once).
        self.restored = restored
        if restored is None:
            link.subscribe(self)

    @property
    def queued(self) -> int:
        return len(self.waiting)

    @property
    def unacked_deliveries(self) -> int:
        return len(self.sent)

    # ---------------------------------------------------------------- from the owner

    def resubscribe_options(self, *, offsets: bool) -> Options:
        return dict(self.options)

    def relay(self, first_seq: int, tails: list[bytes]) -> None:
        """(A member is sent DeliverGroup frames only: see :meth:`relay_group`.)"""

    def relay_group(
        self, first_seq: int, tails: list[bytes], offsets: list[int], delivered: list[int]
    ) -> None:
        """The owner delivered these to its member: queue them for the client."""
        local = first_seq + self.shift
        for index, tail in enumerate(tails):
            cost = len(tail) + DELIVER_HEAD_ESTIMATE
            loan: LoanedItem[None] = LoanedItem(self.account, cost, None)
            self.waiting.append(_Entry(local + index, tail, offsets[index], delivered[index], loan))
        self.next_seq = max(self.next_seq, local + len(tails))
        self.pump()

    def relay_gap(self, first_seq: int, count: int) -> None:
        """The owner's member no longer holds these: the client is told."""
        self.connection.gap(self, first_seq + self.shift, count)

    def owner_ended(self) -> None:
        """The owner ended it: its topic was deleted there."""
        end_here(self)

    def link_broken(self, *, offsets: bool) -> None:
        """The owner's member is gone, and what it held went back to the
        group: nothing of it is sent any more; the next member there is
        numbered on after the last number used here."""
        self.owner_handle = None
        self.owner_acked = 0
        for entry in self.waiting:
            entry.loan.repay()
        self.waiting.clear()
        for entry in self.sent:
            entry.loan.repay()
        self.sent.clear()
        self.epoch_first = self.next_seq
        self.shift = self.next_seq - 1
        self._resume_owner()

    def may_receive(self) -> bool:
        if self.account.blocked:
            self.paused = True
            return False
        return True

    def _resume_owner(self) -> None:
        if self.paused and not self.account.blocked:
            self.paused = False
            self.link.resume_deliveries(self)

    # ---------------------------------------------------------------- to the client

    def pump(self) -> None:
        """Send what waits, in runs of consecutive numbers, within the
        client's guarantees."""
        waiting = self.waiting
        connection: Any = self.connection
        while waiting:
            run = [waiting[0]]
            while len(run) < len(waiting) and waiting[len(run)].seq == run[-1].seq + 1:
                run.append(waiting[len(run)])
            taken = connection.send_group(
                self,
                run[0].seq,
                [e.tail for e in run],
                [e.offset for e in run],
                [e.delivered for e in run],
            )
            if taken is None:  # being freed
                for entry in waiting:
                    entry.loan.repay()
                waiting.clear()
                break
            for _ in range(taken):
                self.sent.append(waiting.popleft())
            if taken < len(run):
                break
        if waiting or self.sent:
            connection.subscription_stalled(self)
        self._resume_owner()

    def ack(self, seq: int) -> None:
        """The client took everything up to ``seq``: let go of it here, and
        tell the owner (for its own resume)."""
        sent = self.sent
        while sent and sent[0].seq <= seq:
            sent.popleft().loan.repay()
        self.acked = max(self.acked, seq)
        owner_seq = min(seq, self.next_seq - 1) - self.shift
        if self.owner_handle is not None and owner_seq > self.owner_acked:
            self.owner_acked = owner_seq
            self.link.ack(self, owner_seq)
        self._resume_owner()

    def settle(
        self, ranges: list[tuple[int, int]], outcome: Outcome, detail: int | str | None
    ) -> None:
        """Pass the client's settles of this link connection's deliveries on
        (those of an earlier one change nothing: see the module)."""
        owner: list[tuple[int, int]] = []
        for first, count in ranges:
            if first + count - 1 >= self.next_seq:
                raise GroupError(
                    f"Settle names deliveries {first} to {first + count - 1}: "
                    f"only 1 to {self.next_seq - 1} were sent on this subscription"
                )
            start = max(first, self.epoch_first)
            if start < first + count:
                owner.append((start - self.shift, first + count - start))
        if owner and self.owner_handle is not None:
            self.link.settle(self, owner, outcome, detail)

    def recorded_options(self, given: Mapping[str, object]) -> Mapping[str, object]:
        """Its Subscribe's options (the principal is the session's)."""
        return given

    def attach(self, connection: Subscriber, processed: int) -> int:
        """The client resumed: what was sent and not taken goes again first.
        Restored after a restart, it is made at the owner now, numbering
        on after what the client processed (what it held before went back
        to the group with the old member)."""
        self.connection = connection
        if self.restored is not None:
            processed = max(processed, self.restored)
            self.restored = None
            self.acked = processed
            self.next_seq = self.epoch_first = processed + 1
            self.shift = processed
            self.link.subscribe(self)
            return 0
        self.ack(processed)
        again = len(self.sent)
        self.waiting.extendleft(reversed(self.sent))
        self.sent.clear()
        self.pump()
        return again

    def close(self) -> None:
        """Leave: the owner's member leaves too (what it held goes back)."""
        self.topic.unsubscribe(self)
        self.link.unsubscribe(self)
        for entry in (*self.waiting, *self.sent):
            entry.loan.repay()
        self.waiting.clear()
        self.sent.clear()
        self.account.close()
