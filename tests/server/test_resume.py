"""Sessions over real TCP: resume after a broken connection loses and
duplicates nothing; a broker restart is noticed and subscriptions come back.

The connections go through :class:`tests.proxy.CuttableProxy`, which the tests cut at
random points (both directions at once, data in flight lost), exactly what a
network failure does to a client and a broker.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Any

import pytest
import trio

from broker.client import open_client
from broker.config import BrokerConfig
from broker.server import Broker
from tests.proxy import cut_on_progress, proxied

from .helpers import TIMEOUT, make_config, running_broker, wait_idle, wait_until

TOPICS = ("alpha", "beta")


@pytest.mark.parametrize("logs", [False, True], ids=["memory-only", "topic-logs"])
async def test_cut_connections_resume_without_loss_or_duplicates(
    tmp_path: Path, logs: bool
) -> None:
    """Two topics, 3000 messages each, published and consumed through a
    proxy cut at random moments: each subscriber sees every message exactly
    once, in order, and no session is ever lost (with topic logs: the
    subscriptions' sequence numbers are the records' offsets)."""
    count = 3000
    rng = random.Random(20261124)
    received: dict[str, list[int]] = {topic: [] for topic in TOPICS}
    offsets: dict[str, list[int]] = {topic: [] for topic in TOPICS}
    data_dir = str(tmp_path) if logs else ""
    async with (
        running_broker(heartbeat=0.5, lease=5.0, data_dir=data_dir) as broker,
        proxied(broker.address) as proxy,
    ):
        async with (
            open_client(proxy.url, name="pub", reconnect=TIMEOUT) as publisher,
            open_client(proxy.url, name="sub", reconnect=TIMEOUT) as subscriber,
            subscriber.subscribe("alpha") as alpha,
            subscriber.subscribe("beta") as beta,
        ):
            subscriptions = {"alpha": alpha, "beta": beta}

            async def consume(topic: str) -> None:
                with trio.fail_after(4 * TIMEOUT):
                    while len(received[topic]) < count:
                        message = await subscriptions[topic].receive()
                        received[topic].append(int(message.payload))
                        offsets[topic].append(message.seq)

            async def cut_now_and_then() -> None:
                # Each cut waits for 50 more messages received since the last.
                await cut_on_progress(
                    proxy,
                    lambda: sum(len(r) for r in received.values()),
                    lambda: all(len(r) == count for r in received.values()),
                    step=50,
                    pause=lambda: rng.uniform(0.0, 0.02),
                )

            async with trio.open_nursery() as nursery:
                for topic in TOPICS:
                    nursery.start_soon(consume, topic)
                nursery.start_soon(cut_now_and_then)
                with trio.fail_after(4 * TIMEOUT):
                    for i in range(count):
                        if i and i % (count // 4) == 0:
                            proxy.cut()  # three cuts of its own, whatever the timing
                        for topic in TOPICS:
                            await publisher.publish(topic, b"%d" % i)
                    await publisher.flush()
            stats = publisher.statistics(), subscriber.statistics()
        for topic in TOPICS:
            assert received[topic] == list(range(count)), topic
            if logs:
                assert offsets[topic] == list(range(1, count + 1)), topic
        assert proxy.cuts >= 3
        assert all(s["sessions_lost"] == 0 for s in stats)
        assert sum(s["resumes"] for s in stats) >= 2
        # (A resume whose Welcome was cut off is tried again: counted twice here.)
        assert broker.sessions.resumed_total >= sum(s["resumes"] for s in stats)
        await wait_idle(broker)
        assert broker.sessions.sessions == {}


@pytest.mark.parametrize("logs", [False, True], ids=["memory-only", "topic-logs"])
async def test_a_broker_restart_is_noticed_and_subscriptions_come_back(
    tmp_path: Path, logs: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """The client's broker goes away (Goodbye 5); the proxy now leads to a new
    broker that has never heard of the session: the client says so (callback,
    counter, a warning that is true of that broker) and subscribes again, and
    new messages reach it."""
    lost: list[str] = []
    caplog.set_level(logging.WARNING, logger="broker")
    async with (
        running_broker(data_dir=str(tmp_path) if logs else "") as second,
        running_broker() as first,
        proxied(first.address) as proxy,
        open_client(
            proxy.url, name="sub", reconnect=TIMEOUT, on_session_lost=lambda: lost.append("sub")
        ) as client,
        client.subscribe("news") as subscription,
    ):
        await client.publish("news", b"before")
        assert (await subscription.receive()).payload == b"before"
        proxy.target = second.address
        await first.shutdown()  # Goodbye 5: the client reconnects, to `second`
        # (The counter moves first, then the callback runs and the client
        # subscribes again: wait for all three.)
        await wait_until(
            lambda: (
                client.sessions_lost == 1
                and lost == ["sub"]
                and second.statistics().subscriptions == 1
            ),
            what="the session lost, reported and subscribed again",
        )
        assert client.resumes == 0
        await client.publish("news", b"after")
        with trio.fail_after(TIMEOUT):
            message = await subscription.receive()
        assert (message.payload, message.seq) == (b"after", 1)
    await wait_idle(second)
    (warning,) = [r.getMessage() for r in caplog.records if "lost our session" in r.getMessage()]
    if logs:  # (it used to say "not delivered to us" of messages then delivered)
        assert warning.endswith(
            "reliable subscriptions go on from the topic logs after the "
            "last message processed; others miss what was published meanwhile"
        )
    else:
        assert warning.endswith("messages published meanwhile were not delivered to us")


async def serve_until(
    config: BrokerConfig, stop: trio.Event, stopped: trio.Event, *, task_status: Any
) -> None:
    """Run a broker until ``stop`` is set; then stop it gracefully and set ``stopped``."""
    async with running_broker(config) as broker:
        task_status.started(broker)
        await stop.wait()
    stopped.set()


async def test_with_a_data_directory_a_session_is_resumed_after_a_broker_restart(
    tmp_path: Path,
) -> None:
    """The broker stops (Goodbye 5) and starts again on the same data
    directory: the client resumes its session (no session lost), gets what
    it had not processed, and its subscription goes on with the next offset."""
    config = make_config(data_dir=str(tmp_path), heartbeat=0.5, lease=10.0)
    stop, stopped = trio.Event(), trio.Event()
    async with trio.open_nursery() as nursery, proxied(("127.0.0.1", 9)) as proxy:
        first: Broker = await nursery.start(serve_until, config, stop, stopped)
        proxy.target = first.address
        async with (
            open_client(proxy.url, name="sub", reconnect=TIMEOUT) as client,
            client.subscribe("news") as subscription,
        ):
            for i in range(5):
                await client.publish("news", b"%d" % i)
            await client.flush()
            with trio.fail_after(TIMEOUT):
                got = [await subscription.receive() for _ in range(3)]
                stop.set()  # a graceful stop: Goodbye 5
                await stopped.wait()
            second: Broker = await nursery.start(serve_until, config, trio.Event(), trio.Event())
            proxy.target = second.address
            with trio.fail_after(TIMEOUT):
                got += [await subscription.receive() for _ in range(2)]
                await client.publish("news", b"after")
                got.append(await subscription.receive())
            stats = client.statistics()
        assert [(m.payload, m.seq) for m in got] == [
            *[(b"%d" % i, i + 1) for i in range(5)],
            (b"after", 6),
        ]
        assert stats["sessions_lost"] == 0
        assert stats["resumes"] >= 1
        assert second.sessions.resumed_total >= 1
        nursery.cancel_scope.cancel()


async def test_with_a_data_directory_an_idle_session_is_resumed_after_a_broker_restart(
    tmp_path: Path,
) -> None:
    """A session that never bound a handle (a cluster client's connection to
    a worker that owns none of its topics) is recorded too: after a graceful
    restart on the same data directory its client resumes it; the broker
    does not call it unknown."""
    config = make_config(data_dir=str(tmp_path), heartbeat=0.5, lease=10.0)
    stop, stopped = trio.Event(), trio.Event()
    async with trio.open_nursery() as nursery, proxied(("127.0.0.1", 9)) as proxy:
        first: Broker = await nursery.start(serve_until, config, stop, stopped)
        proxy.target = first.address
        async with open_client(proxy.url, name="idle", reconnect=TIMEOUT) as client:
            with trio.fail_after(TIMEOUT):
                stop.set()  # a graceful stop: Goodbye 5
                await stopped.wait()
            second: Broker = await nursery.start(serve_until, config, trio.Event(), trio.Event())
            proxy.target = second.address
            await wait_until(lambda: client.resumes + client.sessions_lost >= 1, what="a resume")
            stats = client.statistics()
        assert stats["sessions_lost"] == 0
        assert stats["resumes"] == 1
        assert second.sessions.resumed_total == 1
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("subscriptions", "retained", "said"),
    [
        (0, 2, "publishing 2 unconfirmed message(s) again"),
        (0, 0, "publishing 0 unconfirmed message(s) again"),
        (1, 0, "subscribing again to 1 topic(s); messages published meanwhile were not"),
    ],
)
def test_a_lost_session_is_said_of_what_the_client_does(
    caplog: pytest.LogCaptureFixture, subscriptions: int, retained: int, said: str
) -> None:
    """A publisher was told of "subscribing again to 0 topic(s)" and of
    messages "not delivered to us"."""
    from types import SimpleNamespace

    from broker.client._resume import log_session_lost

    state = SimpleNamespace(
        subscriptions=dict.fromkeys(range(subscriptions)),
        retained={1: (None, [b""] * retained)} if retained else {},
    )
    caplog.set_level(logging.WARNING, logger="broker")
    log_session_lost("pub", state, offsets=False)  # type: ignore[arg-type]
    (warning,) = [r.getMessage() for r in caplog.records]
    assert warning.startswith("pub: the broker lost our session (it restarted, or the ")
    assert said in warning
    assert ("delivered" in warning) == bool(subscriptions)
