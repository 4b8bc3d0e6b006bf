"""Closing a client while other calls wait, or while its connection breaks:
every waiting call learns it (none hangs), a break during the exit flush
is resumed like any other, and calls after closing raise ConnectionLost.
Also: a subscription the broker refuses is never returned."""

from __future__ import annotations

import threading
import time

import pytest
import trio

from broker.client import BlockingClient, ConnectionLost, open_client
from tests.proxy import proxied
from tests.server.helpers import running_broker, url, wait_subscribed

#: Well under the 15 s lease, whose expiry would also end a wait.
PROMPTLY = 10.0
SAFETY = 30.0


async def test_aclose_ends_the_waits_of_other_tasks_on_a_silent_broker() -> None:
    async with (
        running_broker() as broker,
        proxied(broker.address) as proxy,
        open_client(proxy.url) as client,
        client.subscribe("never") as subscription,
    ):
        ended: list[BaseException] = []

        async def receive() -> None:
            try:
                await subscription.receive()
            except ConnectionLost as error:
                ended.append(error)

        proxy.freeze()
        with trio.fail_after(PROMPTLY):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(receive)
                await trio.testing.wait_all_tasks_blocked()
                await client.aclose(flush=False)
        assert len(ended) == 1
        with pytest.raises(ConnectionLost, match="closed"):
            await client.publish("never", b"after")  # (a topic it had bound)
        with pytest.raises(ConnectionLost, match="closed"):
            client.publish_nowait("other", b"after")


async def test_a_break_during_the_exit_flush_is_resumed() -> None:
    """Leaving ``open_client``'s block flushes; with ``reconnect`` a broken
    connection meanwhile is replaced and the flush completes (it used to
    raise ConnectionLost, the unconfirmed messages not resent)."""
    async with (
        running_broker() as broker,
        proxied(broker.address) as proxy,
        open_client(url(broker)) as reader,
        reader.subscribe("t") as subscription,
    ):
        await wait_subscribed(broker, "t")
        with trio.fail_after(SAFETY):
            async with trio.open_nursery() as nursery:

                async def publish_and_leave() -> None:
                    async with open_client(proxy.url, reconnect=SAFETY) as client:
                        await client.publish("t", b"0")
                        await client.flush()
                        proxy.freeze()
                        for n in range(1, 50):
                            await client.publish("t", b"%d" % n)
                    # (left: flushed, or raised)

                nursery.start_soon(publish_and_leave)
                await trio.testing.wait_all_tasks_blocked(0.05)
                proxy.cut()  # what the frozen proxy held is lost
                proxy.thaw()
            got = [(await subscription.receive()).payload for _ in range(50)]
        assert got == [b"%d" % n for n in range(50)]
        assert proxy.cuts == 1 and proxy.connections == 2


async def test_a_subscription_the_broker_refuses_is_not_returned() -> None:
    """The refusal (Goodbye 1) and the Pong the client waits for may come in
    one read: subscribe raises, it does not return a dead subscription."""
    async with running_broker() as broker:
        async with open_client(url(broker)) as client:
            with pytest.raises(ConnectionLost, match="unknown subscribe option"):
                async with client.subscribe("t", mode="lossy", options={"nope": 1}):
                    pytest.fail("a refused subscription was returned")  # pragma: no cover

        def blocking() -> None:
            with BlockingClient(url(broker)) as client, pytest.raises(ConnectionLost):
                client.subscribe("t", mode="lossy", options={"max_queued": -5}, timeout=SAFETY)
                pytest.fail("a refused subscription was returned")  # pragma: no cover

        await trio.to_thread.run_sync(blocking)


async def test_a_blocking_close_with_a_timeout_breaks_another_threads_wait() -> None:
    """A thread waits without a timeout, holding the client (a receive on a
    topic nobody publishes to); ``close(timeout=...)`` cannot take the
    client: it ends that wait (ConnectionLost there), closes, and raises
    TimeoutError (it used to wait for ever)."""
    async with running_broker() as broker:

        def run() -> tuple[BaseException | None, BaseException | None, float]:
            client = BlockingClient(url(broker))
            subscription = client.subscribe("never", timeout=SAFETY)
            outcome: list[BaseException | None] = [None]

            def receive_forever() -> None:
                try:
                    subscription.receive()
                except ConnectionLost as error:
                    outcome[0] = error

            receiver = threading.Thread(target=receive_forever)
            receiver.start()
            while client._lock.acquire(blocking=False):  # until the receiver holds it
                client._lock.release()
                time.sleep(0.01)
            started = time.monotonic()
            closing: BaseException | None = None
            try:
                client.close(timeout=0.2)
            except TimeoutError as error:
                closing = error
            took = time.monotonic() - started
            receiver.join(SAFETY)
            assert not receiver.is_alive()
            return outcome[0], closing, took

        lost, closing, took = await trio.to_thread.run_sync(run)
    assert isinstance(lost, ConnectionLost)
    assert isinstance(closing, TimeoutError)
    assert took < PROMPTLY


async def test_every_call_after_aclose_raises_connection_lost() -> None:
    async with running_broker() as broker, open_client(url(broker)) as client:
        await client.publish("used", b"x")
        await client.aclose()
        for call in (
            lambda: client.publish("used", b"y"),
            lambda: client.publish("new", b"y"),
            lambda: client.offsets(["used"]),
            client.flush,
        ):
            with pytest.raises(ConnectionLost, match="closed"):
                await call()
