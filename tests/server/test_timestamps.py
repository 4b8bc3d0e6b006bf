"""Record times on deliveries (Subscribe option ``"timestamps"``): a
reliable subscription on a broker with topic logs that asks gets every
delivery as a DeliverTimed carrying the time its log stored with the
record, replayed and live alike; everybody else gets what they got before,
and a broker that cannot serve it refuses it with a Goodbye naming it."""

from __future__ import annotations

import os
import signal
import time
from contextlib import ExitStack
from pathlib import Path

import pytest
import trio

from broker.client import BlockingClient, BlockingClusterClient, ClientError, open_client
from broker.client._common import Message
from broker.log import TopicLog
from broker.protocol import (
    BindTopic,
    Channel,
    ChannelKind,
    Deliver,
    DeliverMany,
    DeliverTimed,
    GoodbyeCode,
    IssueGuarantee,
    Subscribe,
)
from broker.server import Broker
from tests.measure._process import free_port

from .helpers import TIMEOUT, RawClient, make_config, running_broker, url, wait_until
from .test_log_crash_sessions import broker_process
from .test_log_crash_sessions import publish as publish_t
from .test_topic_log import goodbye_for, log_config, publish, take


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def topic_log(broker: Broker, topic: str = "t") -> TopicLog:
    """The log of ``topic`` (the broker keeps it open: the same object its topic writes)."""
    assert broker.logs is not None
    return broker.logs.open(topic)


def assert_stored_times(broker: Broker, got: list[Message], earliest: int, latest: int) -> None:
    """Each message carries the time the log stored with its record, within
    the test's run, never decreasing."""
    offsets = [m.offset for m in got]
    assert None not in offsets
    stamps = [m.timestamp for m in got]
    assert None not in stamps
    log = topic_log(broker)
    assert stamps == [log.times(offset, 1)[0] for offset in offsets]  # type: ignore[arg-type]
    assert stamps == sorted(stamps)  # type: ignore[type-var]
    assert earliest <= stamps[0] and stamps[-1] <= latest  # type: ignore[operator]


async def test_replayed_and_live_records_carry_their_stored_times(tmp_path: Path) -> None:
    async with running_broker(log_config(tmp_path)) as broker:
        address = url(broker)
        before = now_ms()
        await publish(address, "t", [b"old%d" % i for i in range(1, 301)])
        async with (
            open_client(address, name="reader") as client,
            client.subscribe("t", start="earliest", timestamps=True) as sub,
        ):
            replayed = await take(sub, 300)
            assert [m.payload for m in replayed][:2] == [b"old1", b"old2"]
            await publish(address, "t", [b"new%d" % i for i in range(1, 51)])
            live = await take(sub, 50)
        after = now_ms()
        assert [m.offset for m in replayed + live] == list(range(1, 351))
        assert live[0].payload == b"new1"
        assert_stored_times(broker, replayed + live, before, after)


async def test_a_live_subscription_at_the_end_gets_times_too(tmp_path: Path) -> None:
    async with running_broker(log_config(tmp_path)) as broker:
        address = url(broker)
        before = now_ms()
        async with (
            open_client(address, name="reader") as client,
            client.subscribe("t", options={"timestamps": True}) as sub,
        ):
            for i in range(5):  # one at a time: each goes out as it is appended
                await publish(address, "t", [b"m%d" % i])
            got = await take(sub, 5)
        assert_stored_times(broker, got, before, now_ms())


async def test_without_the_option_nothing_changes(tmp_path: Path) -> None:
    async with running_broker(log_config(tmp_path)) as broker:
        address = url(broker)
        await publish(address, "t", [b"x"] * 20)
        async with (
            open_client(address, name="reader") as client,
            client.subscribe("t", start="earliest") as plain,
            client.subscribe("t", start="earliest", timestamps=False) as said_no,
        ):
            for sub in (plain, said_no):
                got = await take(sub, 20)
                assert [m.offset for m in got] == list(range(1, 21))
                assert {m.timestamp for m in got} == {None}


async def raw_subscriber(broker: Broker, options: dict[str, object]) -> RawClient:
    raw = await RawClient.connect(broker)
    await raw.handshake("raw")
    await raw.send(BindTopic("t"), Subscribe(0, "reliable", options))  # type: ignore[arg-type]
    await wait_until(
        lambda: "t" in broker.topics and bool(broker.topics["t"].subscriptions), what="subscribed"
    )
    return raw


@pytest.mark.parametrize("timestamps", [True, False])
async def test_on_the_wire_only_a_subscription_that_asked_gets_deliver_timed(
    tmp_path: Path, timestamps: bool
) -> None:
    async with running_broker(log_config(tmp_path)) as broker:
        await publish(url(broker), "t", [b"r%d" % i for i in range(1, 101)])
        raw = await raw_subscriber(broker, {"from": "earliest", "timestamps": timestamps})
        async with trio.open_nursery() as nursery:
            raw.start_reading(nursery)
            await raw.send(IssueGuarantee(Channel(ChannelKind.DELIVER, 0), 1 << 20))

            def received() -> int:
                return sum(
                    len(m.entries) if isinstance(m, DeliverMany) else 1
                    for m in raw.frames
                    if isinstance(m, Deliver | DeliverMany)
                )

            await wait_until(lambda: received() == 100, what="100 deliveries")
            nursery.cancel_scope.cancel()
        await raw.aclose()
        deliveries = [m for m in raw.frames if isinstance(m, Deliver | DeliverMany)]
        if not timestamps:
            assert not any(isinstance(m, DeliverTimed) for m in deliveries)
            return
        assert all(isinstance(m, DeliverTimed) for m in deliveries), deliveries[:3]
        timed = [m for m in deliveries if isinstance(m, DeliverTimed)]
        assert timed[0].first_seq == 1
        assert [t for m in timed for t in m.times] == topic_log(broker).times(1, 100)


@pytest.mark.parametrize(
    ("options", "mode", "words"),
    [
        ({"timestamps": 1}, "reliable", '"timestamps" must be true or false'),
        ({"timestamps": "yes"}, "reliable", '"timestamps" must be true or false'),
        ({"timestamps": True}, "lossy", "timestamps"),
        ({"timestamps": True}, "latest", "timestamps"),
    ],
)
async def test_bad_or_misplaced_timestamps_are_refused(
    tmp_path: Path, options: dict[str, object], mode: str, words: str
) -> None:
    async with running_broker(log_config(tmp_path)) as broker:
        raw = await RawClient.connect(broker)
        goodbye = await goodbye_for(raw, Subscribe(0, mode, options))  # type: ignore[arg-type]
        await raw.aclose()
    assert goodbye.code == GoodbyeCode.PROTOCOL_ERROR
    assert words in goodbye.reason


async def test_a_memory_only_broker_refuses_timestamps() -> None:
    async with running_broker(make_config()) as broker:
        raw = await RawClient.connect(broker)
        goodbye = await goodbye_for(raw, Subscribe(0, "reliable", {"timestamps": True}))
        await raw.aclose()
        assert goodbye.code == GoodbyeCode.PROTOCOL_ERROR
        assert "timestamps" in goodbye.reason and "memory-only" in goodbye.reason
        # The client says so before sending anything, and stays connected.
        async with open_client(url(broker)) as client:
            with pytest.raises(ClientError, match="no record times"):
                async with client.subscribe("t", timestamps=True):
                    pass  # pragma: no cover
            with pytest.raises(ValueError, match="timestamps= needs mode='reliable'"):
                async with client.subscribe("t", mode="lossy", timestamps=True):
                    pass  # pragma: no cover
            async with client.subscribe("t", options={"timestamps": False}) as sub:
                await client.publish("t", b"plain")
                (message,) = await take(sub, 1)
            assert message.timestamp is None and message.offset is None


async def test_the_blocking_and_cluster_clients_ask_for_times(tmp_path: Path) -> None:
    async with running_broker(log_config(tmp_path)) as broker:
        address = url(broker)
        before = now_ms()
        await publish(address, "t", [b"b%d" % i for i in range(1, 11)])

        def read() -> tuple[list[Message], list[Message]]:
            with BlockingClient(address) as client, BlockingClusterClient(address) as cluster:
                with client.subscribe("t", start=1, timestamps=True, timeout=TIMEOUT) as sub:
                    mine = [sub.receive(timeout=TIMEOUT) for _ in range(10)]
                with cluster.subscribe("t", start=1, timestamps=True, timeout=TIMEOUT) as sub:
                    theirs = [sub.receive(timeout=TIMEOUT) for _ in range(10)]
                return mine, theirs

        mine, theirs = await trio.to_thread.run_sync(read)
        after = now_ms()
        assert [m.timestamp for m in mine] == [m.timestamp for m in theirs]
        assert_stored_times(broker, mine, before, after)


async def test_a_session_restored_after_kill_9_still_gets_times(tmp_path: Path) -> None:
    """The subscription a restarted broker restores from its data directory
    keeps asking for times, and the times are those stored before the kill."""
    port = free_port()
    address = f"127.0.0.1:{port}"
    got: list[Message] = []
    with ExitStack() as brokers:  # (the second broker outlives the client)
        process = brokers.enter_context(broker_process(port, tmp_path))
        await publish_t(address, [b"%d" % i for i in range(1, 101)])
        async with (
            open_client(address, name="sub", reconnect=4 * TIMEOUT) as client,
            client.subscribe("t", start="earliest", timestamps=True) as subscription,
        ):
            got += await take(subscription, 50)
            os.kill(process.pid, signal.SIGKILL)
            await trio.to_thread.run_sync(process.wait)
            brokers.enter_context(broker_process(port, tmp_path))
            with trio.fail_after(4 * TIMEOUT):
                got += await take(subscription, 50)
            resumes = client.statistics()["resumes"]
        async with (
            open_client(address, name="again") as client,
            client.subscribe("t", start="earliest", timestamps=True) as fresh,
        ):
            again = await take(fresh, 100)
    assert resumes >= 1
    assert [m.offset for m in got] == list(range(1, 101))
    assert [m.timestamp for m in got] == [m.timestamp for m in again]
    assert None not in [m.timestamp for m in got]
