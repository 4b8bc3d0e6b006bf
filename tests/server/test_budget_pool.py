"""The broker's budget is shared: once the channels of all connections have
reserved it, a new connection's channel used to starve however idle the
others were (at the defaults, 1,100 connections that each published once
and stayed connected left the last ~190 waiting for good). Quiet channels
of other connections now give room back (``_budget_pool``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import trio
import trio.testing

from broker.client import Client, open_client
from broker.protocol import Channel, ChannelKind
from broker.server import Broker
from broker.server.connection._budget_pool import SCAN, BudgetPool

from .helpers import TIMEOUT, connection_named, running_broker, url, wait_until


@asynccontextmanager
async def idle_publishers(budget: int) -> AsyncIterator[tuple[Broker, list[Client]]]:
    """A broker whose global and connection budgets are ``budget``, and five
    clients that each published once to a topic of their own, then idle."""
    async with (
        running_broker(global_budget=budget, connection_budget=budget) as broker,
        AsyncExitStack() as stack,
    ):
        clients = [
            await stack.enter_async_context(open_client(url(broker), name=f"c{i}"))
            for i in range(5)
        ]
        for i, client in enumerate(clients):
            with trio.fail_after(TIMEOUT):
                await client.publish(f"t{i}", b"x" * 100)
                await client.flush()
        yield broker, clients


async def test_a_starved_publisher_gets_room_from_other_connections_quiet_channels() -> None:
    # 512 KiB: the first connection takes 288 KiB (its bind channels and a
    # full publish channel), the next two 96 KiB each (one frame: the budget
    # is short); then nothing is left. Five fit once the first is shrunk.
    async with idle_publishers(512 * 1024) as (broker, clients):
        pool = broker.budget_pool
        assert pool.reclaims > 0 and pool.reclaimed_bytes > 0
        assert pool.waiting == 0
        assert broker.buffer_reserved <= broker.config.global_budget
        # A shrunk channel takes room back once busy again.
        with trio.fail_after(TIMEOUT):
            for _ in range(50):
                await clients[0].publish("t0", b"y" * 10_000)
            await clients[0].flush()


async def test_a_channel_shrunk_for_another_takes_room_back_from_quiet_ones_when_busy() -> None:
    """The pool shrinks a quiet channel for a starved one; busy again, it
    used to stay shrunk for good once the broker's budget was all reserved
    (its connection had no quiet channel of its own to take from): it asks
    the pool too, and other connections' quiet channels give room back."""
    async with idle_publishers(1024 * 1024) as (broker, clients):
        assert broker.budget_pool.reclaimed_bytes > 0  # the last one was funded so
        channels = {
            i: connection_named(broker, f"c{i}").protocol.receiver(PUBLISH_0) for i in range(3)
        }
        shrunk = [i for i, receiver in channels.items() if receiver.capacity < FULL]
        assert shrunk, "the pool shrank one of the first three"
        busy = shrunk[0]
        done = trio.Event()

        async def keep_publishing() -> None:
            while not done.is_set():
                await clients[busy].publish(f"t{busy}", b"y" * 1000)
                await trio.sleep(0.02)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(keep_publishing)
            await wait_until(
                lambda: channels[busy].capacity == FULL, what="the busy channel grown back"
            )
            done.set()
        assert broker.buffer_reserved <= broker.config.global_budget


FULL = 256 * 1024
PUBLISH_0 = Channel(ChannelKind.PUBLISH, 0)


class Member:
    """A connection's budget: ``quiet`` bytes to give back, ``starved`` until funded."""

    def __init__(self, quiet: int = 0, starved: bool = False) -> None:
        self.quiet = quiet
        self.starved = starved
        self.asked = 0

    def reclaim_quiet(self, needed: int) -> int:
        self.asked += 1
        given = min(needed, self.quiet)
        self.quiet -= given
        return given

    def fund_starved(self) -> bool:
        return self.starved


def test_an_ask_looks_at_a_bounded_number_of_connections_and_moves_on() -> None:
    pool = BudgetPool()
    members = [Member() for _ in range(SCAN * 2)]
    for member in members:
        pool.add(member)
    waiter = Member(starved=True)
    pool.add(waiter)
    pool.short(waiter, 1000)  # nobody has quiet room
    assert [m.asked for m in members] == [1] * SCAN + [0] * SCAN
    pool.short(waiter, 1000)  # the next ask starts where the last stopped
    assert [m.asked for m in members] == [1] * (2 * SCAN)
    assert waiter.asked == 0 and pool.waiting == 1
    pool.remove(waiter)
    assert pool.waiting == 0


async def test_waiters_are_funded_once_room_is_freed_and_asked_again_meanwhile(
    autojump_clock: trio.testing.MockClock,
) -> None:
    pool = BudgetPool()
    busy = Member(quiet=0)
    waiter = Member(starved=True)
    pool.add(busy)
    pool.add(waiter)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pool.run)
        pool.short(waiter, 1000)
        await trio.sleep(0.5)
        assert busy.asked == 1
        await trio.sleep(1.0)  # asked again after RETRY: it may be quiet now
        assert busy.asked == 2
        waiter.starved = False
        pool.freed()
        await trio.sleep(0.01)
        assert pool.waiting == 0
        nursery.cancel_scope.cancel()
