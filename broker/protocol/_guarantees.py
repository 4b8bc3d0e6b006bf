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

from collections import deque
from dataclasses import dataclass
from typing import Any

from ._errors import LocalProtocolError, RemoteProtocolError
from ._messages import (
    Absolve,
    AnnounceDropping,
    Apologise,
    IssueGuarantee,
    LimitReceiving,
    LimitSending,
    Plead,
)
from ._types import U64_MAX, Channel, GoodbyeCode


def _tightened(
    channel: Channel, name: str, current: int | None, bound: int, error: type[Exception]
) -> int:
    """``bound`` if it is tighter than ``current`` (strictly: an equal bound
    would say nothing new), else ``error``."""
    if current is not None and bound >= current:
        raise error(f"{channel}: {name} {bound} does not tighten the remaining bound {current}")
    return bound


def _check_amount(value: int, what: str) -> None:
    if not 0 <= value <= U64_MAX:
        raise LocalProtocolError(f"{what} must be between 0 and 2**64-1, got {value}")


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
        "receiving_limit",
        "sending_limit",
        "target_capacity",
    )

    def __init__(self, channel: Channel, capacity: int = 0) -> None:
        _check_amount(capacity, "capacity")
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
        _check_amount(amount, "growth")
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
        _check_amount(target, "capacity")
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
        _check_amount(amount, "amount")
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
        _check_amount(target, "target")
        return Plead(self.channel, target)

    def plead_for_target(self) -> Plead | None:
        """The Plead that lets the capacity reach its target, if one is needed."""
        excess = self.excess_needing_absolution
        if excess == 0:
            return None
        return Plead(self.channel, max(self.sender_balance - excess, 0))

    def limit_receiving(self, bound: int) -> LimitReceiving:
        """Promise to issue at most ``bound`` more guarantee bytes."""
        _check_amount(bound, "bound")
        _tightened(self.channel, "LimitReceiving", self.receiving_limit, bound, LocalProtocolError)
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
        self.dropped_frames += 1
        self.dropped_bytes += size
        if self.dropping:
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

    def on_limit_sending(self, bound: int) -> None:
        """The sender promised to send at most ``bound`` more bytes."""
        self.sending_limit = _tightened(
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


@dataclass(slots=True)
class SentFrame:
    """A frame the sender keeps until it is known to be buffered."""

    size: int
    frame: bytes
    message: Any
    #: Position in the channel's sent byte stream just after this frame.
    end: int = 0


@dataclass(slots=True, frozen=True)
class SenderStatistics:
    """A snapshot of one sending channel."""

    channel: Channel
    balance: int
    unconfirmed_frames: int
    unconfirmed_bytes: int
    retransmit_frames: int
    retransmit_bytes: int
    sent_frames: int
    sent_bytes: int
    received_bytes: int
    refunded_bytes: int
    absolved_bytes: int
    drops_announced: int
    sending_limit: int | None
    receiving_limit: int | None


class ChannelSender:
    """Sending side of one channel: balance, unconfirmed FIFO, retransmission."""

    __slots__ = (
        "_absolved",
        "_received",
        "_refunded",
        "_sent",
        "channel",
        "drops_announced",
        "receiving_limit",
        "retransmit",
        "sending_limit",
        "sent_frames",
        "unconfirmed",
    )

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self._received = 0
        self._sent = 0
        self._absolved = 0
        self._refunded = 0
        self.sent_frames = 0
        self.drops_announced = 0
        #: Frames sent beyond the guarantees, oldest first.
        self.unconfirmed: deque[SentFrame] = deque()
        #: Dropped frames waiting to be sent again, before anything new.
        self.retransmit: deque[SentFrame] = deque()
        #: Remaining bytes this side may still send or absolve (LimitSending).
        self.sending_limit: int | None = None
        #: Remaining guarantee bytes the receiver may still issue (LimitReceiving).
        self.receiving_limit: int | None = None

    @property
    def covered(self) -> int:
        return self._received - self._absolved + self._refunded

    @property
    def balance(self) -> int:
        """Remaining guarantees: negative while optimistic bytes are unconfirmed."""
        return self.covered - self._sent

    @property
    def unconfirmed_bytes(self) -> int:
        return sum(entry.size for entry in self.unconfirmed)

    @property
    def retransmit_bytes(self) -> int:
        return sum(entry.size for entry in self.retransmit)

    @property
    def receiving_closed(self) -> bool:
        """The receiver will issue no more guarantees and none are left."""
        return self.receiving_limit == 0 and self.balance <= 0 and not self.unconfirmed

    def room(self, optimism: int = 0) -> int:
        """Largest new frame that may go out now (0 while retransmissions wait).

        ``optimism`` is how many bytes beyond the guarantees may be in flight
        unconfirmed; optimism is pointless once the receiver has limited its
        guarantees, so it is ignored then.
        """
        if self.retransmit:
            return 0
        if self.receiving_limit is not None:
            optimism = 0
        room = self.balance + optimism
        if self.sending_limit is not None:
            room = min(room, self.sending_limit)
        return max(room, 0)

    def record_sent(self, entry: SentFrame) -> None:
        """Account for ``entry`` having been put on the wire."""
        if self.sending_limit is not None:
            if entry.size > self.sending_limit:
                raise LocalProtocolError(
                    f"{self.channel}: {entry.size}-byte frame exceeds own LimitSending "
                    f"({self.sending_limit} bytes left)"
                )
            self.sending_limit -= entry.size
        self._sent += entry.size
        self.sent_frames += 1
        entry.end = self._sent
        if entry.end > self.covered:
            self.unconfirmed.append(entry)

    def send_guaranteed(self, size: int) -> bool:
        """Account for a frame of ``size`` bytes if it is plainly within the
        guarantees (nothing to retransmit, no LimitSending): the common case
        of :meth:`room` and :meth:`record_sent`, with the same effect. False
        changes nothing; the caller then goes the general way."""
        if self.retransmit or self.sending_limit is not None:
            return False
        sent = self._sent + size
        if sent > self._received - self._absolved + self._refunded:
            return False
        self._sent = sent
        self.sent_frames += 1
        return True

    def record_within_guarantees(self, frames: int, size: int) -> None:
        """Account for ``frames`` frames of ``size`` bytes in all, sent within
        :meth:`room` (so none of them is unconfirmed)."""
        if size > self.room():
            raise LocalProtocolError(f"{self.channel}: {size} bytes exceed the room to send")
        if self.sending_limit is not None:
            self.sending_limit -= size
        self._sent += size
        self.sent_frames += frames

    def next_retransmission(self) -> SentFrame | None:
        """The next dropped frame, if the guarantees and own limit now allow it."""
        if not self.retransmit:
            return None
        size = self.retransmit[0].size
        if size > self.balance or (self.sending_limit is not None and size > self.sending_limit):
            return None
        return self.retransmit.popleft()

    def abandon_stuck_retransmissions(self) -> list[SentFrame]:
        """Give up the waiting retransmissions if the next one can never be sent.

        That is when it exceeds this side's own LimitSending, or what the
        receiver may still issue under its LimitReceiving. Returns the frames
        given up (oldest first), or nothing.
        """
        if not self.retransmit:
            return []
        size = self.retransmit[0].size
        over_own = self.sending_limit is not None and size > self.sending_limit
        over_receiver = (
            self.receiving_limit is not None and size > self.balance + self.receiving_limit
        )
        if not (over_own or over_receiver):
            return []
        abandoned = list(self.retransmit)
        self.retransmit.clear()
        return abandoned

    def absolve(self, amount: int) -> Absolve:
        """Give up ``amount`` bytes of guarantees."""
        _check_amount(amount, "amount")
        if amount > self.balance:
            raise LocalProtocolError(
                f"{self.channel}: cannot absolve {amount}, balance is {self.balance}"
            )
        if self.sending_limit is not None:
            if amount > self.sending_limit:
                raise LocalProtocolError(f"{self.channel}: Absolve exceeds own LimitSending")
            self.sending_limit -= amount
        self._absolved += amount
        return Absolve(self.channel, amount)

    def limit_sending(self, bound: int) -> LimitSending:
        """Promise to send (or absolve) at most ``bound`` more bytes."""
        _check_amount(bound, "bound")
        _tightened(self.channel, "LimitSending", self.sending_limit, bound, LocalProtocolError)
        waiting = self.retransmit_bytes
        if bound < waiting:
            raise LocalProtocolError(
                f"{self.channel}: LimitSending {bound} is below the {waiting} bytes "
                "waiting to be retransmitted"
            )
        self.sending_limit = bound
        return LimitSending(self.channel, bound)

    # -- peer input
    def on_guarantee(self, amount: int) -> list[SentFrame]:
        """Guarantees arrived; returns the unconfirmed frames they confirm."""
        if self.balance + amount > U64_MAX:
            raise RemoteProtocolError(
                f"{self.channel}: guarantees overflow 2**64-1", GoodbyeCode.LIMIT_EXCEEDED
            )
        if self.receiving_limit is not None:
            if amount > self.receiving_limit:
                raise RemoteProtocolError(
                    f"{self.channel}: IssueGuarantee of {amount} exceeds the receiver's "
                    f"own limit of {self.receiving_limit}",
                    GoodbyeCode.LIMIT_EXCEEDED,
                )
            self.receiving_limit -= amount
        self._received += amount
        confirmed: list[SentFrame] = []
        covered = self.covered
        unconfirmed = self.unconfirmed
        while unconfirmed and unconfirmed[0].end <= covered:
            confirmed.append(unconfirmed.popleft())
        return confirmed

    def on_announce_dropping(self) -> tuple[Apologise, list[SentFrame]]:
        """Every unconfirmed frame was dropped: refund them and queue them again.

        Returns the Apologise to send and the dropped frames (oldest first),
        now also at the end of :attr:`retransmit`.
        """
        if not self.unconfirmed:
            raise RemoteProtocolError(
                f"{self.channel}: AnnounceDropping with no unconfirmed frames"
            )
        self.drops_announced += 1
        return Apologise(self.channel), self.forget_unconfirmed()

    def forget_unconfirmed(self) -> list[SentFrame]:
        """Every unconfirmed frame was lost: refund it and queue it to be sent again.

        Returns those frames, oldest first. Called on an AnnounceDropping, and
        when the bind of this channel's handle was dropped (the broker then
        discards the frames unannounced, and no Apologise is owed).
        """
        dropped = list(self.unconfirmed)
        self.unconfirmed.clear()
        self._refunded += sum(entry.size for entry in dropped)
        self.retransmit.extend(dropped)
        return dropped

    def on_plead(self, target: int) -> Absolve | None:
        """The receiver asked us to keep ``target``: absolve the excess, if any."""
        excess = self.balance - target
        if self.sending_limit is not None:
            excess = min(excess, self.sending_limit)
        if excess <= 0:
            return None
        return self.absolve(excess)

    def on_limit_receiving(self, bound: int) -> None:
        """The receiver promised to issue at most ``bound`` more guarantee bytes."""
        self.receiving_limit = _tightened(
            self.channel, "LimitReceiving", self.receiving_limit, bound, RemoteProtocolError
        )

    def statistics(self) -> SenderStatistics:
        return SenderStatistics(
            channel=self.channel,
            balance=self.balance,
            unconfirmed_frames=len(self.unconfirmed),
            unconfirmed_bytes=self.unconfirmed_bytes,
            retransmit_frames=len(self.retransmit),
            retransmit_bytes=self.retransmit_bytes,
            sent_frames=self.sent_frames,
            sent_bytes=self._sent,
            received_bytes=self._received,
            refunded_bytes=self._refunded,
            absolved_bytes=self._absolved,
            drops_announced=self.drops_announced,
            sending_limit=self.sending_limit,
            receiving_limit=self.receiving_limit,
        )
