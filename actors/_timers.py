"""Timers: events an actor sends itself later, on an account of their own."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Protocol

import trio

from accounts import Account, LoanedItem


class TimerHost(Protocol):
    """What a timer needs of the actor it sends to (an :class:`~actors.Actor`)."""

    @property
    def name(self) -> str: ...

    def _deliver(self, item: LoanedItem[Any]) -> None: ...

    def _timer_done(self, timer: Timer) -> None: ...


_serial = itertools.count(1)


@dataclass(frozen=True, slots=True)
class TimerStatistics:
    """A snapshot of a timer.

    Attributes:
        fired: events the timer has put in its actor's mailbox.
        skipped: periodic ticks skipped because the previous one was still
            outstanding when they fell due.
        active: whether the timer may still fire.
    """

    fired: int
    skipped: int
    active: bool


class Timer:
    """A pending event an actor will send itself: see :meth:`Actor.after`
    and :meth:`Actor.every`.

    The events are charged to :attr:`account`, the timer's own account (a
    child of the system's ``timers`` account), never to the connection or
    channel whose turn created the timer. A periodic timer's account blocks
    while one tick is outstanding, so ticks never pile up in a busy mailbox.
    """

    def __init__(
        self, actor: TimerHost, message: Any, delay: float, period: float | None, parent: Account
    ) -> None:
        if delay < 0 or (period is not None and not period > 0):
            raise ValueError(f"timer needs delay >= 0 and period > 0, got {delay}, {period}")
        self.actor = actor
        self.message = message
        self.period = period
        name = f"{actor.name}/timer-{next(_serial)}"
        # A periodic timer may have one tick outstanding: the first loan puts
        # it above a zero high watermark, and it clears when that is repaid.
        high = 0 if period is not None else math.inf
        self.account = Account(
            name, high_watermark=high, low_watermark=high, parent=parent, kind="timer"
        )
        self._deadline = trio.current_time() + delay
        self._cancel_scope = trio.CancelScope()
        self._fired = 0
        self._skipped = 0
        self._active = True

    @property
    def active(self) -> bool:
        """Whether the timer may still fire."""
        return self._active

    def cancel(self) -> None:
        """Stop the timer; a tick already in the mailbox is still handled."""
        if self._active:
            self._active = False
            self._cancel_scope.cancel()
            self.actor._timer_done(self)
            self.account.close()

    def statistics(self) -> TimerStatistics:
        """A snapshot of the timer (see :class:`TimerStatistics`)."""
        return TimerStatistics(fired=self._fired, skipped=self._skipped, active=self._active)

    async def _run(self) -> None:
        with self._cancel_scope:
            while True:
                await trio.sleep_until(self._deadline)
                await self.account.ensure_clear_funds()
                # Ticks are 1 byte so that even a zero per-event constant
                # leaves a periodic timer's account above its zero watermark.
                self.actor._deliver(LoanedItem(self.account, 1, self.message))
                self._fired += 1
                if self.period is None:
                    break
                self._deadline += self.period
                now = trio.current_time()
                if self._deadline < now:
                    missed = math.ceil((now - self._deadline) / self.period)
                    self._skipped += missed
                    self._deadline += missed * self.period
        self.cancel()
