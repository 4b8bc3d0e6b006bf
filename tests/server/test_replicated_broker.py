"""A broker in cluster mode over streams in memory (``run_streams``): what it
confirms is in the topics' streams, a broker started on an empty data
directory over the same streams serves every record (the front end keeps
no data), and while a stream does not take runs nothing is confirmed and
nothing is lost. The same over a real JetStream cluster: ``tests/nats``."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from broker.client import open_client
from broker.errors import BrokerError
from broker.log import encode_run
from broker.protocol.frames import encode_deliver_tail
from broker.server.storage import _replication as replication

from .helpers import running_broker, url, wait_until
from .run_streams import MemoryStreams

#: Hang guard (seconds).
DEADLINE = 60


async def _publish(address: str, topic: str, payloads: list[bytes]) -> None:
    async with open_client(address, name="pub") as client:
        for payload in payloads:
            await client.publish(topic, payload)
        await client.flush()


async def _read(address: str, topic: str, count: int) -> list[tuple[int, bytes]]:
    got: list[tuple[int, bytes]] = []
    async with (
        open_client(address, name="reader") as client,
        client.subscribe(topic, options={"from": "earliest"}) as subscription,
    ):
        async for message in subscription:
            got.append((message.seq, message.payload))
            if len(got) == count:
                break
    return got


async def test_records_outlive_the_front_end_and_its_disk(tmp_path: Path) -> None:
    streams = MemoryStreams()
    payloads = [b"record %d" % i for i in range(300)]
    with trio.fail_after(DEADLINE):
        async with running_broker(data_dir=str(tmp_path / "a"), streams=streams) as broker:
            await _publish(url(broker), "orders", payloads[:200])
            await _publish(url(broker), "other", [b"x"])
        stream = streams.streams["orders"]
        assert sum(m.count for m in stream.messages) == 200  # (confirmed: in the stream)
        # Another front end, on a data directory of its own.
        async with running_broker(data_dir=str(tmp_path / "b"), streams=streams) as broker:
            await _publish(url(broker), "orders", payloads[200:])
            got = await _read(url(broker), "orders", 300)
            assert await _read(url(broker), "other", 1) == [(1, b"x")]
    assert got == list(enumerate(payloads, start=1))


async def test_nothing_is_confirmed_while_the_stream_fails(tmp_path: Path) -> None:
    streams = MemoryStreams()
    with trio.fail_after(DEADLINE):
        async with running_broker(data_dir=str(tmp_path / "a"), streams=streams) as broker:
            await _publish(url(broker), "t", [b"first"])
            stream = streams.streams["t"]
            # The next runs fail: twice before being stored, once after.
            stream.failures = ["before", "before", "after"]
            async with open_client(url(broker), name="pub") as client:
                await client.publish("t", b"second")
                await client.flush()  # (returns once stored, after the resends)
            assert stream.publishes >= 5
            assert stream.failures == []
            got = await _read(url(broker), "t", 2)
    assert got == [(1, b"first"), (2, b"second")]
    assert [(m.first_offset, m.count) for m in stream.messages] == [(1, 1), (2, 1)]


async def test_a_new_leader_has_the_unanswered_runs_sent_again_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A run the old leader took with it is never answered (no timeout in
    # this engine): only the news of the new leader gets it sent again.
    monkeypatch.setattr(replication, "NEW_STREAM_QUIET", 0.0)
    streams = MemoryStreams()
    with trio.fail_after(DEADLINE):
        async with running_broker(data_dir=str(tmp_path / "a"), streams=streams) as broker:
            await _publish(url(broker), "t", [b"first"])
            stream = streams.streams["t"]
            stream.failures = ["unanswered"]
            async with open_client(url(broker), name="pub") as client:
                await client.publish("t", b"second")
                await wait_until(lambda: stream.failures == [], what="the run sent")
                streams.elect("t")
                await client.flush()  # (returns once stored)
            got = await _read(url(broker), "t", 2)
    assert got == [(1, b"first"), (2, b"second")]
    assert [(m.first_offset, m.count) for m in stream.messages] == [(1, 1), (2, 1)]


async def test_a_deleted_topic_loses_its_stream(tmp_path: Path) -> None:
    streams = MemoryStreams()
    with trio.fail_after(DEADLINE):
        async with running_broker(data_dir=str(tmp_path / "a"), streams=streams) as broker:
            await _publish(url(broker), "gone", [b"a", b"b"])
            async with open_client(url(broker), name="admin") as client:
                await client.admin("delete-topic", topic="gone")
            await wait_until(lambda: "gone" not in streams.streams, what="the stream deleted")
            await _publish(url(broker), "gone", [b"new"])
            assert await _read(url(broker), "gone", 1) == [(1, b"new")]
    assert [m.first_offset for m in streams.streams["gone"].messages] == [1]


async def test_a_damaged_stream_is_set_aside_and_the_others_served(tmp_path: Path) -> None:
    streams = MemoryStreams()
    good = await streams.open_stream("good")
    tails = [encode_deliver_tail(b"a", None, None), encode_deliver_tail(b"b", None, None)]
    good.append_foreign(1, 2, encode_run(1, tails, [1000, 1000]))
    bad = await streams.open_stream("bad")
    damaged = bytearray(encode_run(1, [b"x"], [1000]))
    damaged[-1] ^= 1
    bad.append_foreign(1, 1, bytes(damaged))
    with trio.fail_after(DEADLINE):
        async with running_broker(data_dir=str(tmp_path / "a"), streams=streams) as broker:
            assert await _read(url(broker), "good", 2) == [(1, b"a"), (2, b"b")]
            with pytest.raises(BrokerError, match="stream cannot be read"):
                await _publish(url(broker), "bad", [b"y"])
            assert bad.messages[0].body == bytes(damaged)  # (kept as it was)
            async with open_client(url(broker), name="admin") as client:
                await client.admin("delete-topic", topic="bad")
            await wait_until(lambda: "bad" not in streams.streams, what="the stream deleted")
            await _publish(url(broker), "bad", [b"afresh"])
            assert await _read(url(broker), "bad", 1) == [(1, b"afresh")]


async def test_the_topic_cap_counts_the_topics_this_front_end_writes(tmp_path: Path) -> None:
    """``cluster_max_topics`` (docs/operations.md, cluster mode's sizing):
    one topic more than it is refused in one line; a restore takes every
    topic the streams hold, past it too (a front end that took over the
    topics of one that left), and then refuses new ones."""
    streams = MemoryStreams()
    tails = [encode_deliver_tail(b"theirs", None, None)]
    with trio.fail_after(DEADLINE):
        async with running_broker(
            data_dir=str(tmp_path / "a"), streams=streams, cluster_max_topics=2
        ) as broker:
            await _publish(url(broker), "a", [b"1"])
            await _publish(url(broker), "b", [b"1"])
            with pytest.raises(BrokerError, match="cluster_max_topics"):
                await _publish(url(broker), "c", [b"1"])
        # Another front end (with its own share of the topics) made one more.
        other = await streams.open_stream("c")
        other.append_foreign(1, 1, encode_run(1, tails, [1000]))
        async with running_broker(
            data_dir=str(tmp_path / "b"), streams=streams, cluster_max_topics=2
        ) as broker:
            assert await _read(url(broker), "c", 1) == [(1, b"theirs")]
            with pytest.raises(BrokerError, match="cluster_max_topics"):
                await _publish(url(broker), "d", [b"1"])
