"""Connection churn: a closed connection is freed by reference counting.

The broker raises the garbage collector's threshold and freezes start-up
objects (``gc_threshold``), so reference cycles that closed connections leave
are found late, by old-generation collections: under churn their memory piles
up. These tests run with the collector switched off and check that nothing
of a closed connection stays alive.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress

import trio

from broker.client import open_client
from broker.protocol import (
    BindTopic,
    Channel,
    ChannelKind,
    Goodbye,
    IssueGuarantee,
    Publish,
    Subscribe,
)
from broker.server import Broker

from .helpers import RawClient, newest_connection, running_broker, url, wait_until


@contextmanager
def collector_off() -> Iterator[None]:
    """No garbage collection in the block: only reference counting frees."""
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class Tracker:
    """Weak references to the broker's connections and their protocol objects."""

    def __init__(self) -> None:
        self.refs: list[weakref.ref[object]] = []

    def track(self, broker: Broker) -> None:
        connection = newest_connection(broker)
        self.refs += [weakref.ref(connection), weakref.ref(connection.protocol)]

    def alive(self) -> list[str]:
        return [type(obj).__name__ for ref in self.refs if (obj := ref()) is not None]


async def _all_freed(tracker: Tracker) -> None:
    with suppress(AssertionError):
        await wait_until(lambda: not tracker.alive())
    assert not tracker.alive(), "still alive after closing"


async def _no_hello(broker: Broker, tracker: Tracker) -> None:
    client = await RawClient.connect(broker)
    await wait_until(lambda: bool(broker.connections))
    tracker.track(broker)
    await client.aclose()


async def _client_says_goodbye(broker: Broker, tracker: Tracker) -> None:
    async with open_client(url(broker), name="polite") as client:
        tracker.track(broker)
        async with client.subscribe("churn") as subscription:
            await client.publish("churn", b"hello")
            await subscription.receive()


async def _reset_with_a_session(broker: Broker, tracker: Tracker) -> None:
    """A subscriber and publisher whose connection breaks: its session waits
    for a resume (here: until its short lease ends)."""
    client = await RawClient.connect(broker)
    await client.handshake("rude")
    tracker.track(broker)
    await client.send(
        BindTopic("churn"),
        Subscribe(0, "reliable", {}),
        IssueGuarantee(Channel(ChannelKind.DELIVER, 0), 4096),
        Publish(0, b"unread", None, None),
    )
    await wait_until(lambda: broker.statistics().subscriptions == 1)
    await client.aclose()
    await wait_until(lambda: not broker.sessions.sessions, what="the session to expire")


async def _raw_goodbye(broker: Broker, tracker: Tracker) -> None:
    client = await RawClient.connect(broker)
    await client.handshake("raw")
    tracker.track(broker)
    await client.send(BindTopic("churn"), Goodbye(0, "bye"))
    await client.read_until_eof()
    await client.aclose()


@asynccontextmanager
async def _churning_broker() -> AsyncIterator[Broker]:
    async with running_broker(heartbeat=0.1, lease=0.3) as broker:
        yield broker


async def _churn(step: Callable[[Broker, Tracker], Awaitable[None]], rounds: int = 5) -> None:
    async with _churning_broker() as broker:
        await step(broker, Tracker())  # warm up: first-use caches are not garbage
        await wait_until(lambda: not broker.connections)
        tracker = Tracker()
        with collector_off():
            for _ in range(rounds):
                await step(broker, tracker)
                await wait_until(lambda: not broker.connections)
            await _all_freed(tracker)
        assert len(tracker.refs) == 2 * rounds


async def test_a_connection_closed_before_its_hello_is_freed() -> None:
    await _churn(_no_hello)


async def test_a_connection_whose_client_said_goodbye_is_freed() -> None:
    await _churn(_client_says_goodbye)


async def test_a_connection_that_said_goodbye_on_the_wire_is_freed() -> None:
    await _churn(_raw_goodbye)


async def test_a_broken_connection_is_freed_once_its_session_expires() -> None:
    await _churn(_reset_with_a_session, rounds=3)


async def test_connections_closed_by_a_shutdown_are_freed() -> None:
    tracker = Tracker()
    clients: list[RawClient] = []
    with collector_off():
        async with _churning_broker() as broker, trio.open_nursery() as nursery:
            for _ in range(3):
                client = await RawClient.connect(broker)
                await client.handshake("stays")
                tracker.track(broker)
                client.start_reading(nursery)
                clients.append(client)
        for client in clients:
            await client.aclose()
        await _all_freed(tracker)
