"""Turns, mailboxes and sending: the fan-out rule and its bookkeeping."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from accounts import Account
from actors import (
    TURNS_PER_YIELD,
    Actor,
    ActorState,
    NotInTurnError,
    NotSpawnedError,
    Turn,
    open_system,
)

from .helpers import Forwarder, Recorder


async def test_turn_charges_its_sends_to_the_event_account_before_repaying_it() -> None:
    channel = Account("channel", high_watermark=10**6, low_watermark=0, event_cost=1)
    observed: list[int] = []

    class Probe(Actor):
        def __init__(self, target: Actor) -> None:
            self.target = target

        def handle(self, turn: Turn, message: Any) -> None:
            assert turn.account is channel
            observed.append(channel.debt)  # the inbound event: 1 + 10
            turn.send(self.target, "a", cost=5)
            turn.send(self.target, "b", cost=5)
            observed.append(channel.debt)  # plus two outbound: 11 + 6 + 6

    async with open_system() as system:
        sink = system.spawn(Recorder())
        probe = system.spawn(Probe(sink))
        probe.send_nowait("m", account=channel, cost=10)
        await trio.testing.wait_all_tasks_blocked()
        assert observed == [11, 23]
        assert sink.seen == ["a", "b"]
        assert sink.accounts == [channel, channel]
        assert channel.debt == 0


async def test_a_turn_cannot_be_used_after_it_ended(account: Account) -> None:
    kept: list[Turn] = []

    class Keeper(Actor):
        def handle(self, turn: Turn, message: Any) -> None:
            kept.append(turn)

    async with open_system() as system:
        keeper = system.spawn(Keeper())
        keeper.send_nowait("x", account=account)
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(NotInTurnError):
            kept[0].send(keeper, "y")
        with pytest.raises(NotInTurnError):
            _ = kept[0].account
    assert account.debt == 0


async def test_async_turn_holds_its_loan_until_it_returns(account: Account) -> None:
    release = trio.Event()

    class Slow(Actor):
        async def handle(self, turn: Turn, message: Any) -> None:
            await release.wait()

    async with open_system() as system:
        slow = system.spawn(Slow())
        slow.send_nowait("x", account=account, cost=9)
        await trio.testing.wait_all_tasks_blocked()
        assert account.debt == 10
        release.set()
        await trio.testing.wait_all_tasks_blocked()
        assert account.debt == 0


async def test_mailbox_keeps_order_and_never_drops(account: Account) -> None:
    n = 5_000
    unbounded = Account("flood", high_watermark=float("inf"), low_watermark=0, event_cost=1)
    async with open_system() as system:
        sink = system.spawn(Recorder())
        forward = system.spawn(Forwarder(sink))
        for i in range(n):
            forward.send_nowait(i, account=unbounded)
        assert forward.statistics().mailbox == n
        await trio.testing.wait_all_tasks_blocked()
        assert sink.seen == list(range(n))
        assert sink.statistics().turns == n
    assert unbounded.debt == 0


async def test_a_flooded_actor_yields_to_other_tasks(account: Account) -> None:
    n = TURNS_PER_YIELD * 10
    progress: list[int] = []
    async with open_system() as system:
        sink = system.spawn(Recorder())
        for i in range(n):
            sink.send_nowait(i, account=account, cost=0)

        async def observer() -> None:
            for _ in range(5):
                progress.append(len(sink.seen))
                await trio.lowlevel.checkpoint()

        system._nursery.start_soon(observer)
        await trio.testing.wait_all_tasks_blocked()
    # The observer ran while the sink was part-way through its mailbox.
    assert any(0 < seen < n for seen in progress), progress
    assert len(sink.seen) == n


async def test_send_waits_for_clear_funds_and_nowait_does_not() -> None:
    tight = Account("tight", high_watermark=2, low_watermark=0, event_cost=1)
    release = trio.Event()

    class Gate(Actor):
        async def handle(self, turn: Turn, message: Any) -> None:
            await release.wait()

    async with open_system() as system:
        gate = system.spawn(Gate())
        for i in range(3):
            gate.send_nowait(i, account=tight)  # nowait: never blocks, 3 > 2
        assert tight.blocked
        sent = trio.Event()

        async def sender() -> None:
            await gate.send("late", account=tight)
            sent.set()

        system._nursery.start_soon(sender)
        await trio.testing.wait_all_tasks_blocked()
        assert not sent.is_set()
        release.set()
        await trio.testing.wait_all_tasks_blocked()
        assert sent.is_set()
    assert tight.debt == 0


async def test_spawning_twice_or_sending_to_an_unspawned_actor_is_refused(
    account: Account,
) -> None:
    loose = Recorder()
    with pytest.raises(NotSpawnedError):
        loose.send_nowait("x", account=account)
    assert account.debt == 0  # the refused send was repaid
    with pytest.raises(NotSpawnedError):
        _ = loose.system
    async with open_system() as system:
        system.spawn(loose)
        with pytest.raises(NotSpawnedError):
            system.spawn(loose)
    assert loose.state is ActorState.STOPPED


async def test_statistics_describe_the_actor(account: Account) -> None:
    async with open_system() as system:
        sink = system.spawn(Recorder(), name="sink")
        sink.send_nowait("a", account=account)
        stats = sink.statistics()
        assert (stats.name, stats.state, stats.mailbox, stats.turns) == (
            "sink",
            ActorState.RUNNING,
            1,
            0,
        )
        await trio.testing.wait_all_tasks_blocked()
        assert sink.statistics().turns == 1
        assert system.statistics().actors == 1
    assert system.statistics().actors == 0
    assert system.statistics().spawned_total == 1
