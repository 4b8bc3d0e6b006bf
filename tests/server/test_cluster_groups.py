"""Consumer groups' progress kept in the cluster
(``storage/_cluster_groups.py``), over a bucket in memory with JetStream
KV's compare-and-set: a front end claims the groups of the topics it owns
as it reads them (a previous owner's write landing first is read and
claimed again; one landing after is refused, and that owner gives the
group up: neither what it queued meanwhile nor a deletion lands on the
new owner's group); and a group goes on where it was on a broker with
another disk.
"""

from __future__ import annotations

from pathlib import Path

import cbor2
import pytest
import trio

from broker.client import open_client
from broker.server import Broker
from broker.server.storage._cluster_cursors import bucket_key
from broker.server.storage._cluster_groups import ClusterGroups
from broker.server.storage._kv_state import StateBuckets

from .helpers import TIMEOUT, running_broker, url, wait_until
from .run_streams import HeldBucket, MemoryBucket, MemoryStreams
from .test_cluster_cursors import flushed
from .test_groups import _publish

#: Hang guard (seconds).
DEADLINE = 60

KEY = "\x00jobs\x00workers"  # (no principal, topic "jobs", group "workers")


def _held(bucket: MemoryBucket, key: str = KEY) -> tuple[str, object] | None:
    """The writer and state the bucket holds for group ``key``."""
    found = bucket.values.get(bucket_key(key))
    if found is None:
        return None
    writer, _principal, _topic, _name, state = cbor2.loads(found[0])
    return writer, state


async def _old_owner(bucket: MemoryBucket, states: dict[str, object]) -> ClusterGroups:
    """A front end that wrote groups' ``states`` (its writer stopped since)."""
    old = ClusterGroups(bucket)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(old.run)
        for key, state in states.items():
            old.put("groups", key, state)
        await flushed(old)
        nursery.cancel_scope.cancel()
    return old


async def test_a_new_owner_claims_and_the_old_one_gives_the_group_up() -> None:
    bucket = MemoryBucket()
    old = await _old_owner(bucket, {KEY: {"state": "one"}, "\x00other\x00g": {"state": "no"}})
    new = ClusterGroups(bucket)
    assert await new.load(lambda topic: topic == "jobs") == 1
    assert new.get("groups", KEY) == {"state": "one"}
    assert new.items("groups") == [(KEY, {"state": "one"})]
    assert _held(bucket) == (new.writer, {"state": "one"})  # (claimed)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(old.run)
        nursery.start_soon(new.run)
        old.put("groups", KEY, {"state": "two"})  # (the old owner, late)
        await flushed(old)
        assert _held(bucket) == (new.writer, {"state": "one"})  # (refused)
        old.put("groups", KEY, {"state": "three"})  # (given up: not even tried)
        refused = old.writes.refused
        await flushed(old)
        assert old.writes.refused == refused
        new.put("groups", KEY, {"state": "four"})
        await flushed(new)
        nursery.cancel_scope.cancel()
    assert _held(bucket) == (new.writer, {"state": "four"})
    assert _held(bucket, "\x00other\x00g") == (old.writer, {"state": "no"})


@pytest.mark.parametrize(
    "then", ["a state queued meanwhile", "a deletion queued meanwhile", "a deletion after"]
)
async def test_what_the_old_owner_writes_after_its_refused_write_never_lands(then: str) -> None:
    """The old owner's write is in flight when the new owner claims the
    group; it is refused, and what the old owner queued meanwhile (or
    deletes after) is dropped, not written at the new owner's revision."""
    bucket = HeldBucket()
    old = ClusterGroups(bucket)
    new = ClusterGroups(bucket)
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(old.run)
            old.put("groups", KEY, {"state": "one"})
            await flushed(old)
            in_flight, release = bucket.hold()
            old.put("groups", KEY, {"state": "two"})
            await in_flight.wait()  # (sent, not yet stored)
            assert await new.load() == 1  # (claimed meanwhile)
            if then == "a state queued meanwhile":
                old.put("groups", KEY, {"state": "three"})
            elif then == "a deletion queued meanwhile":
                old.delete("groups", KEY)
            release.set()
            await flushed(old)
            if then == "a deletion after":
                old.delete("groups", KEY)
                await flushed(old)
            assert old.writes.given_up(bucket_key(KEY))
            assert _held(bucket) == (new.writer, {"state": "one"})  # (the claim stands)
            nursery.start_soon(new.run)
            new.put("groups", KEY, {"state": "four"})
            await flushed(new)
            nursery.cancel_scope.cancel()
    assert _held(bucket) == (new.writer, {"state": "four"})  # (the new owner goes on)
    assert not new.writes.given_up(bucket_key(KEY))


class _LateBucket(MemoryBucket):
    """A bucket where the previous owner's last write lands just before the
    first claim."""

    late: tuple[str, bytes] | None = None

    async def write(self, key: str, value: bytes | None, last_revision: int) -> int:
        if self.late is not None:
            self.write_now(*self.late)
            self.late = None
        return await super().write(key, value, last_revision)


async def test_a_claim_refused_reads_the_group_again() -> None:
    bucket = _LateBucket()
    old = await _old_owner(bucket, {KEY: {"state": "one"}})
    bucket.late = (bucket_key(KEY), cbor2.dumps([old.writer, "", "jobs", "workers", "two"]))
    new = ClusterGroups(bucket)
    assert await new.load() == 1
    assert new.get("groups", KEY) == "two"  # (the last write, not the one scanned)
    assert _held(bucket) == (new.writer, "two")


async def settle_six_of_ten(broker: Broker) -> None:
    """Ten records to topic "jobs", of which a member of group "workers"
    settles the first six (it holds the rest when it leaves)."""
    await _publish(url(broker), "jobs", 10)
    async with (
        open_client(url(broker)) as client,
        client.subscribe("jobs", group="workers", start="earliest") as member,
    ):
        for _ in range(10):
            message = await member.receive()
            if message.offset is not None and message.offset <= 6:
                message.ack()
        assert broker.groups is not None
        group = next(iter(broker.groups.groups.values()))
        await wait_until(lambda: group.state.floor == 7, what="six settled")


async def the_rest(broker: Broker) -> list[int]:
    """The offsets a new member of "workers" is given (and settles): four."""
    offsets: list[int] = []
    async with (
        open_client(url(broker)) as client,
        client.subscribe("jobs", group="workers", start="earliest") as member,
    ):
        with trio.fail_after(TIMEOUT):
            while len(offsets) < 4:
                message = await member.receive()
                offsets.append(message.offset or 0)
                message.ack()
    return sorted(offsets)


@pytest.mark.parametrize("disk", ["same", "new", "same, kept in the journal before"])
async def test_a_group_goes_on_where_it_was_on_another_disk(tmp_path: Path, disk: str) -> None:
    """(The last: a front end that kept its groups in its journal moves them
    to the cluster at its next start.)"""
    streams, records = MemoryStreams(), MemoryBucket()
    state = StateBuckets(MemoryBucket(), MemoryBucket())
    before = None if "journal" in disk else state
    with trio.fail_after(DEADLINE):
        async with running_broker(
            data_dir=str(tmp_path / "a"), streams=streams, records=records, state=before
        ) as broker:
            await settle_six_of_ten(broker)
        second = tmp_path / ("b" if disk == "new" else "a")
        async with running_broker(
            data_dir=str(second), streams=streams, records=records, state=state
        ) as broker:
            assert await the_rest(broker) == [7, 8, 9, 10]  # (settled ones never again)
            assert broker.logs is not None
            assert broker.logs.journal.items("groups") == []  # (none on the disk)
    assert state.groups.values  # type: ignore[attr-defined]
