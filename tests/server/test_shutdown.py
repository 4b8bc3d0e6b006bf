"""Graceful shutdown: no publish is accepted once it begins, and what was
confirmed is sent to subscribers that keep issuing guarantees, but never at
the cost of the Goodbye and the drain.

The tests that time the shutdown run on trio's MockClock (autojump), over
in-memory streams (``memory``): the broker's timers are exact there,
however loaded the machine."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack

import pytest
import trio
import trio.testing

from broker.client import BlockingClient, ConnectionLost, open_client
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

from .helpers import TIMEOUT, RawClient, connect_client, running_broker, url, wait_until

DEADLINE = 3.0
DELIVER_0 = Channel(ChannelKind.DELIVER, 0)


def _queued(broker: Broker) -> int:
    return sum(s.queued for c in broker.connections.values() for s in c.subscriptions.values())


async def _read_numbers(
    broker: Broker,
    received: list[int],
    ends: list[int | None],
    every: int,
    pause: float,
    *,
    task_status: trio.TaskStatus[None],
) -> None:
    """Subscribe to "news" and append each message's leading number to
    ``received``, pausing ``pause`` seconds after every ``every`` messages;
    the Goodbye code that ends the subscription goes to ``ends``."""
    async with (
        open_client(url(broker), name="sub") as client,
        client.subscribe("news") as subscription,
    ):
        task_status.started()
        try:
            async for message in subscription:
                received.append(int(message.payload.split(b" ")[0]))
                if len(received) % every == 0:
                    await trio.sleep(pause)
        except ConnectionLost as error:
            ends.append(error.code)


async def _stingy_shutdown(
    meanwhile: Callable[[RawClient], Awaitable[None]],
) -> tuple[Broker, float]:
    """A subscriber grants room for three deliveries and never more, twenty
    are queued for it, a bystander idles; shut down (running ``meanwhile``
    alongside), check both got Goodbye 5, and return the broker and how long
    the shutdown took."""
    async with (
        running_broker(shutdown_deadline=DEADLINE, in_memory=True) as broker,
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
        async with connect_client(broker, name="pub") as publisher:
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
        return broker, took


async def test_queued_deliveries_reach_a_subscriber_that_keeps_reading() -> None:
    count = 300
    received: list[int] = []
    lost: list[int | None] = []
    async with (
        running_broker(shutdown_deadline=DEADLINE) as broker,
        trio.open_nursery() as nursery,
    ):
        await nursery.start(_read_numbers, broker, received, lost, 1, 0.001)
        await wait_until(lambda: broker.statistics().subscriptions == 1)
        async with open_client(url(broker), name="pub") as publisher:
            for i in range(count):
                await publisher.publish("news", b"%d " % i + b"x" * 1000)
            await publisher.flush()
            await wait_until(lambda: _queued(broker) > 0, what="queued deliveries")
            await broker.shutdown()
    assert received == list(range(count))  # everything queued was delivered first
    assert lost == [GoodbyeCode.SHUTTING_DOWN]


async def test_a_subscriber_without_guarantees_does_not_take_the_drain_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def nothing(_: RawClient) -> None:
        pass

    broker, took = await _stingy_shutdown(nothing)
    # Half the deadline waiting for it, then the Goodbyes and a short linger
    # (the raw clients do not close their end): every connection closed by
    # itself, none was cut at the deadline.
    assert not broker.shutdown_drained
    assert broker.shutdown_cut == 0
    assert DEADLINE / 2 <= took < DEADLINE


async def test_a_subscription_freed_during_the_wait_ends_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def free_it(stingy: RawClient) -> None:
        await trio.sleep(0.1)
        await stingy.send(FreeHandle(HandleType.SUBSCRIPTION, 0, True))

    broker, took = await _stingy_shutdown(free_it)
    assert broker.shutdown_drained
    assert took < DEADLINE / 2  # not half the deadline waiting: the linger only


async def test_every_confirmed_publish_reaches_a_subscriber_that_keeps_reading() -> None:
    """A publisher publishes flat out, a subscriber reads at about 2,000
    messages a second (so deliveries queue up), and the shutdown begins in
    the middle: every publish the broker confirmed reaches the subscriber,
    in order, before its Goodbye 5; the publisher learns of the shutdown."""
    received: list[int] = []
    ends: list[int | None] = []
    async with (
        running_broker(shutdown_deadline=DEADLINE) as broker,
        trio.open_nursery() as nursery,
    ):
        # About 2,000 messages a second.
        await nursery.start(_read_numbers, broker, received, ends, 10, 0.005)
        await wait_until(lambda: broker.statistics().subscriptions == 1)
        async with open_client(url(broker), name="pub") as publisher:

            async def shut_down_soon() -> None:
                # It begins with deliveries queued for the subscriber.
                await wait_until(
                    lambda: len(received) > 500 and _queued(broker) > 0, what="a backlog"
                )
                await broker.shutdown()

            nursery.start_soon(shut_down_soon)
            published = 0
            try:
                while True:
                    await publisher.publish("news", b"%d " % published + b"x" * 1000)
                    published += 1
            except ConnectionLost as error:
                assert error.code == GoodbyeCode.SHUTTING_DOWN
            confirmed = publisher.statistics()["confirmed"]
            if confirmed < published:
                with pytest.raises(ConnectionLost):  # never silently: flushing says so
                    await publisher.flush()
            await publisher.aclose(flush=False)
    assert ends == [GoodbyeCode.SHUTTING_DOWN]
    assert 500 < confirmed <= published
    assert received[:confirmed] == list(range(confirmed))  # each confirmed one, in order
    assert received == list(range(len(received)))  # and nothing else out of turn
    assert broker.shutdown_drained and broker.shutdown_cut == 0


async def _serve_on(port: int, stack: AsyncExitStack) -> Broker:
    """A broker on ``port`` once the previous one has let go of it (the
    broker is entered into ``stack``: no cancel scope may surround that)."""
    give_up = trio.current_time() + TIMEOUT
    while True:
        try:
            return await stack.enter_async_context(running_broker(listen=f"127.0.0.1:{port}"))
        except* OSError:  # still bound by the broker shutting down
            if trio.current_time() > give_up:
                raise
        await trio.sleep(0.05)


async def test_a_publish_the_shutdown_did_not_accept_is_published_again_by_the_client() -> None:
    """Publishes sent once the shutdown began are not confirmed: the client
    keeps them and, reconnecting, publishes them again to the next broker
    (only them: what was confirmed is not sent twice)."""
    async with AsyncExitStack() as stack:
        first = await stack.enter_async_context(running_broker(shutdown_deadline=DEADLINE))
        port = first.address[1]
        # A subscriber that takes three deliveries and no more holds the
        # shutdown in its wait for queued deliveries (half the deadline).
        stingy = await RawClient.connect(first)
        await stingy.handshake("stingy")
        await stingy.send(
            BindTopic("news"), Subscribe(0, "reliable", {}), IssueGuarantee(DELIVER_0, 3000)
        )
        await wait_until(lambda: first.statistics().subscriptions == 1)
        publisher = await stack.enter_async_context(
            open_client(url(first), name="pub", reconnect=TIMEOUT)
        )
        for _ in range(20):
            await publisher.publish("news", b"x" * 1000)
        await publisher.flush()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(first.shutdown)
            await wait_until(lambda: first.closing)
            for i in range(5):
                await publisher.publish("late", b"late %d" % i)
            assert "late" in first.topics and first.topics["late"].messages_in == 0
        await stingy.aclose()
        second = await _serve_on(port, stack)
        await wait_until(
            lambda: "late" in second.topics and second.topics["late"].messages_in == 5,
            what="the unconfirmed publishes on the next broker",
        )
        await publisher.aclose()  # everything confirmed now
        assert publisher.sessions_lost == 1
        assert "news" not in second.topics  # the confirmed ones were not sent again


async def test_the_blocking_client_does_not_drop_what_the_shutdown_did_not_confirm() -> None:
    """A BlockingClient that publishes once the shutdown began: its flush and
    its close say the messages may be lost (ConnectionLost, code 5)."""
    async with running_broker(shutdown_deadline=DEADLINE) as broker:
        stingy = await RawClient.connect(broker)
        await stingy.handshake("stingy")
        await stingy.send(
            BindTopic("news"), Subscribe(0, "reliable", {}), IssueGuarantee(DELIVER_0, 3000)
        )
        await wait_until(lambda: broker.statistics().subscriptions == 1)
        async with connect_client(broker, name="pub") as publisher:
            for _ in range(20):
                await publisher.publish("news", b"x" * 1000)
        client = await trio.to_thread.run_sync(lambda: BlockingClient(url(broker), name="sync"))
        errors: list[int | None] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(broker.shutdown)
            await wait_until(lambda: broker.closing)

            def publish_then_close() -> None:
                client.publish("late", b"not accepted", timeout=TIMEOUT)
                for attempt in (lambda: client.flush(timeout=TIMEOUT), client.close):
                    try:
                        attempt()
                    except ConnectionLost as error:
                        errors.append(error.code)

            await trio.to_thread.run_sync(publish_then_close)
        assert errors == [GoodbyeCode.SHUTTING_DOWN, GoodbyeCode.SHUTTING_DOWN]
        await stingy.aclose()
