"""Control frames charged to their connection's account until answered.

A publish is charged to its channel's account from the moment it is
buffered until it is routed. A control frame (a Ping, an Ack, a bind, a
guarantee) is handled within the reader's turn, but what it answers (a
Pong, a Welcome, a FreeHandle, a Confirm) may wait to be written: to a
client that does not read, a flood of tiny frames becomes a queue of tiny
answers. :class:`ControlCharges` charges such a turn's control frames to
the connection's account as their own loans would (their bytes plus the
per-event cost each), and repays them once the turn's output is with the
kernel: the account, and so the reader's backstop and the metrics, see that
work like any other. A turn whose output was all written at once leaves
nothing outstanding and charges nothing.
"""

from __future__ import annotations

from typing import Any

from accounts import Account, LoanedItem

__all__ = ["ControlCharges"]


class ControlCharges:
    """The control frames of one connection whose answers are not written yet."""

    __slots__ = ("_account", "_frames", "_size", "waiting")

    def __init__(self, account: Account) -> None:
        self._account = account
        #: One loan per read whose output was left waiting, oldest first.
        self.waiting: list[LoanedItem[Any]] = []
        #: The control frames (and their bytes) of the read's turns so far.
        self._frames = self._size = 0

    def note(self, frames: int, size: int) -> None:
        """A turn of the read handled ``frames`` control frames, ``size`` bytes."""
        self._frames += frames
        self._size += size

    def settle(self, output_waits: bool) -> None:
        """The read's last turn is done (its output written, if it could be):
        if its answers wait to be written, charge its control frames until
        they are. (Charged per read, not per turn: the turns before the last
        hold their output back on purpose, for the last to write at once.)"""
        frames, size = self._frames, self._size
        self._frames = self._size = 0
        if output_waits and frames > 0:
            # One loan charges its cost plus one event cost: as many loans would.
            cost = size + (frames - 1) * self._account.event_cost
            self.waiting.append(LoanedItem(self._account, cost, None))

    def take(self) -> list[LoanedItem[Any]]:
        """The loans of the turns whose output is being taken for writing
        (repaid once it is written)."""
        waiting = self.waiting
        self.waiting = []
        return waiting

    def repay(self) -> None:
        """The connection ends: nothing it was asked will be answered."""
        for loan in self.take():
            loan.repay()
