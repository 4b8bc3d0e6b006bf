"""The blocking client against a real broker over loopback.

Every test runs a broker in trio and the blocking client in worker threads
(``trio.to_thread.run_sync``). Every blocking call is given a generous
timeout (``SAFETY``) so that a bug fails a test instead of hanging it.
Ordering comes from events and from the protocol's own round trips, not from
sleeping. Two tests let time pass by design: the heartbeat test idles for
longer than the lease (that is the scenario), and the backpressure test
treats a publish that waited 0.3 s as blocked (its assertions hold whatever
that threshold: a shorter stall only makes the count smaller).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import pytest
import trio
import trio.testing

from broker.client import (
    BlockingClient,
    ClientError,
    ConnectionLost,
    Message,
    connect,
    open_client,
)
from broker.config import BrokerConfig
from broker.protocol import Connection, ConnectionClosed, GoodbyeCode, Headers, Policy, Role
from broker.server import Broker, serve_broker

#: Every blocking call's time limit: only reached when something is broken.
SAFETY = 10.0


@asynccontextmanager
async def running_broker(**overrides: Any) -> AsyncIterator[tuple[Broker, str]]:
    """A broker on a free loopback port, shut down gracefully at the end."""
    config = BrokerConfig(listen="127.0.0.1:0", metrics_listen="", **overrides)
    async with trio.open_nursery() as nursery:
        broker: Broker = await nursery.start(serve_broker, config)
        host, port = broker.address
        yield broker, f"{host}:{port}"
        await broker.shutdown()


@asynccontextmanager
async def blocking_client(url: str, **kwargs: Any) -> AsyncIterator[BlockingClient]:
    """A :class:`BlockingClient` connected and closed from worker threads (never
    from trio's thread, where waiting would stall the broker)."""
    client = await trio.to_thread.run_sync(partial(BlockingClient, url, **kwargs))
    try:
        yield client
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(partial(client.close, flush=False))


def record(i: int) -> tuple[bytes, bytes | None, Headers | None]:
    """Payload, key and headers of message ``i`` (keys and headers vary, sometimes None)."""
    payload = b"payload-%d-" % i + bytes([i % 256]) * (i % 50)
    key = None if i % 3 == 0 else b"key-%d" % (i % 7)
    headers: Headers | None = None if i % 4 == 0 else [("n", b"%d" % i), ("n", b"again")]
    return payload, key, headers


def bound_after_round_trip(reader: BlockingClient) -> int:
    """The subscription handles ``reader`` has bound once a publish is
    confirmed. The Confirm comes after the broker's answer to a FreeHandle and
    the deliveries that were in flight: all processed by then, so a freed
    subscription's handle is deleted unless a delivery was never released."""
    reader.publish("other", b"ping", timeout=SAFETY)
    reader.flush(timeout=SAFETY)
    assert not reader.closed
    return reader._conn.statistics().subscriptions_bound


def check(message: Message, topic: str, i: int) -> None:
    payload, key, headers = record(i)
    assert (message.topic, message.payload, message.key, message.headers) == (
        topic,
        payload,
        key,
        headers,
    )
    assert message.seq == i + 1


async def test_published_messages_reach_an_async_subscriber_in_order() -> None:
    count = 500
    async with (
        running_broker() as (_broker, url),
        open_client(url, name="reader") as reader,
        reader.subscribe("orders") as sub,
    ):

        def publish_all() -> dict[str, int]:
            with BlockingClient(url, name="writer") as client:
                for i in range(count):
                    payload, key, headers = record(i)
                    client.publish("orders", payload, key=key, headers=headers, timeout=SAFETY)
                client.flush(timeout=SAFETY)
                return client.statistics()

        stats = await trio.to_thread.run_sync(publish_all)
        assert stats["published"] == stats["confirmed"] == count
        assert stats["bytes_unsent"] == 0
        with trio.fail_after(SAFETY):
            for i in range(count):
                check(await sub.receive(), "orders", i)


async def test_a_blocking_subscriber_receives_from_a_blocking_publisher() -> None:
    count = 2000  # several times the subscriber's window: consuming must reopen it
    async with running_broker() as (_broker, url):
        subscribed = trio.Event()
        received: list[Message] = []

        def consume() -> None:
            with connect(url, name="subscriber") as reader:
                with reader.subscribe("events", timeout=SAFETY) as sub:
                    trio.from_thread.run_sync(subscribed.set)
                    received.append(sub.receive(timeout=SAFETY))
                    for message in sub:
                        received.append(message)
                        if len(received) == count:
                            break
                    assert reader.statistics()["subscriptions"] == 1
                # Closed: iteration ends, receiving is refused.
                assert list(sub) == []
                with pytest.raises(ClientError):
                    sub.receive(timeout=SAFETY)
                assert reader.statistics()["subscriptions"] == 0

        def publish_all() -> None:
            with BlockingClient(url, name="publisher") as client:
                for i in range(count):
                    payload, key, headers = record(i)
                    client.publish("events", payload, key=key, headers=headers, timeout=SAFETY)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.to_thread.run_sync, consume)
            await subscribed.wait()
            await trio.to_thread.run_sync(publish_all)
        assert len(received) == count
        for i, message in enumerate(received):
            check(message, "events", i)


async def test_subscribe_returns_once_the_broker_routes_to_the_subscription() -> None:
    async with running_broker() as (_broker, url):

        def run() -> list[bytes]:
            with connect(url, name="pub") as writer, connect(url, name="sub") as reader:
                writer.publish("news", b"before", timeout=SAFETY)
                writer.flush(timeout=SAFETY)  # the topic exists and is bound
                payloads = []
                for i in range(5):
                    with reader.subscribe("news", timeout=SAFETY) as sub:
                        # Published (and routed) right after subscribe returned,
                        # while the subscriber's client is not reading.
                        writer.publish("news", b"after %d" % i, timeout=SAFETY)
                        writer.flush(timeout=SAFETY)
                        payloads.append(sub.receive(timeout=SAFETY).payload)
                return payloads

        assert await trio.to_thread.run_sync(run) == [b"after %d" % i for i in range(5)]


async def test_publish_waits_for_a_subscriber_that_does_not_consume() -> None:
    # Small budgets: the publisher may run ahead of the subscriber's consumption
    # by at most the publish channel's buffer, the channel account's high
    # watermark and the subscriber's delivery window (plus a frame or two).
    capacity = high = window = 2048
    size = 200
    frame = size + 8  # a Publish or Deliver frame is a little larger than its payload
    bound = (capacity + high + window) // frame + 4
    total = 10 * bound
    stall = 0.3  # a publish that waits this long counts as blocked

    def payload(i: int) -> bytes:
        return b"%08d" % i + b"." * (size - 8)

    async with running_broker(
        publish_capacity=capacity,
        channel_high_watermark=high,
        channel_low_watermark=high // 2,
        max_frame=1024,
    ) as (_broker, url):
        policy = Policy(deliver_capacity=window)
        async with (
            open_client(url, name="slow", policy=policy) as reader,
            reader.subscribe("flood") as sub,
        ):
            consumed = 0
            pipe_full = trio.Event()
            result: dict[str, Any] = {}

            def publish_all() -> None:
                with BlockingClient(url, name="fast") as client:
                    client.publish("flood", payload(0), timeout=SAFETY)  # binds the topic
                    published = 1
                    while True:
                        try:
                            client.publish_nowait("flood", payload(published))
                        except BlockingIOError:
                            break
                        published += 1
                    result["nowait"] = published
                    try:
                        while published < total:
                            client.publish("flood", payload(published), timeout=stall)
                            published += 1
                    except TimeoutError:
                        pass
                    result["stalled"] = published
                    with pytest.raises(BlockingIOError):
                        client.publish_nowait("flood", payload(published))
                    trio.from_thread.run_sync(pipe_full.set)
                    leads = []
                    while published < total:
                        client.publish("flood", payload(published), timeout=SAFETY)
                        published += 1
                        leads.append(published - consumed)
                    result["max_lead"] = max(leads)
                result["stats"] = client.statistics()  # after the block's flush

            async with trio.open_nursery() as nursery:
                nursery.start_soon(trio.to_thread.run_sync, publish_all)
                with trio.fail_after(SAFETY):
                    await pipe_full.wait()
                assert consumed == 0
                with trio.fail_after(SAFETY):
                    for i in range(total):
                        message = await sub.receive()
                        assert message.payload == payload(i)
                        consumed += 1
        assert 1 <= result["nowait"] <= result["stalled"] <= bound < total
        assert result["max_lead"] <= bound
        # Leaving the client's block flushed: every message was routed.
        assert result["stats"]["published"] == result["stats"]["confirmed"] == total


async def test_publish_nowait_refuses_before_the_topic_has_guarantees() -> None:
    async with running_broker() as (_broker, url):

        def run() -> dict[str, int]:
            with BlockingClient(url) as client:
                # The topic's guarantees come only after the broker processed
                # its bind, which cannot have happened yet.
                with pytest.raises(BlockingIOError):
                    client.publish_nowait("fresh", b"x")
                assert client.statistics()["published"] == 0
                client.publish("fresh", b"y", timeout=SAFETY)
                client.publish_nowait("fresh", b"z")
                client.flush(timeout=SAFETY)
                return client.statistics()

        stats = await trio.to_thread.run_sync(run)
        assert stats["published"] == stats["confirmed"] == 2


async def test_publishes_are_batched_until_a_flush() -> None:
    # A long heartbeat keeps the heartbeat thread from writing during the test.
    async with running_broker(heartbeat=60.0, lease=180.0) as (_broker, url):

        def run() -> tuple[int, int, int]:
            with BlockingClient(url) as client:
                client.publish("batch", b"first", timeout=SAFETY)
                client.flush(timeout=SAFETY)
                for _ in range(10):
                    client.publish("batch", b"small", timeout=SAFETY)
                small = client.statistics()["bytes_unsent"]
                for _ in range(100):
                    client.publish("batch", b"B" * 1000, timeout=SAFETY)
                large = client.statistics()["bytes_unsent"]
                client.flush(timeout=SAFETY)
                return small, large, client.statistics()["bytes_unsent"]

        small, large, flushed = await trio.to_thread.run_sync(run)
        assert small > 0  # ten small publishes were not written one by one...
        assert large < 64 * 1024 + 1100  # ...but output is written past the threshold
        assert flushed == 0


async def test_closing_a_subscription_frees_it_and_releases_its_deliveries() -> None:
    window = 2048
    async with running_broker(
        publish_capacity=2048,
        channel_high_watermark=2048,
        channel_low_watermark=1024,
        max_frame=1024,
    ) as (broker, url):
        total = 500  # far beyond what an unconsumed subscription lets through
        async with (
            blocking_client(url, name="quitter", policy=Policy(deliver_capacity=window)) as reader,
            blocking_client(url, name="publisher") as writer,
        ):
            sub = await trio.to_thread.run_sync(partial(reader.subscribe, "t", timeout=SAFETY))
            pipe_full = threading.Event()

            def publish_all() -> int:
                writer.publish("t", b"0" * 200, timeout=SAFETY)
                published = 1
                while True:
                    try:
                        writer.publish_nowait("t", b"%d" % published + b"." * 200)
                    except BlockingIOError:
                        break
                    published += 1
                pipe_full.set()
                while published < total:  # completes only once the subscription is gone
                    writer.publish("t", b"%d" % published + b"." * 200, timeout=SAFETY)
                    published += 1
                writer.flush(timeout=SAFETY)
                return writer.statistics()["confirmed"]

            def take_one_and_quit() -> None:
                assert pipe_full.wait(SAFETY)
                assert sub.receive(timeout=SAFETY).payload == b"0" * 200
                sub.close()
                sub.close()  # idempotent

            async with trio.open_nursery() as nursery:
                nursery.start_soon(trio.to_thread.run_sync, take_one_and_quit)
                confirmed = await trio.to_thread.run_sync(publish_all)
            assert confirmed == total
            assert broker.statistics().subscriptions == 0

            assert await trio.to_thread.run_sync(bound_after_round_trip, reader) == 0


async def test_connection_lost_when_the_broker_shuts_down() -> None:
    async with running_broker() as (broker, url), blocking_client(url) as client:
        waiting = trio.Event()

        def wait_for_a_message() -> ConnectionLost:
            sub = client.subscribe("quiet", timeout=SAFETY)
            client.publish("quiet", b"sent before", timeout=SAFETY)
            client.flush(timeout=SAFETY)
            assert next(sub).payload == b"sent before"
            trio.from_thread.run_sync(waiting.set)
            with pytest.raises(ConnectionLost) as info:
                sub.receive(timeout=SAFETY)
            with pytest.raises(ConnectionLost):
                next(sub)  # not the normal end of the stream
            return info.value

        async def shut_down() -> None:
            await waiting.wait()
            await broker.shutdown()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(shut_down)
            error = await trio.to_thread.run_sync(wait_for_a_message)
        assert error.code == GoodbyeCode.SHUTTING_DOWN
        assert client.closed

        def later_calls() -> None:
            for call in (
                lambda: client.publish("quiet", b"late", timeout=SAFETY),
                lambda: client.flush(timeout=SAFETY),
                lambda: client.subscribe("quiet", timeout=SAFETY),
            ):
                with pytest.raises(ConnectionLost) as info:
                    call()
                assert info.value.code == GoodbyeCode.SHUTTING_DOWN
            client.close()  # quiet: everything published was confirmed
            client.close()

        await trio.to_thread.run_sync(later_calls)


async def test_leaving_the_block_raises_if_the_broker_left_before_confirming() -> None:
    async with running_broker() as (broker, url), trio.open_nursery() as nursery:

        async def begin_shutdown() -> None:
            nursery.start_soon(broker.shutdown)
            await trio.testing.wait_all_tasks_blocked()  # Goodbye 5 is on its way

        def run() -> tuple[BlockingClient, ConnectionLost]:
            with pytest.raises(ConnectionLost) as info, BlockingClient(url) as client:
                for i in range(3):
                    client.publish("gone", b"%d" % i, timeout=SAFETY)  # batched, unsent
                trio.from_thread.run(begin_shutdown)
            return client, info.value

        client, error = await trio.to_thread.run_sync(run)
        assert error.code == GoodbyeCode.SHUTTING_DOWN
        assert client.closed
        stats = client.statistics()
        assert (stats["published"], stats["confirmed"]) == (3, 0)


async def test_leaving_the_block_flushes_but_not_on_an_exception() -> None:
    count = 200
    async with (
        running_broker() as (_broker, url),
        open_client(url, name="reader") as reader,
        reader.subscribe("exit") as sub,
    ):

        def normal_exit() -> BlockingClient:
            with BlockingClient(url) as client:
                for i in range(count):
                    client.publish("exit", b"%d" % i, timeout=SAFETY)
            return client

        def failing_exit() -> BlockingClient:
            with pytest.raises(RuntimeError), BlockingClient(url) as client:
                client.publish("exit", b"doomed", timeout=SAFETY)
                client.publish("exit", b"doomed", timeout=SAFETY)
                raise RuntimeError("the block fails")
            return client

        flushed = await trio.to_thread.run_sync(normal_exit)
        stats = flushed.statistics()
        assert flushed.closed
        assert stats["published"] == stats["confirmed"] == count
        with trio.fail_after(SAFETY):
            for i in range(count):
                assert (await sub.receive()).payload == b"%d" % i

        abandoned = await trio.to_thread.run_sync(failing_exit)
        assert abandoned.closed
        assert abandoned.statistics()["published"] == 2
        assert abandoned.statistics()["confirmed"] == 0  # nobody waited for the broker


async def test_heartbeats_keep_an_idle_client_connected() -> None:
    async with running_broker(heartbeat=0.25, lease=1.5) as (broker, url):

        def idle() -> tuple[dict[str, int], dict[str, int]]:
            with BlockingClient(url) as client:
                before = client.statistics()
                # Idle for longer than the lease: only the heartbeat thread
                # talks to the broker meanwhile.
                threading.Event().wait(3.0)
                after = client.statistics()
                assert not client.closed
                client.publish("alive", b"still here", timeout=SAFETY)
                client.flush(timeout=SAFETY)
                return before, after

        before, after = await trio.to_thread.run_sync(idle)
        assert after["bytes_received"] > before["bytes_received"]  # pings read
        assert after["bytes_sent"] > before["bytes_sent"]  # pongs and pings sent
        assert broker.statistics().connections == 0


async def test_a_silent_broker_is_given_up_after_its_lease() -> None:
    goodbyes: list[int] = []

    async def silent_broker(stream: trio.SocketStream) -> None:
        # Welcomes the client with a short lease, then neither sends nor reads.
        conn = Connection(Role.BROKER, now=trio.current_time())
        while conn.hello_message is None:
            conn.receive_data(await stream.receive_some(), trio.current_time())
        conn.welcome(session=bytes(16), epoch=bytes(8), lease_ms=300, heartbeat_ms=100)
        await stream.send_all(conn.data_to_send())
        await silence.wait()
        while data := await stream.receive_some():  # what the client said meanwhile
            for event in conn.receive_data(data, trio.current_time()):
                if isinstance(event, ConnectionClosed):
                    goodbyes.append(event.code)
                    said_goodbye.set()

    silence = trio.Event()
    said_goodbye = trio.Event()
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, silent_broker, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]

        def run() -> ConnectionLost:
            with pytest.raises(ConnectionLost) as info, BlockingClient(f"127.0.0.1:{port}") as c:
                c.publish("t", b"never gets guarantees", timeout=SAFETY)
            return info.value

        error = await trio.to_thread.run_sync(run)
        silence.set()
        assert "lease expired" in str(error)
        with trio.fail_after(SAFETY):
            await said_goodbye.wait()
        nursery.cancel_scope.cancel()
    assert goodbyes == [GoodbyeCode.LEASE_EXPIRED]


async def test_timeouts_and_empty_subscriptions() -> None:
    async with running_broker() as (_broker, url):

        def run() -> None:
            with BlockingClient(url) as client, client.subscribe("nothing") as sub:
                with pytest.raises(BlockingIOError):
                    sub.receive_nowait()
                with pytest.raises(TimeoutError):
                    sub.receive(timeout=0.05)
                client.publish("nothing", b"now something", timeout=SAFETY)
                assert sub.receive(timeout=SAFETY).payload == b"now something"
                assert not client.closed

        await trio.to_thread.run_sync(run)


async def test_connect_failures_raise_connection_lost() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nothing listens here once the probe closes

    def refused() -> None:
        with pytest.raises(ConnectionLost):
            BlockingClient(f"127.0.0.1:{port}", connect_timeout=SAFETY)

    await trio.to_thread.run_sync(refused)

    async with running_broker(max_connections=1) as (_broker, url):

        def one_too_many() -> int | None:
            with BlockingClient(url, name="first"):
                with pytest.raises(ConnectionLost) as info:
                    BlockingClient(url, name="second", connect_timeout=SAFETY)
                return info.value.code

        assert await trio.to_thread.run_sync(one_too_many) == GoodbyeCode.LIMIT_EXCEEDED
