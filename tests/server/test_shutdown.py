"""Graceful shutdown and the reliable deliveries queued when it begins: sent
to subscribers that keep issuing guarantees, but never at the cost of the
Goodbye and the drain."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio

from broker.client import ConnectionLost, open_client
from broker.protocol import (
    BindTopic,
    Channel,
    ChannelKind,
    FreeHandle,
    GoodbyeCode,
    HandleType,
    IssueGuarantee,
    Subscribe,
)
from broker.server import Broker

from .helpers import RawClient, running_broker, url, wait_until

DEADLINE = 3.0
DELIVER_0 = Channel(ChannelKind.DELIVER, 0)


def _queued(broker: Broker) -> int:
    return sum(s.queued for c in broker.connections.values() for s in c.subscriptions.values())


async def _stingy_shutdown(meanwhile: Callable[[RawClient], Awaitable[None]]) -> float:
    """A subscriber grants room for three deliveries and never more, twenty
    are queued for it, a bystander idles; shut down (running ``meanwhile``
    alongside), check both got Goodbye 5, and return how long it took."""
    async with (
        running_broker(shutdown_deadline=DEADLINE) as broker,
        trio.open_nursery() as nursery,
    ):
        stingy = await RawClient.connect(broker)
        await stingy.handshake("stingy")
        await stingy.send(
            BindTopic("news"), Subscribe(0, "reliable", {}), IssueGuarantee(DELIVER_0, 3000)
        )
        stingy.start_reading(nursery)
        bystander = await RawClient.connect(broker)
        await bystander.handshake("bystander")
        bystander.start_reading(nursery)
        await wait_until(lambda: broker.statistics().subscriptions == 1)
        async with open_client(url(broker), name="pub") as publisher:
            for _ in range(20):
                await publisher.publish("news", b"x" * 1000)
            await wait_until(lambda: _queued(broker) > 0, what="queued deliveries")
            started = trio.current_time()
            async with trio.open_nursery() as inner:
                inner.start_soon(broker.shutdown)
                await meanwhile(stingy)
            took = trio.current_time() - started
        for client in (stingy, bystander):
            await client.read_until_eof()
            assert client.goodbye_code() == GoodbyeCode.SHUTTING_DOWN
            await client.aclose()
        return took


async def test_queued_deliveries_reach_a_subscriber_that_keeps_reading() -> None:
    count = 300
    received: list[int] = []
    lost: list[int] = []
    async with (
        running_broker(shutdown_deadline=DEADLINE) as broker,
        trio.open_nursery() as nursery,
    ):

        async def slow_subscriber(task_status: trio.TaskStatus[None]) -> None:
            async with (
                open_client(url(broker), name="sub") as client,
                client.subscribe("news") as subscription,
            ):
                task_status.started()
                try:
                    async for message in subscription:
                        received.append(int(message.payload.split(b" ")[0]))
                        await trio.sleep(0.001)
                except ConnectionLost as error:
                    lost.append(error.code)

        await nursery.start(slow_subscriber)
        await wait_until(lambda: broker.statistics().subscriptions == 1)
        async with open_client(url(broker), name="pub") as publisher:
            for i in range(count):
                await publisher.publish("news", b"%d " % i + b"x" * 1000)
            await publisher.flush()
            await wait_until(lambda: _queued(broker) > 0, what="queued deliveries")
            await broker.shutdown()
    assert received == list(range(count))  # everything queued was delivered first
    assert lost == [GoodbyeCode.SHUTTING_DOWN]


async def test_a_subscriber_without_guarantees_does_not_take_the_drain_time() -> None:
    async def nothing(_: RawClient) -> None:
        pass

    took = await _stingy_shutdown(nothing)
    # Half the deadline waiting for it, then the Goodbyes and a short linger
    # (the raw clients do not close their end), well within the deadline.
    assert DEADLINE / 2 - 0.1 <= took < DEADLINE - 0.25


async def test_a_subscription_freed_during_the_wait_ends_it() -> None:
    async def free_it(stingy: RawClient) -> None:
        await trio.sleep(0.1)
        await stingy.send(FreeHandle(HandleType.SUBSCRIPTION, 0, True))

    took = await _stingy_shutdown(free_it)
    assert took < DEADLINE / 2  # not half the deadline waiting: the linger only
