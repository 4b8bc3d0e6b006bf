"""Sessions' records kept in the cluster (``sessions/_cluster_records.py``),
over a bucket in memory with JetStream KV's compare-and-set: a record
write is waited for, positions are coalesced, a bucket that does not
answer is asked again, a takeover ends the session here, a restart reads
the bucket; and a front end on a new disk resumes a session another served.
"""

from __future__ import annotations

from pathlib import Path

import cbor2
import pytest
import trio
import trio.testing

from broker.server.sessions._cluster_records import (
    LAZY_DELAY,
    ClusterRecords,
    acked_key,
    record_key,
    routed_key,
)

from .cluster_resume import resume_on_another_broker
from .helpers import wait_until
from .run_streams import MemoryBucket, MemoryStreams


def _payload(value: bytes) -> object:
    """What a value of the bucket holds (its writer left out)."""
    _writer, payload = cbor2.loads(value)
    return payload


async def _running(copies: ClusterRecords, nursery: trio.Nursery) -> None:
    nursery.start_soon(copies.run)
    await trio.testing.wait_all_tasks_blocked()


async def test_a_record_is_stored_before_its_generation_is_released() -> None:
    bucket = MemoryBucket(failures=["unavailable", "unavailable"])
    copies = ClusterRecords(bucket, lambda _s: None)
    woken: list[int] = []
    async with trio.open_nursery() as nursery:
        copies.save("ab", {"client": "c"})
        copies.save("cd", {"client": "d"})
        assert not copies.stored("ab")
        copies.when_stored("ab", lambda: woken.append(1))
        await _running(copies, nursery)
        await wait_until(lambda: bool(woken), what="the record stored")
        assert copies.stored("ab")
        assert _payload(bucket.values[record_key("ab")][0]) == {"client": "c"}
        await wait_until(lambda: copies.stored("cd"), what="the other stored")
        assert copies.retries == 2  # (asked again until it answered)
        nursery.cancel_scope.cancel()


async def test_a_write_whose_answer_was_lost_is_known_for_its_own() -> None:
    bucket = MemoryBucket()
    taken: list[bytes] = []
    copies = ClusterRecords(bucket, taken.append)
    async with trio.open_nursery() as nursery:
        await _running(copies, nursery)
        copies.save("ab", {"n": 1})
        await wait_until(lambda: copies.stored("ab"), what="the first")
        bucket.failures = ["answer lost"]
        copies.save("ab", {"n": 2})  # (stored; its answer lost: sent again, refused)
        await wait_until(lambda: copies.stored("ab"), what="the second")
        copies.save("ab", {"n": 3})
        await wait_until(lambda: copies.stored("ab"), what="the third")
        nursery.cancel_scope.cancel()
    assert taken == []
    assert _payload(bucket.values[record_key("ab")][0]) == {"n": 3}


async def test_positions_are_coalesced_and_do_not_hold_records_back(
    autojump_clock: trio.testing.MockClock,
) -> None:
    bucket = MemoryBucket()
    copies = ClusterRecords(bucket, lambda _s: None)
    async with trio.open_nursery() as nursery:
        await _running(copies, nursery)
        for offset in range(1, 101):
            copies.acked("ab", 1, offset)
        assert copies.stored("ab")  # (positions are no record writes)
        await trio.sleep(LAZY_DELAY * 2)
        assert bucket.writes == 1
        assert _payload(bucket.values[acked_key("ab")][0]) == {1: 100}
        nursery.cancel_scope.cancel()


async def test_a_session_written_by_another_front_end_is_ended_here() -> None:
    bucket = MemoryBucket()
    taken: list[bytes] = []
    copies = ClusterRecords(bucket, taken.append)
    async with trio.open_nursery() as nursery:
        await _running(copies, nursery)
        copies.save("ab", {"n": 1})
        await wait_until(lambda: record_key("ab") in bucket.values, what="stored")
        bucket.write_now(record_key("ab"), cbor2.dumps(["other", {"n": "theirs"}]))  # (a takeover)
        copies.save("ab", {"n": 2})
        await wait_until(lambda: bool(taken), what="the takeover noticed")
        assert taken == [bytes.fromhex("ab")]
        assert copies.stored("ab")  # (nobody waits for it any more)
        copies.save("ab", {"n": 3})  # (never written again)
        copies.forget("ab")
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert _payload(bucket.values[record_key("ab")][0]) == {"n": "theirs"}


async def test_a_forgotten_session_is_deleted_from_the_bucket() -> None:
    bucket = MemoryBucket()
    copies = ClusterRecords(bucket, lambda _s: None)
    async with trio.open_nursery() as nursery:
        await _running(copies, nursery)
        copies.save("ab", {"n": 1})
        copies.acked("ab", 3, 7)
        await wait_until(lambda: len(bucket.values) == 2, what="both written")
        copies.forget("ab")
        await wait_until(lambda: not bucket.values, what="both deleted")
        nursery.cancel_scope.cancel()


async def test_a_claim_reads_the_session_and_the_old_holder_loses_it() -> None:
    bucket = MemoryBucket()
    taken: list[bytes] = []
    holder = ClusterRecords(bucket, taken.append)
    async with trio.open_nursery() as nursery:
        await _running(holder, nursery)
        holder.save("ab", {"client": "kept"})
        holder.routed("ab", 1, 40)
        holder.acked("ab", 2, 7)
        assert not holder.stored("ab")  # (the record is waited for)
        await wait_until(lambda: len(bucket.values) == 3, what="all three written")
        assert holder.stored("ab")
        claimer = ClusterRecords(bucket, lambda _s: None)
        claimed = await claimer.claim("ab")
        assert claimed is not None
        assert claimed.record == {"client": "kept"}
        assert (claimed.routed, claimed.acked) == ({1: 40}, {2: 7})
        assert await claimer.claim("cd") is None  # (no record of it)
        holder.routed("ab", 1, 41)  # (the old holder writes on: refused)
        await wait_until(lambda: bool(taken), what="the old holder told")
        assert taken == [bytes.fromhex("ab")]
        nursery.start_soon(claimer.run)
        claimer.routed("ab", 1, 41)  # (the claimer's revisions are the bucket's)
        assert claimer.stored("ab")  # (a count is written lazily: nothing waits)
        await wait_until(
            lambda: _payload(bucket.values[routed_key("ab")][0]) == {1: 41},
            what="the claimer's write",
        )
        nursery.cancel_scope.cancel()
    assert _payload(bucket.values[routed_key("ab")][0]) == {1: 41}
    assert claimer.taken == 0


async def test_a_claim_reads_again_when_the_holder_writes_meanwhile() -> None:
    """The holder's lazy count landing between a claim's read and its
    writes makes the claim read again (not give the session up)."""
    bucket = MemoryBucket()
    holder = ClusterRecords(bucket, lambda _s: None)
    async with trio.open_nursery() as nursery:
        await _running(holder, nursery)
        holder.save("ab", {"client": "kept"})
        holder.routed("ab", 1, 40)
        await wait_until(lambda: len(bucket.values) == 2, what="both written")
        nursery.cancel_scope.cancel()
    reads: list[str] = []
    read = bucket.session

    async def read_then_the_holder_writes(session: str) -> dict[str, tuple[bytes, int]]:
        keys = await read(session)
        reads.append(session)
        if len(reads) == 1:
            bucket.write_now(routed_key(session), cbor2.dumps([holder.writer, {1: 41}]))
        return keys

    bucket.session = read_then_the_holder_writes  # type: ignore[method-assign]
    claimed = await ClusterRecords(bucket, lambda _s: None).claim("ab")
    assert claimed is not None
    assert claimed.routed == {1: 41}
    assert reads == ["ab", "ab"]


@pytest.mark.parametrize("disk", ["same", "new"])
async def test_a_session_resumes_on_a_front_end_with_another_disk(
    tmp_path: Path, disk: str
) -> None:
    streams, bucket = MemoryStreams(), MemoryBucket()
    moved = await resume_on_another_broker(
        tmp_path, streams, bucket, [b"one"], [b"two"], same_disk=disk == "same"
    )
    assert (moved.lost, moved.resumed) == (0, 1)
    assert [m.count for m in streams.streams["orders"].messages] == [1, 1]


async def test_a_resume_counts_what_the_stream_holds_not_the_late_count(
    tmp_path: Path,
) -> None:
    """A session's publish count is written lazily: a front end that
    resumes the session before the count lands is told by the topic's
    stream how many of its publishes are stored (at least what was
    confirmed), so the client resends nothing stored and loses nothing."""
    streams, bucket = MemoryStreams(), MemoryBucket()
    bucket.unanswered.add(routed_key(""))  # (no count ever lands)
    moved = await resume_on_another_broker(
        tmp_path, streams, bucket, [b"one", b"two", b"three"], [b"four"]
    )
    assert not any(key.startswith(routed_key("")) for key in bucket.values)
    assert (moved.lost, moved.resumed) == (0, 1)
    assert sum(m.count for m in streams.streams["orders"].messages) == 4  # (each once)
