"""The commit registry in the cluster (``staging/_registry.py``), over the
in-memory bucket: a share is noted "committing" before its routing and
"committed" before its Outcome, shares of one batch written at once by
two front ends are both kept, and a Commit a front end cannot decide
from its own state (a new disk) is decided from the registry: a batch
committed before is a duplicate, one cut off while another front end
committed it is refused; and end to end, a front end on a new data
directory answers a retried commit "duplicate" and routes nothing again.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import cbor2
import pytest
import trio

from accounts import unlimited
from broker.client import Client, ConnectionLost, StagingRefused, open_client
from broker.protocol import OutcomeStatus, Stage
from broker.server import Broker, serve_broker
from broker.server.sessions._cluster_records import RecordsUnavailable
from broker.server.staging._area import StagingArea
from broker.server.staging._records import Members
from broker.server.staging._registry import (
    COMMITTED,
    COMMITTING,
    CommitRegistry,
    members_digest,
    registry_key,
    share_of,
)
from broker.server.storage._kv_state import StateBuckets

from .helpers import make_config, url, wait_until
from .run_streams import MemoryBucket, MemoryStaging, MemoryStreams

#: Hang guard of each test (seconds).
DEADLINE = 60.0
BATCH = ("alice", "job-1")
MEMBERS = [("0/0", 2), ("1/0", 1)]


def area() -> StagingArea:
    return StagingArea(unlimited("test"), limit=1 << 20, ttl=60.0, remember=10)


def stage(staging: StagingArea, member: str, topic: str, count: int) -> None:
    for n in range(count):
        tail = b"%s:%d" % (member.encode(), n)
        assert staging.stage(BATCH[0], Stage(BATCH[1], member), topic, tail, None, 10, 0.0) is None


def entries(bucket: MemoryBucket) -> dict[str, list[str]]:
    return dict(cbor2.loads(bucket.values[registry_key(BATCH)][0]))


async def test_a_share_is_committing_then_committed() -> None:
    bucket = MemoryBucket(failures=["unavailable"])
    registry = CommitRegistry(bucket)
    assert await registry.begin(BATCH, {"orders"}, MEMBERS) is None
    assert registry.retries == 1  # (asked again: the bucket did not answer)
    share = share_of({"orders"})
    assert entries(bucket) == {share: [COMMITTING, members_digest(MEMBERS)]}
    assert await registry.begin(BATCH, {"orders"}, MEMBERS) == COMMITTING
    await registry.finish(BATCH, {"orders"}, MEMBERS)
    assert entries(bucket) == {share: [COMMITTED, members_digest(MEMBERS)]}
    assert await registry.begin(BATCH, {"orders"}, MEMBERS) == COMMITTED


class RacingBucket(MemoryBucket):
    """A bucket where another front end writes its share of the batch
    between this one's first read and its write."""

    raced = False

    async def read(self, key: str) -> tuple[bytes, int] | None:
        found = await super().read(key)
        if not self.raced:
            self.raced = True
            other = {share_of({"payments"}): [COMMITTING, members_digest(MEMBERS)]}
            self.write_now(key, cbor2.dumps(other))
        return found


async def test_two_front_ends_shares_of_one_batch_are_both_kept() -> None:
    bucket = RacingBucket()
    registry = CommitRegistry(bucket)
    assert await registry.begin(BATCH, {"orders"}, MEMBERS) is None
    assert set(entries(bucket)) == {share_of({"orders"}), share_of({"payments"})}


async def test_a_batch_committed_elsewhere_is_a_duplicate_here() -> None:
    bucket = MemoryBucket()
    await CommitRegistry(bucket).finish(BATCH, {"orders"}, MEMBERS)
    registry = CommitRegistry(bucket)
    fresh = area()  # (a new disk: nothing staged, nothing remembered)
    decision = await registry.decide(fresh, BATCH, MEMBERS)
    assert decision.status is OutcomeStatus.DUPLICATE
    assert BATCH in fresh.finished  # (a late publish of it is dropped from now on)
    late = area()  # (what it staged here is dropped, not committed again)
    stage(late, "0/0", "orders", 2)
    stage(late, "1/0", "orders", 1)
    assert (await registry.decide(late, BATCH, MEMBERS)).status is OutcomeStatus.DUPLICATE
    assert late.size == 0 and late.counters.discarded["late"] == 3


async def test_another_members_list_or_share_is_not_a_duplicate() -> None:
    bucket = MemoryBucket()
    registry = CommitRegistry(bucket)
    await registry.finish(BATCH, {"payments"}, MEMBERS)  # (another front end's share)
    staging = area()
    stage(staging, "0/0", "orders", 2)
    stage(staging, "1/0", "orders", 1)
    decision = await registry.decide(staging, BATCH, MEMBERS)
    assert decision.status is OutcomeStatus.COMMITTED and decision.messages == 3
    for publish in decision.publishes:
        publish.loan.repay()
    other = [("0/0", 2)]  # (nothing staged here: another commit of the batch)
    refused = await registry.decide(area(), BATCH, other)
    assert refused.status is OutcomeStatus.REFUSED


async def test_a_commit_cut_off_on_a_lost_disk_is_refused_then_run_again() -> None:
    bucket = MemoryBucket()
    await CommitRegistry(bucket).begin(BATCH, {"orders"}, MEMBERS)
    registry = CommitRegistry(bucket)
    decision = await registry.decide(area(), BATCH, MEMBERS)
    assert decision.status is OutcomeStatus.REFUSED
    assert "was committing this batch when it stopped" in decision.reason
    again = area()  # (the batch run again: staged here by new attempts)
    stage(again, "0/1", "orders", 3)
    rerun = await registry.decide(again, BATCH, [("0/1", 3)])
    assert rerun.status is OutcomeStatus.COMMITTED and rerun.messages == 3
    for publish in rerun.publishes:
        publish.loan.repay()


async def test_an_unanswered_registry_refuses_before_anything_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("broker.server.storage._topic_logs.START_PATIENCE", 0.0)
    bucket = MemoryBucket()

    async def unanswered(key: str) -> None:
        raise RecordsUnavailable("no leader (scheduled)")

    bucket.read = unanswered  # type: ignore[method-assign]
    staging = area()
    stage(staging, "0/0", "orders", 2)
    decision = await CommitRegistry(bucket).decide(staging, BATCH, [("0/0", 2)])
    assert decision.status is OutcomeStatus.REFUSED
    assert "commit registry does not answer" in decision.reason
    assert BATCH in staging.batches and BATCH not in staging.finished  # (unchanged)
    staging.clear()


async def stage_rows(
    client: Client, members: Members, batch: str = "job-1", topic: str = "orders"
) -> None:
    """Stage rows ``member:n`` of each of ``members`` in ``batch`` of ``topic``."""
    for member, rows in members:
        for row in range(rows):
            payload = b"%s:%d" % (member.encode(), row)
            await client.publish(topic, payload, stage=Stage(batch, member))
        await client.finish_stage(Stage(batch, member))


class FrontEnds:
    """Front ends over one set of in-memory streams and buckets, started one
    after another (each on a data directory given)."""

    def __init__(self, commits: MemoryBucket, nursery: trio.Nursery, **config: Any) -> None:
        self.streams, self.records, self.commits = MemoryStreams(), MemoryBucket(), commits
        self.staged = MemoryStaging()
        self.nursery = nursery
        #: Settings of every front end started (beside the data directory).
        self.config = config
        self.stopped = trio.Event()

    async def start(self, data_dir: Path) -> Broker:
        self.stopped = trio.Event()
        broker: Broker = await self.nursery.start(self._serve, data_dir)
        return broker

    async def stop(self, broker: Broker) -> None:
        await broker.shutdown()
        await self.stopped.wait()

    async def _serve(self, data_dir: Path, *, task_status: trio.TaskStatus[Broker]) -> None:
        config = make_config(data_dir=str(data_dir), shutdown_deadline=0.5, **self.config)
        try:
            await serve_broker(
                config,
                streams=self.streams,
                records=self.records,
                state=StateBuckets(MemoryBucket(), MemoryBucket(), self.commits, self.staged),
                task_status=task_status,
            )
        finally:
            self.stopped.set()

    def stored(self) -> int:
        """Records the topic's stream holds."""
        return sum(run.count for run in self.streams.streams["orders"].messages)

    def states(self) -> list[tuple[str, str]]:
        """Batch job-1's entries in the registry."""
        value = self.commits.values[registry_key((None, "job-1"))][0]
        return [tuple(entry) for entry in cbor2.loads(value).values()]


@pytest.mark.parametrize("disk", ["same", "new"])
async def test_a_retried_commit_on_a_front_end_with_another_disk_is_a_duplicate(
    tmp_path: Path, disk: str
) -> None:
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            front_ends = FrontEnds(MemoryBucket(), nursery)
            first = await front_ends.start(tmp_path / "a")
            async with open_client(url(first), name="task") as task:
                await stage_rows(task, MEMBERS)
                outcome = await task.commit("job-1", MEMBERS)
                assert outcome.status == OutcomeStatus.COMMITTED
            assert front_ends.states() == [(COMMITTED, members_digest(MEMBERS))]
            await front_ends.stop(first)
            second = await front_ends.start(tmp_path / ("a" if disk == "same" else "b"))
            async with open_client(url(second), name="driver") as driver:
                again = await driver.commit("job-1", MEMBERS)
                assert again.status == OutcomeStatus.DUPLICATE
                with pytest.raises(StagingRefused):
                    await driver.abort("job-1")  # (committed: never undone)
            await front_ends.stop(second)
    assert front_ends.stored() == 3


class CommittedUnanswered(MemoryBucket):
    """A bucket that does not answer writes of "committed" while ``refusing``."""

    refusing = True
    refused = 0

    async def write(self, key: str, value: bytes | None, last_revision: int) -> int:
        if self.refusing and value is not None and COMMITTED in str(cbor2.loads(value)):
            self.refused += 1
            raise RecordsUnavailable("no answer (scheduled)")
        return await super().write(key, value, last_revision)


@contextlib.asynccontextmanager
async def after_a_cut_off(data_dir: Path) -> AsyncIterator[FrontEnds]:
    """Front ends, after one on ``data_dir`` staged MEMBERS, committed, and
    was stopped once its rows were stored but the registry had not taken
    "committed" (the commit cut off: never answered)."""
    commits = CommittedUnanswered()
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            front_ends = FrontEnds(commits, nursery)
            first = await front_ends.start(data_dir)
            async with open_client(url(first), name="task") as task:
                await stage_rows(task, MEMBERS)
                async with trio.open_nursery() as committing:

                    async def commit() -> None:
                        with contextlib.suppress(ConnectionLost):  # (the stop: Goodbye)
                            await task.commit("job-1", MEMBERS)
                            raise AssertionError("the commit was answered")

                    committing.start_soon(commit)
                    await wait_until(lambda: commits.refused > 0, what="the commit routed")
                    assert [state for state, _ in front_ends.states()] == [COMMITTING]
                    assert front_ends.stored() == 3
                    await front_ends.stop(first)
                    committing.cancel_scope.cancel()
            commits.refusing = False
            yield front_ends


async def test_a_commit_cut_off_is_completed_then_a_duplicate_on_a_new_disk(
    tmp_path: Path,
) -> None:
    """The registry does not take "committed" while the first front end
    commits: its stop cuts the commit off after its rows are stored
    ("committing" in the registry and its journal); started again on its
    disk it completes it (routing nothing again: the stream's runs name
    the batch's rows) and notes it "committed", and a third front end on
    a new disk answers the retried commit "duplicate"."""
    async with after_a_cut_off(tmp_path / "a") as front_ends:
        again = await front_ends.start(tmp_path / "a")
        await wait_until(
            lambda: [state for state, _ in front_ends.states()] == [COMMITTED],
            what="the commit completed",
        )
        await front_ends.stop(again)
        third = await front_ends.start(tmp_path / "b")
        async with open_client(url(third), name="driver") as driver:
            outcome = await driver.commit("job-1", MEMBERS)
            assert outcome.status == OutcomeStatus.DUPLICATE
        await front_ends.stop(third)
    assert front_ends.stored() == 3


async def test_a_commit_cut_off_on_a_lost_disk_is_completed_from_the_staging_stream(
    tmp_path: Path,
) -> None:
    """The front end that cut the commit off is replaced on a new disk: the
    retried commit reads the batch from the staging stream and completes
    it, routing only what the topic's stream does not hold of it (here:
    nothing); the batch's runs then leave the staging stream."""
    async with after_a_cut_off(tmp_path / "a") as front_ends:
        second = await front_ends.start(tmp_path / "b")
        async with open_client(url(second), name="driver") as driver:
            outcome = await driver.commit("job-1", MEMBERS)
            assert (outcome.status, outcome.messages) == (OutcomeStatus.COMMITTED, 3)
        assert [state for state, _ in front_ends.states()] == [COMMITTED]
        await wait_until(lambda: not front_ends.staged.messages, what="the runs dropped")
        await front_ends.stop(second)
    assert front_ends.stored() == 3


async def test_a_commit_cut_off_on_a_lost_disk_is_refused_and_the_batch_run_again_once(
    tmp_path: Path,
) -> None:
    """The front end that cut the commit off is replaced on a new disk, and
    the staging stream no longer holds the batch (its age limit): the
    retried commit is refused; the batch staged again by new attempts
    commits, and routes only what the topic's stream does not hold of it
    (here: nothing)."""
    async with after_a_cut_off(tmp_path / "a") as front_ends:
        front_ends.staged.messages.clear()
        second = await front_ends.start(tmp_path / "b")
        async with open_client(url(second), name="driver") as driver:
            with pytest.raises(StagingRefused, match="was committing this batch"):
                await driver.commit("job-1", MEMBERS)
            rerun = [(f"{member}-again", rows) for member, rows in MEMBERS]
            await stage_rows(driver, rerun)
            outcome = await driver.commit("job-1", rerun)
            assert outcome.status == OutcomeStatus.COMMITTED
        assert [state for state, _ in front_ends.states()] == [COMMITTED]
        await front_ends.stop(second)
    assert front_ends.stored() == 3
