"""Durable cursors kept in the cluster (``storage/_cluster_cursors.py``,
written by ``storage/_kv_state.py``), over a bucket in memory with
JetStream KV's compare-and-set: positions are written late and coalesced,
a bucket that does not answer is asked again, a write refused because
another front end wrote the key keeps the larger position, a deletion
removes only this front end's own value (never what another front end
wrote since), a front end reads only the cursors of the topics it owns;
and a cursor continues where it was acknowledged on a broker with
another disk.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from broker.client import open_client
from broker.server import Broker, serve_broker
from broker.server.storage._cluster_cursors import ClusterCursors, bucket_key
from broker.server.storage._cluster_groups import ClusterGroups
from broker.server.storage._kv_state import StateBuckets

from .helpers import make_config, running_broker, url, wait_until
from .run_streams import HeldBucket, MemoryBucket, MemoryStreams
from .test_topic_log import publish, read, take

#: Hang guard (seconds).
DEADLINE = 60

KEY = "\x00orders\x00billing"  # (no principal, topic "orders", cursor "billing")


def _held(bucket: MemoryBucket, key: str = KEY) -> int | None:
    """The position the bucket holds for cursor ``key``."""
    found = bucket.values.get(bucket_key(key))
    return None if found is None else int(json.loads(found[0])["next"])


async def flushed(writer: ClusterCursors | ClusterGroups) -> None:
    """Until ``writer``'s bucket holds everything it was given."""
    with trio.fail_after(DEADLINE):
        await writer.flush()


async def test_positions_are_written_late_and_coalesced() -> None:
    bucket = MemoryBucket()
    cursors = ClusterCursors(bucket)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(cursors.run)
        for position in range(2, 102):
            cursors.store(KEY, position)
        assert cursors.position(KEY) == 101  # (at once, here)
        assert bucket.writes == 0  # (written late)
        await wait_until(lambda: _held(bucket) == 101, what="the position written")
        assert bucket.writes == 1  # (a hundred positions, one write)
        cursors.store(KEY, 120)
        await flushed(cursors)
        assert (_held(bucket), bucket.writes) == (120, 2)  # (on top of the first)
        nursery.cancel_scope.cancel()


async def test_a_bucket_that_does_not_answer_is_asked_again() -> None:
    bucket = MemoryBucket(failures=["unavailable", "answer lost", "unavailable"])
    cursors = ClusterCursors(bucket)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(cursors.run)
        cursors.store(KEY, 7)
        await flushed(cursors)
        nursery.cancel_scope.cancel()
    assert _held(bucket) == 7
    # (Stored with its answer lost: the next try was refused, the bucket
    # read, and what it holds was what it should: not written twice.)
    assert bucket.writes == 1
    assert cursors.writes.retries == 3
    assert cursors.writes.refused == 1


@pytest.mark.parametrize("theirs", [5, 50])
async def test_a_write_refused_keeps_the_larger_position(theirs: int) -> None:
    bucket = MemoryBucket()
    cursors = ClusterCursors(bucket)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(cursors.run)
        cursors.store(KEY, 3)
        await flushed(cursors)
        # Another front end writes the key (a previous owner's late write).
        value = {"topic": "orders", "principal": "", "cursor": "billing", "next": theirs}
        bucket.write_now(bucket_key(KEY), json.dumps(value).encode())
        cursors.store(KEY, 20)
        await flushed(cursors)
        nursery.cancel_scope.cancel()
    assert cursors.writes.refused == 1
    assert _held(bucket) == max(theirs, 20)
    assert cursors.position(KEY) == max(theirs, 20)


async def test_a_deletion_refused_leaves_what_another_front_end_wrote() -> None:
    bucket = MemoryBucket()
    old = ClusterCursors(bucket)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(old.run)
        old.store(KEY, 3)
        await flushed(old)
        # Another front end (the topic's new owner) writes the key.
        value = {"topic": "orders", "principal": "", "cursor": "billing", "next": 9}
        bucket.write_now(bucket_key(KEY), json.dumps({**value, "writer": "new"}).encode())
        assert old.delete(KEY)  # (the old owner, late)
        await flushed(old)
        nursery.cancel_scope.cancel()
    assert old.writes.refused == 1
    assert _held(bucket) == 9  # (not removed)


async def test_a_deletion_removes_its_own_write_whose_answer_was_lost() -> None:
    bucket = HeldBucket(failures=["answer lost"])
    cursors = ClusterCursors(bucket)
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(cursors.run)
            in_flight, release = bucket.hold()
            cursors.store(KEY, 7)
            await in_flight.wait()
            assert cursors.delete(KEY)  # (while 7 is on its way)
            release.set()  # (7 is stored, its answer lost: the deletion is refused)
            await flushed(cursors)
            nursery.cancel_scope.cancel()
    assert cursors.writes.refused == 1
    assert bucket_key(KEY) not in bucket.values  # (its own value: deleted)


async def test_only_the_cursors_of_owned_topics_are_read() -> None:
    bucket = MemoryBucket()
    writer = ClusterCursors(bucket)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer.run)
        writer.store(KEY, 4)
        writer.store("alice\x00audit\x00c", 9)
        writer.store("\x00gone\x00c", 2)
        await flushed(writer)
        assert writer.delete("\x00gone\x00c")
        await flushed(writer)
        nursery.cancel_scope.cancel()
    bucket.write_now("junk.1", b"not a cursor")
    reader = ClusterCursors(MemoryBucket(values=bucket.values, failures=["unavailable"]))
    with pytest.raises(Exception, match="no answer"):
        await reader.load()
    assert await reader.load(lambda topic: topic != "audit") == 1
    assert reader.items() == [(KEY, 4)]
    assert await reader.load() == 2
    assert reader.position("alice\x00audit\x00c") == 9
    assert reader.position("\x00gone\x00c") is None  # (deleted)


async def _serve(
    streams: MemoryStreams,
    bucket: MemoryBucket,
    data_dir: Path,
    stopped: trio.Event,
    *,
    task_status: trio.TaskStatus[Broker],
) -> None:
    config = make_config(data_dir=str(data_dir))
    try:
        await serve_broker(
            config,
            streams=streams,
            records=MemoryBucket(),
            state=StateBuckets(bucket, MemoryBucket()),
            task_status=task_status,
        )
    finally:
        stopped.set()


@pytest.mark.parametrize("stop", ["graceful", "killed"])
async def test_a_cursor_continues_where_acked_on_a_broker_with_another_disk(
    tmp_path: Path, stop: str
) -> None:
    streams, bucket = MemoryStreams(), MemoryBucket()
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            stopped = trio.Event()
            first: Broker = await nursery.start(_serve, streams, bucket, tmp_path / "a", stopped)
            await publish(url(first), "orders", [b"r%d" % n for n in range(1, 11)])
            options = {"from": "earliest", "cursor": "billing"}
            got = await read(url(first), "orders", 6, options)  # (acked as it leaves)
            assert [m.seq for m in got] == list(range(1, 7))
            if stop == "graceful":
                await first.shutdown()  # (what it stored is written first)
            else:
                await wait_until(lambda: _held(bucket) == 7, what="the position written")
                first.life.nursery.cancel_scope.cancel()  # type: ignore[union-attr]
            await stopped.wait()
            stopped = trio.Event()
            second: Broker = await nursery.start(_serve, streams, bucket, tmp_path / "b", stopped)
            got = await read(url(second), "orders", 4, options)
            await second.shutdown()
    assert [(m.seq, m.payload) for m in got] == [(n, b"r%d" % n) for n in range(7, 11)]
    assert _held(bucket) == 11


async def test_a_live_subscription_s_acks_reach_the_bucket(tmp_path: Path) -> None:
    streams, bucket = MemoryStreams(), MemoryBucket()
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            stopped = trio.Event()
            broker: Broker = await nursery.start(_serve, streams, bucket, tmp_path, stopped)
            await publish(url(broker), "orders", [b"r%d" % n for n in range(1, 4)])
            async with (
                open_client(url(broker), name="c") as client,
                client.subscribe("orders", options={"cursor": "billing", "from": 1}) as sub,
            ):
                await take(sub, 3)
            await wait_until(lambda: _held(bucket) == 4, what="the position written")
            assert broker.logs is not None
            assert broker.logs.journal.get("cursors", KEY) is None  # (not on the disk)
            await broker.shutdown()


async def test_the_journal_s_cursors_move_to_the_cluster(tmp_path: Path) -> None:
    """A front end that kept its cursors in its journal (before they moved
    to the cluster) writes them to the bucket at its next start."""
    streams, bucket = MemoryStreams(), MemoryBucket()
    options = {"from": "earliest", "cursor": "billing"}
    with trio.fail_after(DEADLINE):
        async with running_broker(make_config(data_dir=str(tmp_path)), streams=streams) as old:
            await publish(url(old), "orders", [b"r%d" % n for n in range(1, 11)])
            await read(url(old), "orders", 6, options)
        async with running_broker(
            make_config(data_dir=str(tmp_path)),
            streams=streams,
            state=StateBuckets(bucket, MemoryBucket()),
        ) as broker:
            assert broker.logs is not None
            assert broker.logs.journal.items("cursors") == []  # (moved)
            got = await read(url(broker), "orders", 4, options)
            await wait_until(lambda: _held(bucket) == 11, what="the position written")
    assert [m.seq for m in got] == list(range(7, 11))
