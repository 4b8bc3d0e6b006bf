"""``flush()`` on a connection that has ended raises ConnectionLost in both
clients, even when nothing is outstanding (the async client used to return
normally then, while BlockingClient raised)."""

from __future__ import annotations

import pytest
import trio

from broker.client import BlockingClient, ConnectionLost, open_client
from broker.protocol import GoodbyeCode
from tests.server.helpers import TIMEOUT, running_broker, url, wait_subscribed

SAFETY = 10.0


async def test_async_flush_raises_once_the_broker_has_gone() -> None:
    async with (
        running_broker() as broker,
        trio.open_nursery() as nursery,
        open_client(url(broker)) as client,
    ):
        with trio.fail_after(TIMEOUT):
            await client.publish("t", b"x")
            await client.flush()  # nothing outstanding from here on
            async with client.subscribe("t") as subscription:
                await wait_subscribed(broker, "t")
                nursery.start_soon(broker.shutdown)
                with pytest.raises(ConnectionLost):
                    await subscription.receive()
            with pytest.raises(ConnectionLost) as info:
                await client.flush()
        assert info.value.code == GoodbyeCode.SHUTTING_DOWN
        assert client.statistics()["published"] == client.statistics()["confirmed"] == 1


async def test_async_flush_raises_after_aclose() -> None:
    async with running_broker() as broker, open_client(url(broker)) as client:
        await client.publish("t", b"x")
        await client.aclose()
        with trio.fail_after(TIMEOUT), pytest.raises(ConnectionLost, match="closed"):
            await client.flush()


async def test_blocking_flush_raises_the_same_way() -> None:
    async with running_broker() as broker, trio.open_nursery() as nursery:

        def run() -> ConnectionLost:
            with BlockingClient(url(broker)) as client:
                client.publish("t", b"x", timeout=SAFETY)
                client.flush(timeout=SAFETY)
                with client.subscribe("t", timeout=SAFETY) as subscription:
                    trio.from_thread.run_sync(nursery.start_soon, broker.shutdown)
                    with pytest.raises(ConnectionLost):
                        subscription.receive(timeout=SAFETY)
                with pytest.raises(ConnectionLost) as gone:
                    client.flush(timeout=SAFETY)
            return gone.value

        gone = await trio.to_thread.run_sync(run)
        assert gone.code == GoodbyeCode.SHUTTING_DOWN


async def test_blocking_flush_raises_after_close() -> None:
    async with running_broker() as broker:

        def run() -> None:
            client = BlockingClient(url(broker))
            client.publish("t", b"x", timeout=SAFETY)
            client.close(timeout=SAFETY)
            with pytest.raises(ConnectionLost, match="closed"):
                client.flush(timeout=SAFETY)

        await trio.to_thread.run_sync(run)
