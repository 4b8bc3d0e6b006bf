"""Inline turns (``Actor.inline_turns``): an event sent to an idle actor is
handled at once in the sender's task, with the same order, accounts and
failure handling as through the mailbox."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from accounts import Account
from actors import Actor, ActorState, Turn, open_system

from .helpers import Recorder


class InlineRecorder(Recorder):
    inline_turns = True


class Echo(Actor):
    """Inline: records each event, and sends ``"again"`` to itself once."""

    inline_turns = True

    def __init__(self) -> None:
        self.seen: list[Any] = []
        self.debts: list[int] = []

    def handle(self, turn: Turn, message: Any) -> None:
        self.seen.append(message)
        self.debts.append(turn.account.debt)
        if message == "first":
            turn.send(self, "again", cost=7)
            self.seen.append("after sending")


class InlineCrasher(Actor):
    inline_turns = True

    def __init__(self) -> None:
        self.seen: list[Any] = []

    def handle(self, turn: Turn, message: Any) -> None:
        if message == "boom":
            raise ValueError("boom")
        self.seen.append(message)


class Supervisor(Actor):
    def __init__(self) -> None:
        self.exits: list[tuple[str, BaseException | None]] = []

    def handle(self, turn: Turn, message: Any) -> None:
        pass

    async def actor_exited(self, turn: Turn, actor: Actor, error: BaseException | None) -> None:
        self.exits.append((actor.name, error))


async def test_an_event_to_an_idle_inline_actor_is_handled_before_send_returns(
    account: Account,
) -> None:
    async with open_system() as system:
        actor = system.spawn(InlineRecorder())
        plain = system.spawn(Recorder())
        await trio.testing.wait_all_tasks_blocked()  # both parked on an empty mailbox
        actor.send_nowait("now", account=account, cost=10)
        plain.send_nowait("later", account=account, cost=10)
        assert actor.seen == ["now"]  # handled in this task, already
        assert actor.accounts == [account]
        assert plain.seen == []  # the mailbox way: its task has not run yet
        assert account.debt == 11  # the inline event's loan is repaid; plain's is not
        await trio.testing.wait_all_tasks_blocked()
        assert plain.seen == ["later"]
        assert account.debt == 0
        assert actor.statistics().turns == 1


async def test_an_inline_turn_charges_its_sends_first_and_what_it_sends_itself_waits(
    account: Account,
) -> None:
    async with open_system() as system:
        echo = system.spawn(Echo())
        await trio.testing.wait_all_tasks_blocked()
        echo.send_nowait("first", account=account, cost=10)
        # "again" arrived during the inline turn: queued, not handled inside it.
        assert echo.seen == ["first", "after sending"]
        assert echo.debts == [11]
        assert account.debt == 8  # "again" (7 + 1) is charged, "first" repaid
        echo.send_nowait("third", account=account, cost=1)  # busy mailbox: queued behind
        await trio.testing.wait_all_tasks_blocked()
        assert echo.seen == ["first", "after sending", "again", "third"]
        assert account.debt == 0


async def test_a_busy_inline_actor_takes_events_in_order_through_its_mailbox(
    account: Account,
) -> None:
    async with open_system() as system:
        actor = system.spawn(InlineRecorder())
        # Not parked yet (its task has not started): everything goes to the mailbox.
        for i in range(5):
            actor.send_nowait(i, account=account)
        assert actor.seen == []
        await trio.testing.wait_all_tasks_blocked()
        actor.send_nowait(5, account=account)  # idle now: inline
        assert actor.seen == [0, 1, 2, 3, 4, 5]
        assert account.debt == 0


async def test_a_failing_inline_turn_fails_the_actor_not_the_sender(account: Account) -> None:
    async with open_system() as system:
        supervisor = system.spawn(Supervisor(), name="sup")
        child = system.spawn(InlineCrasher(), name="child", supervisor=supervisor)
        await trio.testing.wait_all_tasks_blocked()
        child.send_nowait("a", account=account, cost=10)
        child.send_nowait("boom", account=account, cost=10)  # raises nothing here
        child.send_nowait("b", account=account, cost=10)  # queued; never handled
        await trio.testing.wait_all_tasks_blocked()
        assert child.seen == ["a"]
        assert child.state is ActorState.STOPPED
        assert isinstance(child.error, ValueError)
        assert supervisor.exits == [("child", child.error)]
        assert account.debt == 0


async def test_an_async_handler_cannot_take_inline_turns(account: Account) -> None:
    class AsyncInline(Actor):
        inline_turns = True

        async def handle(self, turn: Turn, message: Any) -> None:  # type: ignore[override]
            await trio.lowlevel.checkpoint()

    async with open_system() as system:
        supervisor = system.spawn(Supervisor(), name="sup")
        actor = system.spawn(AsyncInline(), name="async", supervisor=supervisor)
        await trio.testing.wait_all_tasks_blocked()
        actor.send_nowait("x", account=account, cost=10)
        await trio.testing.wait_all_tasks_blocked()
        assert actor.state is ActorState.STOPPED
        assert isinstance(actor.error, TypeError)
        assert account.debt == 0


async def test_stopping_during_an_inline_turn_stops_after_it(account: Account) -> None:
    class StopsItself(InlineRecorder):
        def handle(self, turn: Turn, message: Any) -> None:
            super().handle(turn, message)
            self.stop()

    async with open_system() as system:
        actor = system.spawn(StopsItself())
        await trio.testing.wait_all_tasks_blocked()
        actor.send_nowait("only", account=account, cost=10)
        assert actor.state is ActorState.STOPPING
        actor.send_nowait("dead letter", account=account, cost=10)
        await actor.wait_stopped()
        assert actor.seen == ["only"]
        assert account.debt == 0
        assert system.statistics().dead_letters == 1
