"""Stopping, failing, supervision, watches, helper tasks and cancellation:
whatever way an actor ends, every loan in its mailbox is repaid."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.lowlevel
import trio.testing

from accounts import Account, live_accounts
from actors import Actor, ActorFailed, ActorState, NotSpawnedError, Turn, open_system

from .helpers import Crasher, Recorder


class Supervisor(Actor):
    """Records the exits it is told about instead of escalating them."""

    def __init__(self) -> None:
        self.exits: list[tuple[str, BaseException | None, Account]] = []

    def handle(self, turn: Turn, message: Any) -> None:
        pass

    async def actor_exited(self, turn: Turn, actor: Actor, error: BaseException | None) -> None:
        self.exits.append((actor.name, error, turn.account))


async def test_stop_repays_the_mailbox_unhandled(account: Account) -> None:
    release = trio.Event()

    class Slow(Recorder):
        async def handle(self, turn: Turn, message: Any) -> None:  # type: ignore[override]
            await release.wait()
            self.seen.append(message)

    async with open_system() as system:
        slow = system.spawn(Slow())
        for i in range(5):
            slow.send_nowait(i, account=account, cost=10)
        await trio.testing.wait_all_tasks_blocked()
        slow.stop()
        slow.stop()  # idempotent
        assert slow.state is ActorState.STOPPING
        release.set()
        await slow.wait_stopped()
        assert slow.seen == [0]  # the turn in progress finished; the rest did not run
        assert slow.state is ActorState.STOPPED
        assert account.debt == 0
        # Later sends are dead letters: repaid at once and counted.
        slow.send_nowait("late", account=account, cost=10)
        assert account.debt == 0
        assert system.statistics().dead_letters == 1


async def test_a_failure_reaches_the_supervisor_and_the_mailbox_is_repaid(
    account: Account,
) -> None:
    async with open_system() as system:
        supervisor = system.spawn(Supervisor(), name="sup")
        child = system.spawn(Crasher(), name="child", supervisor=supervisor)
        for message in ["a", "boom", "b", "c"]:
            child.send_nowait(message, account=account, cost=100)
        await trio.testing.wait_all_tasks_blocked()
        assert child.seen == ["a"]
        assert child.state is ActorState.STOPPED
        assert isinstance(child.error, ValueError)
        [(name, error, paid_by)] = supervisor.exits
        assert name == "child"
        assert error is child.error
        assert paid_by is system.account  # exit notices are the system's cost
        assert account.debt == 0
        assert supervisor.state is ActorState.RUNNING
    assert system.account.debt == 0


async def test_an_unsupervised_failure_fails_the_system(account: Account) -> None:
    with pytest.RaisesGroup(pytest.RaisesExc(ActorFailed, match="'lonely'")) as raised:
        async with open_system() as system:
            lonely = system.spawn(Crasher(), name="lonely")
            lonely.send_nowait("boom", account=account, cost=3)
            await trio.sleep_forever()
    failure = raised.value.exceptions[0]
    assert isinstance(failure.__cause__, ValueError)
    assert account.debt == 0


async def test_default_supervision_escalates_up_the_tree(account: Account) -> None:
    class Parent(Actor):
        def handle(self, turn: Turn, message: Any) -> None:
            pass

    with pytest.RaisesGroup(pytest.RaisesExc(ActorFailed, match="'grandparent'")) as raised:
        async with open_system() as system:
            grandparent = system.spawn(Parent(), name="grandparent")
            parent = system.spawn(Parent(), name="parent", supervisor=grandparent)
            child = system.spawn(Crasher(), name="child", supervisor=parent)
            child.send_nowait("boom", account=account)
            await trio.sleep_forever()
    chain = []
    error: BaseException | None = raised.value.exceptions[0]
    while error is not None:
        chain.append(error)
        error = error.__cause__
    assert [type(e) for e in chain] == [ActorFailed, ActorFailed, ActorFailed, ValueError]
    assert [getattr(e, "actor_name", None) for e in chain[:3]] == [
        "grandparent",
        "parent",
        "child",
    ]
    assert account.debt == 0


async def test_a_child_can_be_spawned_from_a_turn_and_is_supervised(account: Account) -> None:
    class Spawner(Supervisor):
        def handle(self, turn: Turn, message: Any) -> None:
            child = turn.spawn(Crasher(), name="spawned")
            turn.send(child, "boom")

    async with open_system() as system:
        spawner = system.spawn(Spawner())
        spawner.send_nowait("go", account=account)
        await trio.testing.wait_all_tasks_blocked()
        [(name, error, _)] = spawner.exits
        assert name == "spawned"
        assert isinstance(error, ValueError)
    assert account.debt == 0


async def test_watchers_hear_of_normal_stops_too(account: Account) -> None:
    async with open_system() as system:
        watcher = system.spawn(Supervisor(), name="watcher")
        watched = system.spawn(Recorder(), name="watched")
        watcher.watch(watched)
        watched.stop()
        await trio.testing.wait_all_tasks_blocked()
        assert [(n, e) for n, e, _ in watcher.exits] == [("watched", None)]
        # Watching an actor that already stopped reports at once.
        late = system.spawn(Supervisor(), name="late")
        late.watch(watched)
        await trio.testing.wait_all_tasks_blocked()
        assert [(n, e) for n, e, _ in late.exits] == [("watched", None)]


async def test_a_failing_helper_task_fails_its_actor(account: Account) -> None:
    class WithHelper(Supervisor):
        async def started(self) -> None:
            self.start_soon(self.helper)

        async def helper(self) -> None:
            await trio.lowlevel.checkpoint()
            raise KeyError("helper")

    async with open_system() as system:
        supervisor = system.spawn(Supervisor())
        actor = system.spawn(WithHelper(), supervisor=supervisor)
        actor.send_nowait("pending", account=account)
        await actor.wait_stopped()
        await trio.testing.wait_all_tasks_blocked()
        [(_, error, _)] = supervisor.exits
        assert isinstance(error, KeyError)
    assert account.debt == 0


async def test_stopping_cancels_helper_tasks_and_runs_on_stop(account: Account) -> None:
    cancelled = trio.Event()
    stopped_with: list[BaseException | None] = []

    class WithHelper(Recorder):
        async def started(self) -> None:
            self.start_soon(self.helper)

        async def helper(self) -> None:
            try:
                await trio.sleep_forever()
            finally:
                cancelled.set()

        def on_stop(self, error: BaseException | None) -> None:
            stopped_with.append(error)

    async with open_system() as system:
        actor = system.spawn(WithHelper())
        await trio.testing.wait_all_tasks_blocked()
        actor.stop()
        await actor.wait_stopped()
        assert cancelled.is_set()
        assert stopped_with == [None]


async def test_cancellation_propagates_and_repays_everything(account: Account) -> None:
    stopped_with: list[BaseException | None] = []

    class Stuck(Recorder):
        async def handle(self, turn: Turn, message: Any) -> None:  # type: ignore[override]
            turn.send(self, "follow-up", cost=7)
            await trio.sleep_forever()

        def on_stop(self, error: BaseException | None) -> None:
            stopped_with.append(error)

    with trio.CancelScope() as scope:
        async with open_system() as system:
            stuck = system.spawn(Stuck())
            for i in range(3):
                stuck.send_nowait(i, account=account, cost=5)
            await trio.testing.wait_all_tasks_blocked()
            assert account.debt == (5 + 1) * 3 + (7 + 1)
            scope.cancel()
            await trio.sleep_forever()
    assert scope.cancelled_caught  # Cancelled was not swallowed on the way out
    assert stopped_with == [None]  # cancellation is not a failure
    assert account.debt == 0


async def test_leaving_the_system_stops_every_actor(account: Account) -> None:
    async with open_system() as system:
        actors = [system.spawn(Recorder()) for _ in range(5)]
        for actor in actors:
            actor.send_nowait("x", account=account)
    assert all(actor.state is ActorState.STOPPED for actor in actors)
    assert account.debt == 0
    assert system.account.closed
    assert system.timers.closed


async def test_stopping_a_supervisor_stops_its_children(account: Account) -> None:
    async with open_system() as system:
        parent = system.spawn(Supervisor(), name="parent")
        children = [system.spawn(Recorder(), supervisor=parent) for _ in range(3)]
        for child in children:
            child.send_nowait("queued", account=account)
        parent.stop()
        for child in children:
            await child.wait_stopped()
        assert system.statistics().actors == 0
    assert account.debt == 0


async def test_an_actor_spawned_during_shutdown_does_not_keep_the_system_open(
    account: Account,
) -> None:
    late: list[Actor] = []

    class SpawnsOnStop(Recorder):
        def on_stop(self, error: BaseException | None) -> None:
            late.append(self.system.spawn(Recorder(), name="late"))

    with trio.fail_after(5):
        async with open_system() as system:
            system.spawn(SpawnsOnStop())
    assert [actor.state for actor in late] == [ActorState.STOPPED]


async def test_a_stopped_actor_takes_no_timers_or_tasks(account: Account) -> None:
    async with open_system() as system:
        actor = system.spawn(Recorder())
        actor.stop()
        await actor.wait_stopped()
        before = len(live_accounts())
        with pytest.raises(NotSpawnedError):
            actor.after(1, "x")
        with pytest.raises(NotSpawnedError):
            actor.every(1, "x")
        with pytest.raises(NotSpawnedError):
            actor.start_soon(trio.sleep, 1)
        assert len(live_accounts()) == before


class BusyParent(Supervisor):
    """A supervisor whose turns wait on a gate, so notices queue up behind."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = trio.Event()

    async def handle(self, turn: Turn, message: Any) -> None:  # type: ignore[override]
        await self.gate.wait()


class FailsWhenReleased(Actor):
    def __init__(self) -> None:
        self.gate = trio.Event()

    async def handle(self, turn: Turn, message: Any) -> None:
        await self.gate.wait()
        raise ValueError("late failure")


async def test_a_failure_queued_when_its_supervisor_stops_is_not_lost(account: Account) -> None:
    with pytest.RaisesGroup(pytest.RaisesExc(ActorFailed, match="'child'")):
        async with open_system() as system:
            parent = system.spawn(BusyParent(), name="parent")
            parent.send_nowait("work", account=account)
            child = system.spawn(Crasher(), name="child", supervisor=parent)
            child.send_nowait("boom", account=account)
            await child.wait_stopped()
            assert parent.statistics().mailbox == 1  # the notice waits behind the turn
            parent.stop()
            parent.gate.set()
            await trio.sleep_forever()
    assert account.debt == 0


async def test_a_child_failing_after_its_supervisor_stopped_is_not_lost(
    account: Account,
) -> None:
    with pytest.RaisesGroup(pytest.RaisesExc(ActorFailed, match="'child'")):
        async with open_system() as system:
            parent = system.spawn(Supervisor(), name="parent")
            child = system.spawn(FailsWhenReleased(), name="child", supervisor=parent)
            child.send_nowait("work", account=account)
            await trio.testing.wait_all_tasks_blocked()
            parent.stop()
            await parent.wait_stopped()
            child.gate.set()  # the child's last turn fails, with nobody to tell
            await trio.sleep_forever()
    assert account.debt == 0
