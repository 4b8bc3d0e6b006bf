"""Staged publishes in the cluster's staging stream (``staging/_stream.py``),
over the in-memory stream: a staged publish is confirmed only once its run
is stored there; a batch staged through a front end is committed through
another on a new disk, each row once; an Abort and a commit drop the
batch's runs; a load keeps each publish once (by its origin) and only the
topics owned here.

Deadlines are hang guards only: nothing waits for a time to pass.
"""

from __future__ import annotations

from pathlib import Path

import trio
import trio.testing

from accounts import unlimited
from broker.client import open_client
from broker.protocol import OutcomeStatus, Stage
from broker.server.staging._area import StagingArea
from broker.server.staging._registry import CommitRegistry
from broker.server.staging._stream import (
    RUN_RECORDS,
    StagedRun,
    decode_run,
    staged_subject,
)

from .helpers import connection_named, url, wait_until
from .run_streams import MemoryBucket, MemoryStaging
from .test_commit_registry import MEMBERS, FrontEnds, stage_rows

#: Hang guard of each test (seconds).
DEADLINE = 60.0
BATCH = ("alice", "job-1")


async def test_a_staged_publish_is_confirmed_once_the_stream_stores_it(tmp_path: Path) -> None:
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            front_ends = FrontEnds(MemoryBucket(), nursery)
            staged = front_ends.staged
            staged.unavailable = 1  # (the first try is not answered: sent again)
            staged.released = trio.Event()
            first = await front_ends.start(tmp_path / "a")
            confirmed = trio.Event()
            async with open_client(url(first), name="task") as task:

                async def publish() -> None:
                    await task.publish("orders", b"row", stage=Stage("job-1", "0/0"))
                    await task.finish_stage(Stage("job-1", "0/0"))  # (its Confirm)
                    confirmed.set()

                nursery.start_soon(publish)
                await wait_until(lambda: staged.unavailable == 0, what="the first try")
                await trio.testing.wait_all_tasks_blocked()
                assert not confirmed.is_set() and not staged.messages
                staged.released.set()
                await confirmed.wait()
                assert staged.publishes() == 1 and staged.duplicates == 0
                assert (staged.counters.runs_resent, staged.counters.runs_stored) == (1, 1)
                outcome = await task.commit("job-1", [("0/0", 1)])
                assert (outcome.status, outcome.messages) == (OutcomeStatus.COMMITTED, 1)
            await front_ends.stop(first)
    assert front_ends.stored() == 1


async def test_a_channel_the_stream_holds_back_is_throttled_then_goes_on(tmp_path: Path) -> None:
    """While the stream does not answer, a staged channel's runs are its
    debt: past its watermark it is withheld its guarantees (the client
    waits, nothing is refused); once the stream answers, every publish is
    confirmed and committed once."""
    rows = 2000  # (about 420 KB: more than the channel's capacity of 256 KiB)
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            front_ends = FrontEnds(
                MemoryBucket(),
                nursery,
                channel_high_watermark=8 * 1024,
                channel_low_watermark=4 * 1024,
            )
            staged = front_ends.staged
            staged.released = trio.Event()
            first = await front_ends.start(tmp_path / "a")
            done = trio.Event()
            async with open_client(url(first), name="task") as task:

                async def publish() -> None:
                    for row in range(rows):
                        payload = b"%04d" % row + b"." * 200
                        await task.publish("orders", payload, stage=Stage("job-1", "0/0"))
                    await task.finish_stage(Stage("job-1", "0/0"))
                    done.set()

                nursery.start_soon(publish)
                connection = connection_named(first, "task")
                await wait_until(
                    lambda: any(c.account.blocked for c in connection.publishing.channels.values()),
                    what="the channel withheld",
                )
                await trio.testing.wait_all_tasks_blocked()
                assert not done.is_set() and not staged.messages
                staged.released.set()
                await done.wait()
                assert staged.publishes() == rows
                outcome = await task.commit("job-1", [("0/0", rows)])
                assert (outcome.status, outcome.messages) == (OutcomeStatus.COMMITTED, rows)
            await front_ends.stop(first)
    assert front_ends.stored() == rows


async def test_a_batch_staged_through_a_lost_front_end_commits_elsewhere_once(
    tmp_path: Path,
) -> None:
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            front_ends = FrontEnds(MemoryBucket(), nursery)
            first = await front_ends.start(tmp_path / "a")
            async with open_client(url(first), name="task") as task:
                await stage_rows(task, MEMBERS)
            await front_ends.stop(first)
            assert front_ends.staged.publishes() == 3
            second = await front_ends.start(tmp_path / "b")  # (a new disk)
            async with open_client(url(second), name="driver") as driver:
                outcome = await driver.commit("job-1", MEMBERS)
                assert (outcome.status, outcome.messages) == (OutcomeStatus.COMMITTED, 3)
                again = await driver.commit("job-1", MEMBERS)
                assert again.status == OutcomeStatus.DUPLICATE
                await driver.publish("orders", b"end")
                async with driver.subscribe("orders", start="earliest") as subscription:
                    read: list[bytes] = []
                    while not read or read[-1] != b"end":
                        read.append((await subscription.receive()).payload)
            await wait_until(lambda: not front_ends.staged.messages, what="the runs dropped")
            await front_ends.stop(second)
    staged = [b"%s:%d" % (member.encode(), row) for member, rows in MEMBERS for row in range(rows)]
    assert read == [*staged, b"end"]


async def test_an_abort_drops_the_batch_from_the_stream(tmp_path: Path) -> None:
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            front_ends = FrontEnds(MemoryBucket(), nursery)
            first = await front_ends.start(tmp_path / "a")
            async with open_client(url(first), name="task") as task:
                await stage_rows(task, MEMBERS)
                assert front_ends.staged.publishes() == 3
                outcome = await task.abort("job-1")
                assert (outcome.status, outcome.messages) == (OutcomeStatus.ABORTED, 3)
                await wait_until(lambda: not front_ends.staged.messages, what="the runs dropped")
            await front_ends.stop(first)
    orders = front_ends.streams.streams.get("orders")
    assert orders is None or not orders.messages  # (nothing routed)


def run(member: str, topic: str, session: bytes, first: int, count: int) -> StagedRun:
    entries = [(None, b"%s:%d" % (member.encode(), n), 10) for n in range(first, first + count)]
    return StagedRun(BATCH, member, topic, session, 1, first, entries)


async def test_a_load_keeps_each_publish_once_and_the_topics_owned_here() -> None:
    store = MemoryStaging()
    for stored in (
        run("0/0", "orders", b"s1", 1, 2),
        run("0/0", "orders", b"s1", 2, 2),  # (a resend of 2 with 3: 2 once)
        run("0/0", "elsewhere", b"s1", 1, 1),  # (another front end's share)
        run("1/0", "orders", b"s2", 1, 1),
        run("1/0", "orders", b"s2", 1, 1),  # (stored twice: past the duplicate window)
    ):
        await store.append(stored)
    assert store.duplicates == 1  # (the same id: one answer "duplicate")
    staging = StagingArea(unlimited("test"), limit=1 << 20, ttl=60.0, remember=10)
    registry = CommitRegistry(MemoryBucket(), store)
    decision = await registry.decide(
        staging, BATCH, [("0/0", 3), ("1/0", 1)], owned=lambda topic: topic == "orders"
    )
    assert (decision.status, decision.messages) == (OutcomeStatus.COMMITTED, 4)
    assert [p.loan.item for p in decision.publishes] == [b"0/0:1", b"0/0:2", b"0/0:3", b"1/0:1"]
    assert store.counters.batches_read == 1
    for publish in decision.publishes:
        publish.loan.repay()


def test_a_run_is_read_back_as_written_and_damage_is_refused() -> None:
    written = run("0/0", "orders/eu", b"s1", 5, RUN_RECORDS)
    back = decode_run(written.encode())
    assert back is not None
    assert (back.batch, back.member, back.topic, back.first) == (BATCH, "0/0", "orders/eu", 5)
    assert back.entries == written.entries
    assert back.msg_id == written.msg_id == f"{b's1'.hex()}.1.5.{RUN_RECORDS}"
    assert decode_run(b"\xff") is None
    assert decode_run(written.encode()[:-3]) is None
    assert staged_subject(BATCH, "orders/eu").endswith(".orders_2Feu")
    assert staged_subject(BATCH, None).endswith(".*")
