"""The guarantee protocol for one logical channel, receiver and sender side.

Both sides keep only cumulative counters (bytes issued, accepted, absolved,
sent, refunded, ...) and derive every balance from them, the way QUIC derives
flow-control credit from offsets: no two balances can drift apart.

Receiver, with ``balance = issued - accepted - absolved`` (the sender's
remaining guarantees as the receiver computes them, negative after accepted
optimistic frames)::

    capacity = grown - shrunk          buffered = accepted - released
    free     = capacity - buffered     issuable = free - balance  (>= 0 always)

Sender, with ``covered = received - absolved + refunded`` (the position in its
sent byte stream up to which frames are known to be buffered)::

    balance = covered - sent

A frame whose end position lies beyond ``covered`` is *unconfirmed*; when an
``AnnounceDropping`` arrives, exactly the unconfirmed frames were dropped.

Limits (both decided here, see docs/protocol.md):

- ``LimitSending(bound)`` counts every byte of every frame the sender puts on
  the channel after it (dropped frames and retransmissions included) plus
  every ``Absolve``. Both ends see the same frames in the same order, so they
  agree exactly. A new bound must be below the remaining one: an equal or
  looser one is an error (both ends know the remaining bound exactly).
- ``LimitReceiving(bound)`` counts guarantee bytes the receiver issues after
  it. Outstanding guarantees stay valid; beyond them the receiver accepts an
  optimistic frame only if it could still confirm it within the bound. Both
  ends count the same ``IssueGuarantee`` messages, so they agree exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

from .._errors import LocalProtocolError, RemoteProtocolError
from .._types import Channel, GoodbyeCode
from ..frames._messages import (
    AnnounceDropping,
    IssueGuarantee,
    LimitReceiving,
    Plead,
)
from ._bounds import check_amount, tightened
from ._sender import ChannelSender, SenderStatistics, SentFrame

__all__ = [
    "ChannelReceiver",
    "ChannelSender",
    "ReceiverStatistics",
    "SenderStatistics",
    "SentFrame",
]


@dataclass(slots=True, frozen=True)
class ReceiverStatistics:
    """A snapshot of one receiving channel."""

    channel: Channel
    capacity: int
    buffered: int
    issuable: int
    sender_balance: int
    dropping: bool
    accepted_frames: int
    accepted_bytes: int
    dropped_frames: int
    dropped_bytes: int
    issued_bytes: int
    absolved_bytes: int
    sending_limit: int | None
    receiving_limit: int | None


class ChannelReceiver:
    """Receiving side of one channel: buffer accounting, issuing, dropping."""

    __slots__ = (
        "_absolved",
        "_accepted",
        "_grown",
        "_issued",
        "_released",
        "_shrunk",
        "accepted_frames",
        "channel",
        "dropped_bytes",
        "dropped_frames",
        "dropping",
        "dropping_bytes",
        "largest_frame",
        "max_dropping",
        "receiving_limit",
        "sending_limit",
        "target_capacity",
    )

    def __init__(self, channel: Channel, capacity: int = 0) -> None:
        check_amount(capacity, "capacity")
        self.channel = channel
        self._grown = capacity
        self._shrunk = 0
        self._accepted = 0
        self._released = 0
        self._issued = 0
        self._absolved = 0
        self.accepted_frames = 0
        self.dropped_frames = 0
        self.dropped_bytes = 0
        #: True from a drop until the sender's Apologise.
        self.dropping = False
        #: The largest frame (with its length prefix) the sender may send on
        #: the channel, if known: a sender holding guarantees for that much
        #: can always send its next frame (see ``Policy.amount_to_issue``).
        self.largest_frame: int | None = None
        #: Bytes dropped since the first drop (reset by the Apologise), and
        #: how many the sender may send so before it ends the connection
        #: (code 3; None: no bound): a sender that heeds ``AnnounceDropping``
        #: stops at what it had in flight.
        self.dropping_bytes = 0
        self.max_dropping: int | None = None
        #: Capacity being shrunk toward, or None.
        self.target_capacity: int | None = None
        #: Remaining bytes the sender may still send or absolve (LimitSending).
        self.sending_limit: int | None = None
        #: Remaining guarantee bytes this side may still issue (LimitReceiving).
        self.receiving_limit: int | None = None

    # -- derived values
    @property
    def capacity(self) -> int:
        """Current buffer capacity in bytes."""
        return self._grown - self._shrunk

    @property
    def buffered(self) -> int:
        """Bytes of accepted frames not yet released."""
        return self._accepted - self._released

    @property
    def free(self) -> int:
        """Unoccupied buffer bytes (promised or not)."""
        return self.capacity - self.buffered

    @property
    def sender_balance(self) -> int:
        """The sender's remaining guarantees as this side computes them."""
        return self._issued - self._accepted - self._absolved

    @property
    def issuable(self) -> int:
        """Free bytes not yet promised, within the receiving limit."""
        amount = self.free - self.sender_balance
        if self.receiving_limit is not None:
            amount = min(amount, self.receiving_limit)
        return amount

    @property
    def issued_total(self) -> int:
        return self._issued

    @property
    def sending_closed(self) -> bool:
        """The sender has promised to send nothing more on this channel."""
        return self.sending_limit == 0

    # -- local actions
    def grow(self, amount: int) -> None:
        """Add ``amount`` bytes of capacity (then :meth:`issue` to promise them)."""
        check_amount(amount, "growth")
        self._grown += amount
        if self.target_capacity is not None and self.capacity >= self.target_capacity:
            self.target_capacity = None

    def set_capacity(self, target: int) -> int:
        """Grow to ``target`` at once, or start shrinking toward it.

        Shrinking first reclaims unpromised space, then every released frame
        shrinks the buffer instead of becoming issuable. Returns how many bytes
        still need a :meth:`plead` because neither can reclaim them (the
        sender holds guarantees for them on an empty buffer).
        """
        check_amount(target, "capacity")
        if target >= self.capacity:
            self.grow(target - self.capacity)
            self.target_capacity = None
            return 0
        self.target_capacity = target
        self._shrink_toward_target()
        return self.excess_needing_absolution

    @property
    def excess_needing_absolution(self) -> int:
        """Bytes above the target capacity that processing alone cannot free."""
        if self.target_capacity is None:
            return 0
        return max(0, self.capacity - self.target_capacity - self.buffered - self._reclaimable)

    @property
    def _reclaimable(self) -> int:
        """Free bytes neither promised to the sender nor owed to confirm
        optimistic frames already accepted (a negative balance is owed)."""
        return self.free - max(self.sender_balance, 0)

    def _shrink_toward_target(self) -> None:
        target = self.target_capacity
        if target is None:
            return
        excess = self.capacity - target
        reclaim = min(excess, max(self._reclaimable, 0))
        self._shrunk += reclaim
        if self.capacity <= target:
            self.target_capacity = None

    def issue(self, amount: int | None = None) -> IssueGuarantee | None:
        """Promise ``amount`` bytes (default: everything issuable).

        Returns the message to send, or None when there is nothing to issue.
        """
        issuable = self.issuable
        if amount is None:
            amount = issuable
        check_amount(amount, "amount")
        if amount > issuable:
            raise LocalProtocolError(
                f"{self.channel}: cannot issue {amount} bytes, only {issuable} issuable"
            )
        if amount == 0:
            return None
        self._issued += amount
        if self.receiving_limit is not None:
            self.receiving_limit -= amount
        return IssueGuarantee(self.channel, amount)

    def release(self, size: int) -> None:
        """A buffered frame of ``size`` bytes has been processed."""
        if not 0 < size <= self.buffered:
            raise LocalProtocolError(
                f"{self.channel}: cannot release {size} bytes, {self.buffered} buffered"
            )
        self._released += size
        self._shrink_toward_target()

    def plead(self, target: int) -> Plead:
        """Ask the sender to keep only ``target`` bytes of guarantees."""
        check_amount(target, "target")
        return Plead(self.channel, target)

    def plead_for_target(self) -> Plead | None:
        """The Plead that lets the capacity reach its target, if one is needed."""
        excess = self.excess_needing_absolution
        if excess == 0:
            return None
        return Plead(self.channel, max(self.sender_balance - excess, 0))

    def limit_receiving(self, bound: int) -> LimitReceiving:
        """Promise to issue at most ``bound`` more guarantee bytes."""
        check_amount(bound, "bound")
        tightened(self.channel, "LimitReceiving", self.receiving_limit, bound, LocalProtocolError)
        owed = max(-self.sender_balance, 0)
        if bound < owed:
            raise LocalProtocolError(
                f"{self.channel}: LimitReceiving {bound} is below the {owed} bytes of "
                "guarantees owed for accepted optimistic frames"
            )
        self.receiving_limit = bound
        return LimitReceiving(self.channel, bound)

    # -- peer input
    def on_frame(self, size: int) -> tuple[bool, list[IssueGuarantee | AnnounceDropping]]:
        """A channel frame of ``size`` bytes arrived.

        Returns ``(accepted, to_send)``. On the first drop ``to_send`` is the
        guarantee for exactly the issuable amount of this moment followed by
        ``AnnounceDropping``; the caller must send both with nothing on this
        channel in between. Raises :class:`RemoteProtocolError` (nothing
        changed) if the frame breaks the sender's own LimitSending.
        """
        if self.sending_limit is not None:
            if size > self.sending_limit:
                raise RemoteProtocolError(
                    f"{self.channel}: {size}-byte frame exceeds the sender's limit "
                    f"of {self.sending_limit} bytes",
                    GoodbyeCode.LIMIT_EXCEEDED,
                )
            self.sending_limit -= size
        if not self.dropping and self._fits(size):
            self._accepted += size
            self.accepted_frames += 1
            return True, []
        dropping = self.dropping
        if dropping:
            limit = self.max_dropping
            if limit is not None and self.dropping_bytes + size > limit:
                raise RemoteProtocolError(
                    f"{self.channel}: more than {limit} bytes sent beyond the guarantees "
                    "after the channel began dropping (no Apologise)",
                    GoodbyeCode.LIMIT_EXCEEDED,
                )
            self.dropping_bytes += size
        self.dropped_frames += 1
        self.dropped_bytes += size
        if dropping:
            return False, []
        self.dropping = True
        out: list[IssueGuarantee | AnnounceDropping] = []
        guarantee = self.issue()
        if guarantee is not None:
            out.append(guarantee)
        out.append(AnnounceDropping(self.channel))
        return False, out

    def accept_guaranteed(self, size: int) -> bool:
        """Accept a frame of ``size`` bytes if it is plainly within the
        sender's guarantees (no drop under way, no LimitSending): the common
        case of :meth:`on_frame`, with the same effect. False changes nothing;
        the caller then goes the way of :meth:`on_frame`."""
        if self.dropping or self.sending_limit is not None or self.receiving_limit is not None:
            return False
        accepted = self._accepted
        if size > self._issued - accepted - self._absolved:
            return False  # beyond the guarantees: optimistic, or a violation
        if size > self._grown - self._shrunk - accepted + self._released:
            return False
        self._accepted = accepted + size
        self.accepted_frames += 1
        return True

    def _fits(self, size: int) -> bool:
        if size > self.free:
            return False
        limit = self.receiving_limit
        return limit is None or size <= self.sender_balance + limit

    def on_absolve(self, amount: int) -> None:
        """The sender gave up ``amount`` bytes of guarantees: shrink by that much."""
        balance = self.sender_balance
        if amount > balance:
            raise RemoteProtocolError(
                f"{self.channel}: Absolve of {amount} exceeds the sender's balance {balance}"
            )
        if self.sending_limit is not None:
            if amount > self.sending_limit:
                raise RemoteProtocolError(
                    f"{self.channel}: Absolve of {amount} exceeds the sender's limit",
                    GoodbyeCode.LIMIT_EXCEEDED,
                )
            self.sending_limit -= amount
        self._absolved += amount
        self._shrunk += amount
        if self.target_capacity is not None and self.capacity <= self.target_capacity:
            self.target_capacity = None

    def on_apologise(self) -> None:
        """The sender acknowledged the drop; accept frames again."""
        if not self.dropping:
            raise RemoteProtocolError(f"{self.channel}: Apologise while not dropping")
        self.dropping = False
        self.dropping_bytes = 0

    def on_limit_sending(self, bound: int) -> None:
        """The sender promised to send at most ``bound`` more bytes."""
        self.sending_limit = tightened(
            self.channel, "LimitSending", self.sending_limit, bound, RemoteProtocolError
        )

    def statistics(self) -> ReceiverStatistics:
        return ReceiverStatistics(
            channel=self.channel,
            capacity=self.capacity,
            buffered=self.buffered,
            issuable=self.issuable,
            sender_balance=self.sender_balance,
            dropping=self.dropping,
            accepted_frames=self.accepted_frames,
            accepted_bytes=self._accepted,
            dropped_frames=self.dropped_frames,
            dropped_bytes=self.dropped_bytes,
            issued_bytes=self._issued,
            absolved_bytes=self._absolved,
            sending_limit=self.sending_limit,
            receiving_limit=self.receiving_limit,
        )
