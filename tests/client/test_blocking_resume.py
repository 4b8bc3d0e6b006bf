"""The blocking client reconnects and resumes its session, like the trio client.

Brokers run in trio on loopback, behind a :class:`tests.proxy.CuttableProxy`
the tests cut; the blocking clients run in worker threads. Every blocking call
has a generous timeout, so a bug fails a test instead of hanging it.
"""

from __future__ import annotations

import random
import threading
import time
from functools import partial

import pytest
import trio

from broker.backoff import BACKOFF_FIRST
from broker.client import BlockingClient, ConnectionLost
from tests.proxy import cut_on_progress, proxied
from tests.server.helpers import TIMEOUT, running_broker, wait_idle, wait_until

#: The publisher publishes in this many phases, each after a cut of its own.
PHASES = 4


async def test_cut_connections_resume_without_loss_or_duplicates() -> None:
    """A blocking publisher and a blocking subscriber, 20,000 messages, the
    proxy cut at random moments: every message arrives exactly once, in
    order; the sessions are resumed, never lost."""
    count = 20_000
    rng = random.Random(1124)
    received: list[int] = []
    stats: dict[str, dict[str, int]] = {}
    subscribed = threading.Event()
    async with running_broker(heartbeat=0.5, lease=2.0) as broker, proxied(broker.address) as proxy:
        url = proxy.url

        def consume() -> None:
            with BlockingClient(url, name="sub", reconnect=TIMEOUT) as client:
                with client.subscribe("ticks", timeout=TIMEOUT) as subscription:
                    subscribed.set()
                    while len(received) < count:
                        received.append(int(subscription.receive(timeout=TIMEOUT).payload))
                stats["sub"] = client.statistics()

        def publish() -> None:
            with BlockingClient(url, name="pub", reconnect=TIMEOUT) as client:
                for i in range(count):
                    if i and i % (count // PHASES) == 0:
                        # Each phase after the first starts with a cut of its
                        # own, whatever the timing of the others.
                        trio.from_thread.run_sync(proxy.cut)
                    client.publish("ticks", b"%d" % i, timeout=TIMEOUT)
                client.flush(timeout=TIMEOUT)
                stats["pub"] = client.statistics()

        async def cut_now_and_then() -> None:
            # (Never once the subscriber is done: its Goodbye would be cut
            # off, and its session would wait out the lease.)
            # Each cut waits for 200 more messages received since the last.
            await cut_on_progress(
                proxy,
                lambda: len(received),
                lambda: len(received) == count,
                step=200,
                pause=lambda: rng.uniform(0.0, 0.05),
            )

        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.to_thread.run_sync, consume)
            await trio.to_thread.run_sync(partial(subscribed.wait, TIMEOUT))
            nursery.start_soon(cut_now_and_then)
            with trio.fail_after(4 * TIMEOUT):
                await trio.to_thread.run_sync(publish)
        assert received == list(range(count))
        assert proxy.cuts >= PHASES - 1
        assert stats["pub"]["published"] == stats["pub"]["confirmed"] == count
        assert stats["pub"]["sessions_lost"] == stats["sub"]["sessions_lost"] == 0
        assert stats["pub"]["resumes"] + stats["sub"]["resumes"] >= 2
        await wait_idle(broker)
        # A cut may still have hit the publisher's Goodbye: its session then
        # waits out its (short) lease.
        await wait_until(lambda: broker.sessions.sessions == {}, what="sessions ended")


async def test_an_idle_client_is_reconnected_by_its_heartbeat_thread() -> None:
    """Nobody calls the client while its connection is cut: the heartbeat
    thread notices, reconnects and resumes; the subscription then receives
    what was published meanwhile."""
    async with running_broker(heartbeat=0.2, lease=5.0) as broker, proxied(broker.address) as proxy:
        client = await trio.to_thread.run_sync(
            partial(BlockingClient, proxy.url, name="idle", reconnect=TIMEOUT)
        )
        try:
            subscription = await trio.to_thread.run_sync(
                partial(client.subscribe, "quiet", timeout=TIMEOUT)
            )
            proxy.cut()
            await wait_until(lambda: client.resumes == 1, what="a resume by the heartbeat")
            assert client.sessions_lost == 0
            assert not client.reconnecting
            assert broker.sessions.resumed_total == 1
            await wait_until(
                lambda: broker.statistics().subscriptions == 1, what="the subscription"
            )

            def publish_and_receive() -> bytes:
                host, port = broker.address
                with BlockingClient(f"{host}:{port}", name="pub") as publisher:
                    publisher.publish("quiet", b"after the cut", timeout=TIMEOUT)
                return subscription.receive(timeout=TIMEOUT).payload

            assert await trio.to_thread.run_sync(publish_and_receive) == b"after the cut"
        finally:
            await trio.to_thread.run_sync(partial(client.close, timeout=TIMEOUT))


async def test_a_broker_restart_is_noticed_and_the_session_restored() -> None:
    """The broker goes away (Goodbye 5) and the proxy now leads to one that
    never heard of the session: the client says so (callback, counter),
    subscribes again, and publishes again what was not confirmed."""
    lost: list[str] = []
    async with (
        running_broker() as second,
        running_broker() as first,
        proxied(first.address) as proxy,
    ):
        client = await trio.to_thread.run_sync(
            partial(
                BlockingClient,
                proxy.url,
                name="restarted",
                reconnect=TIMEOUT,
                on_session_lost=lambda: lost.append(threading.current_thread().name),
            )
        )
        try:
            subscription = await trio.to_thread.run_sync(
                partial(client.subscribe, "news", timeout=TIMEOUT)
            )

            def round_trip(payload: bytes) -> tuple[bytes, int]:
                client.publish("news", payload, timeout=TIMEOUT)
                message = subscription.receive(timeout=TIMEOUT)
                return message.payload, message.seq

            assert await trio.to_thread.run_sync(round_trip, b"before") == (b"before", 1)
            proxy.target = second.address
            await first.shutdown()
            # The next call notices, reconnects to `second` and restores the session.
            assert await trio.to_thread.run_sync(round_trip, b"after") == (b"after", 1)
            assert client.sessions_lost == 1
            assert len(lost) == 1
            assert client.resumes == 0
            assert second.statistics().subscriptions == 1
        finally:
            await trio.to_thread.run_sync(partial(client.close, timeout=TIMEOUT))
        await wait_idle(second)


async def test_reconnecting_gives_up_after_its_time() -> None:
    """With no broker to come back to, operations fail with
    :class:`ConnectionLost` once ``reconnect`` seconds have passed, not before."""
    async with running_broker() as broker, proxied(broker.address) as proxy:
        client = await trio.to_thread.run_sync(
            partial(BlockingClient, proxy.url, name="stranded", reconnect=0.5)
        )
        try:
            with trio.socket.socket() as closed:  # a port nobody listens on
                await closed.bind(("127.0.0.1", 0))
                proxy.target = closed.getsockname()[:2]
                cut_at = time.monotonic()  # (the connection is lost after this)
                proxy.cut()

                def publish() -> float:
                    with pytest.raises(ConnectionLost, match=r"could not reconnect within 0\.5 s"):
                        client.publish("void", b"x", timeout=TIMEOUT)
                    return time.monotonic() - cut_at

                waited = await trio.to_thread.run_sync(publish)
            # It tried for its whole window (to within the first backoff wait).
            assert 0.5 - BACKOFF_FIRST <= waited < TIMEOUT
            assert client.closed
            assert not client.reconnecting
        finally:
            await trio.to_thread.run_sync(partial(client.close, flush=False))


async def test_without_reconnect_a_cut_ends_the_client() -> None:
    """The default (``reconnect=0``) keeps the old contract: a cut is final."""
    async with running_broker() as broker, proxied(broker.address) as proxy:
        client = await trio.to_thread.run_sync(partial(BlockingClient, proxy.url, name="once"))
        try:
            proxy.cut()

            def publish_until_it_fails() -> None:
                with pytest.raises(ConnectionLost):
                    for _ in range(1000):
                        client.publish("void", b"x", timeout=TIMEOUT)
                        client.flush(timeout=TIMEOUT)

            await trio.to_thread.run_sync(publish_until_it_fails)
            assert client.closed
            assert client.resumes == 0
        finally:
            await trio.to_thread.run_sync(partial(client.close, flush=False))
