"""Timers run on accounts of their own, never pile up, and die with their actor."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from accounts import Account
from actors import Actor, Turn, open_system

from .helpers import Recorder


class Ticker(Actor):
    """Records (time, message, account) per event; a tick may take a while."""

    def __init__(self, work: float = 0.0, target: Actor | None = None) -> None:
        self.events: list[tuple[float, Any, Account]] = []
        self.work = work
        self.target = target

    async def handle(self, turn: Turn, message: Any) -> None:
        if message == "schedule":
            self.timer = self.after(2.5, "alarm")
            return
        self.events.append((trio.current_time(), message, turn.account))
        if self.target is not None:
            turn.send(self.target, message, cost=50)
        await trio.sleep(self.work)


async def test_after_fires_once_on_the_timers_own_account(
    autojump_clock: trio.testing.MockClock, account: Account
) -> None:
    async with open_system() as system:
        ticker = system.spawn(Ticker())
        ticker.send_nowait("schedule", account=account, cost=10)
        await trio.sleep(10)
        [(when, message, paid_by)] = ticker.events
        assert (when, message) == (pytest.approx(2.5), "alarm")
        # Charged to the timer, not to the connection whose turn set it.
        assert paid_by is ticker.timer.account
        assert paid_by is not account
        assert paid_by.parent is system.timers
        assert paid_by.kind == "timer"
        assert not ticker.timer.active
        assert ticker.timer.statistics().fired == 1
    assert account.debt == 0


async def test_every_ticks_on_schedule(autojump_clock: trio.testing.MockClock) -> None:
    async with open_system() as system:
        sink = system.spawn(Recorder())
        ticker = system.spawn(Ticker(target=sink))
        timer = ticker.every(1.0, "tick", first=0.5)
        await trio.sleep(4.75)
        assert [when for when, _, _ in ticker.events] == pytest.approx([0.5, 1.5, 2.5, 3.5, 4.5])
        # What the tick's turn sends is charged to the timer's account too.
        assert sink.accounts == [timer.account] * 5
        timer.cancel()
        await trio.sleep(5)
        assert len(ticker.events) == 5
        assert timer.statistics().skipped == 0


async def test_a_slow_actor_gets_skipped_ticks_not_a_pile_up(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_system() as system:
        ticker = system.spawn(Ticker(work=3.5))
        timer = ticker.every(1.0, "tick")
        max_mailbox = 0
        for _ in range(200):
            await trio.sleep(0.1)
            max_mailbox = max(max_mailbox, ticker.statistics().mailbox)
        # One tick outstanding at a time: the mailbox never holds two.
        assert max_mailbox <= 1
        # A tick that falls due while the previous one is outstanding goes out
        # as soon as that one is repaid (4.5 = 1.0 + 3.5); those that fell due
        # in between (3.0 and 4.0) are skipped.
        times = [when for when, _, _ in ticker.events]
        assert times[:4] == pytest.approx([1.0, 4.5, 8.0, 11.5])
        stats = timer.statistics()
        assert stats.fired == len(times)
        assert stats.skipped >= 2 * (len(times) - 1)
        assert stats.fired + stats.skipped <= 20  # slots due by t=20, none counted twice
        assert timer.account.debt <= timer.account.event_cost + 1


async def test_stopping_an_actor_cancels_its_timers(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_system() as system:
        ticker = system.spawn(Ticker())
        timer = ticker.every(1.0, "tick")
        once = ticker.after(5.0, "alarm")
        await trio.sleep(2.5)
        ticker.stop()
        await ticker.wait_stopped()
        assert not timer.active
        assert not once.active
        assert timer.account.closed
        await trio.sleep(10)
        assert [m for _, m, _ in ticker.events] == ["tick", "tick"]
    assert system.timers.debt == 0


async def test_timer_arguments_are_checked(autojump_clock: trio.testing.MockClock) -> None:
    async with open_system() as system:
        ticker = system.spawn(Ticker())
        with pytest.raises(ValueError, match="period"):
            ticker.every(0, "tick")
        with pytest.raises(ValueError, match="delay"):
            ticker.after(-1, "tick")
