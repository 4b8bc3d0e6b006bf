"""The sending side of the guarantee protocol for one logical channel
(see ``_guarantees`` for the counters both sides keep)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from .._errors import LocalProtocolError, RemoteProtocolError
from .._types import U64_MAX, Channel, GoodbyeCode
from ..frames._messages import Absolve, Apologise, LimitSending
from ._bounds import check_amount, tightened


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
        check_amount(amount, "amount")
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
        check_amount(bound, "bound")
        tightened(self.channel, "LimitSending", self.sending_limit, bound, LocalProtocolError)
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
        self.receiving_limit = tightened(
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
