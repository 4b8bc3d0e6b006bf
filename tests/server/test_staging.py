"""Staged publishing over real TCP: nothing is visible before its commit, a
commit makes exactly the listed members visible once, and whatever goes
wrong (a count that does not match, an abort, a full staging area, a cut
connection) nothing is routed twice or half.

These tests use the blocking client (the Spark sink's), in worker threads,
the broker in trio; tests/client/test_async_staging.py covers the trio client.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from broker.client import (
    BlockingClient,
    BlockingClusterClient,
    ConnectionLost,
    Message,
    StagingRefused,
)
from broker.protocol import GoodbyeCode, OutcomeStatus, Stage
from tests.proxy import cut_on_progress, proxied

from .helpers import TIMEOUT, running_broker, url, wait_idle, wait_until


@contextmanager
def collecting(client: BlockingClient, topic: str) -> Iterator[list[Message]]:
    """Subscribe (entered once subscribed) and receive into the list yielded,
    from a thread, until the block ends."""
    subscribed = threading.Event()
    stop = threading.Event()
    received: list[Message] = []

    def run() -> None:
        with client.subscribe(topic, timeout=TIMEOUT) as subscription:
            subscribed.set()
            while not stop.is_set():
                with suppress(TimeoutError):
                    received.append(subscription.receive(timeout=0.02))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert subscribed.wait(TIMEOUT)
    try:
        yield received
    finally:
        stop.set()
        thread.join(TIMEOUT)


def wait_for(condition: Callable[[], bool], what: str) -> None:
    """(In a thread) poll ``condition`` until it holds, failing after TIMEOUT."""
    deadline = time.monotonic() + TIMEOUT
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


async def test_staged_messages_appear_only_when_committed_and_only_the_listed_members() -> None:
    async with running_broker() as broker:
        address = url(broker)

        def scenario() -> tuple[list[bytes], list[bytes], dict[str, int]]:
            with (
                BlockingClient(address, name="sub") as reader,
                BlockingClient(address, name="task") as task,
                BlockingClient(address, name="driver") as driver,
                collecting(reader, "events") as received,
            ):
                counts = {}
                # Three attempts: 0/0 failed half-way, 0/1 and 1/0 succeeded.
                for member, rows in (("0/0", 3), ("0/1", 5), ("1/0", 4)):
                    stage = Stage("job-1", member)
                    for i in range(rows):
                        task.publish("events", b"%s:%d" % (member.encode(), i), stage=stage)
                    counts[member] = task.finish_stage(stage, timeout=TIMEOUT)
                # Staged and confirmed, yet nothing is visible (a plain
                # publish after them arrives alone).
                task.publish("events", b"plain")
                wait_for(lambda: len(received) == 1, "the plain message")
                before = [m.payload for m in received]
                outcome = driver.commit("job-1", [("1/0", 4), ("0/1", 5)], timeout=TIMEOUT)
                assert (outcome.status, outcome.messages) == (OutcomeStatus.COMMITTED, 9)
                # A commit sent again is a duplicate: nothing more is routed.
                again = driver.commit("job-1", [("1/0", 4), ("0/1", 5)], timeout=TIMEOUT)
                assert (again.status, again.messages) == (OutcomeStatus.DUPLICATE, 0)
                # A late attempt staging into the committed batch is dropped.
                task.publish("events", b"late", stage=Stage("job-1", "0/2"))
                assert task.finish_stage(Stage("job-1", "0/2"), timeout=TIMEOUT) == 1
                driver.publish("events", b"marker")
                wait_for(lambda: received[-1].payload == b"marker", "the marker")
                return before, [m.payload for m in received[1:]], counts

        before, after, counts = await trio.to_thread.run_sync(scenario)
        assert before == [b"plain"]
        assert counts == {"0/0": 3, "0/1": 5, "1/0": 4}
        # Listed members, in the order listed; each in its publishing order.
        expected = [b"1/0:%d" % i for i in range(4)] + [b"0/1:%d" % i for i in range(5)]
        assert after == [*expected, b"marker"]
        staging = broker.staging
        assert staging.counters.discarded == {
            "aborted": 0,
            "superseded": 3,
            "expired": 0,
            "late": 1,
        }
        assert staging.counters.outcomes["committed"] == 1
        assert staging.counters.outcomes["duplicate"] == 1
        assert staging.batches == {}
        await wait_idle(broker)


async def test_a_count_that_does_not_match_is_refused_and_nothing_is_visible() -> None:
    async with running_broker() as broker:
        address = url(broker)

        def scenario() -> list[bytes]:
            with (
                BlockingClient(address, name="sub") as reader,
                BlockingClient(address, name="task") as task,
                collecting(reader, "events") as received,
            ):
                stage = Stage("job-2", "0/0")
                for i in range(3):
                    task.publish("events", b"%d" % i, stage=stage)
                assert task.finish_stage(stage, timeout=TIMEOUT) == 3
                with pytest.raises(StagingRefused, match="staged 3 publishes, the commit lists 4"):
                    task.commit("job-2", [("0/0", 4)], timeout=TIMEOUT)
                with pytest.raises(StagingRefused, match="listed twice"):
                    task.commit("job-2", [("0/0", 3), ("0/0", 3)], timeout=TIMEOUT)
                aborted = task.abort("job-2", timeout=TIMEOUT)
                assert (aborted.status, aborted.messages) == (OutcomeStatus.ABORTED, 3)
                with pytest.raises(StagingRefused, match="staged 0 publishes"):
                    task.commit("job-2", [("0/0", 3)], timeout=TIMEOUT)
                # Aborting again is harmless; a committed batch cannot be aborted.
                assert task.abort("job-2", timeout=TIMEOUT).messages == 0
                task.commit("job-3", [], timeout=TIMEOUT)
                with pytest.raises(StagingRefused, match="committed"):
                    task.abort("job-3", timeout=TIMEOUT)
                task.publish("events", b"marker")
                wait_for(lambda: bool(received), "the marker")
                return [m.payload for m in received]

        assert await trio.to_thread.run_sync(scenario) == [b"marker"]
        assert broker.staging.counters.discarded["aborted"] == 3
        assert broker.staging.counters.outcomes["refused"] == 4
        await wait_idle(broker)


async def test_a_full_staging_area_ends_the_connection_with_goodbye_3() -> None:
    async with running_broker(staging_limit=4096) as broker:
        address = url(broker)

        def scenario() -> ConnectionLost:
            task = BlockingClient(address, name="task")
            try:
                stage = Stage("big", "0/0")
                with pytest.raises(ConnectionLost) as lost:
                    for _ in range(100):
                        task.publish("events", b"x" * 500, stage=stage, timeout=TIMEOUT)
                    task.finish_stage(stage, timeout=TIMEOUT)
                return lost.value
            finally:
                task.close(flush=False)

        lost = await trio.to_thread.run_sync(scenario)
        assert lost.code == GoodbyeCode.LIMIT_EXCEEDED
        assert "staging area is full" in lost.reason
        assert broker.staging.size <= 4096
        await trio.to_thread.run_sync(partial(_abort, url(broker), "big"))
        assert broker.staging.size == 0
        await wait_idle(broker)


def _abort(address: str, batch: str) -> None:
    with BlockingClient(address, name="cleaner") as client:
        client.abort(batch, timeout=TIMEOUT)


async def test_staging_survives_cut_connections_exactly_once() -> None:
    """A task stages 2000 messages through a proxy cut now and then; its
    count is exact, and the commit makes each message visible once."""
    count = 2000
    async with running_broker(heartbeat=0.5, lease=5.0) as broker, proxied(broker.address) as proxy:
        address = url(broker)
        done = threading.Event()
        published = [0]

        def task() -> int:
            try:
                with BlockingClient(proxy.url, name="task", reconnect=TIMEOUT) as client:
                    stage = Stage("cut", "0/0")
                    for i in range(count):
                        client.publish("events", b"%d" % i, stage=stage, timeout=TIMEOUT)
                        published[0] = i + 1
                    staged = client.finish_stage(stage, timeout=TIMEOUT)
                    assert client.resumes >= 1
                    return staged
            finally:
                done.set()

        async def cut_now_and_then() -> None:
            # Each cut waits for 50 more messages staged since the last.
            await cut_on_progress(proxy, lambda: published[0], done.is_set, step=50)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(cut_now_and_then)
            staged = await trio.to_thread.run_sync(task)
        assert staged == count

        def commit_and_receive() -> list[int]:
            with (
                BlockingClient(address, name="sub") as reader,
                BlockingClient(address, name="driver") as driver,
                collecting(reader, "events") as received,
            ):
                driver.commit("cut", [("0/0", staged)], timeout=TIMEOUT)
                driver.publish("events", b"-1")
                wait_for(lambda: bool(received) and received[-1].payload == b"-1", "the marker")
                return [int(m.payload) for m in received]

        assert await trio.to_thread.run_sync(commit_and_receive) == [*range(count), -1]
        await wait_idle(broker)


def stage_wide(address: str, batch: str, count: int) -> int:
    """(In a thread) stage ``count`` 1 KiB messages numbered ``0000``... on
    topic ``wide`` as member ``0/0`` of ``batch``; returns the count staged."""
    with BlockingClient(address, name="task") as task:
        stage = Stage(batch, "0/0")
        for i in range(count):
            task.publish("wide", b"%04d" % i + b"x" * 1020, stage=stage)
        return task.finish_stage(stage, timeout=TIMEOUT)


async def test_a_commit_into_a_stalled_subscriber_waits_instead_of_growing_memory() -> None:
    """2,000 staged 1 KiB messages are committed to a subscriber that does
    not read: routing stops at the commit account's watermark (the Outcome
    waits), and resumes as the subscriber consumes; all arrive, once."""
    count = 2000
    async with running_broker() as broker:
        address = url(broker)
        high = broker.config.channel_high_watermark

        assert await trio.to_thread.run_sync(stage_wide, address, "big-commit", count) == count
        reader = await trio.to_thread.run_sync(partial(BlockingClient, address, name="sub"))
        driver = await trio.to_thread.run_sync(partial(BlockingClient, address, name="driver"))
        try:
            subscription = await trio.to_thread.run_sync(
                partial(reader.subscribe, "wide", timeout=TIMEOUT)
            )
            outcome: list[object] = []

            def commit() -> None:
                outcome.append(driver.commit("big-commit", [("0/0", count)], timeout=TIMEOUT))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(trio.to_thread.run_sync, commit)
                # Routing stalls: the subscriber reads nothing.
                await wait_until(lambda: broker.staging.counters.committed_messages == count)
                await trio.sleep(0.3)
                (committer,) = [c for c in broker.connections.values() if c.client_name == "driver"]
                assert not outcome, "the commit cannot be routed yet"
                # What routing holds is charged to the committer, and bounded.
                assert 0 < committer.account.debt < 2 * high, (committer.account.debt, high)
                assert broker.staging.account.debt > 0  # the rest waits, staged

                def consume() -> list[int]:
                    return [
                        int(subscription.receive(timeout=TIMEOUT).payload[:4]) for _ in range(count)
                    ]

                received = await trio.to_thread.run_sync(consume)
            assert received == list(range(count))
            assert [o.status for o in outcome] == [OutcomeStatus.COMMITTED]  # type: ignore[attr-defined]
        finally:
            for client in (reader, driver):
                await trio.to_thread.run_sync(partial(client.close, timeout=TIMEOUT))
        await wait_idle(broker)


async def test_a_commit_sent_again_while_the_first_routes_answers_once_it_is_visible() -> None:
    """A second Commit of a batch whose first commit is still routing (a
    client that reconnected, say) is a duplicate, but answered only once the
    batch is visible; and a graceful shutdown lets both finish and answer."""
    count = 1500
    async with running_broker(shutdown_deadline=TIMEOUT) as broker:
        address = url(broker)

        assert await trio.to_thread.run_sync(stage_wide, address, "slow", count) == count
        clients = [
            await trio.to_thread.run_sync(partial(BlockingClient, address, name=name))
            for name in ("sub", "driver", "retry")
        ]
        reader, driver, retry = clients
        try:
            subscription = await trio.to_thread.run_sync(
                partial(reader.subscribe, "wide", timeout=TIMEOUT)
            )
            answers: dict[str, OutcomeStatus] = {}

            def commit(client: BlockingClient, name: str) -> None:
                outcome = client.commit("slow", [("0/0", count)], timeout=TIMEOUT)
                answers[name] = OutcomeStatus(outcome.status)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(trio.to_thread.run_sync, commit, driver, "first")
                await wait_until(lambda: bool(broker.commits_in_flight), what="the commit")
                nursery.start_soon(trio.to_thread.run_sync, commit, retry, "again")
                await wait_until(
                    lambda: broker.staging.counters.outcomes["duplicate"] == 1, what="the retry"
                )
                await trio.sleep(0.3)
                assert answers == {}, "nothing is visible yet: nobody may be told otherwise"
                # A shutdown now waits for the commit before saying Goodbye.
                nursery.start_soon(broker.shutdown)
                await trio.sleep(0.1)
                received = await trio.to_thread.run_sync(
                    lambda: [subscription.receive(timeout=TIMEOUT) for _ in range(count)]
                )
            assert len(received) == count
            assert answers == {"first": OutcomeStatus.COMMITTED, "again": OutcomeStatus.DUPLICATE}
        finally:
            for client in clients:
                await trio.to_thread.run_sync(partial(client.close, flush=False))


async def test_a_cluster_abort_asks_every_broker_even_when_one_refuses() -> None:
    """Broker A already committed its share of a batch, broker B did not: an
    abort refused by A still discards B's share, then says A refused."""
    async with running_broker() as first, running_broker() as second:
        servers = [url(first), url(second)]

        def scenario() -> str:
            with BlockingClusterClient(servers, name="job") as cluster:
                stage = Stage("split", "0/0")
                for i in range(40):  # topics spread over both brokers
                    cluster.publish(f"topic-{i}", b"x", stage=stage)
                counts = cluster.finish_stage(stage, timeout=TIMEOUT)
                assert all(counts.values()), counts
                a = cluster.clients[servers[0]]
                a.commit("split", [("0/0", counts[servers[0]])], timeout=TIMEOUT)
                with pytest.raises(StagingRefused) as refused:
                    cluster.abort("split", timeout=TIMEOUT)
                return refused.value.reason

        assert await trio.to_thread.run_sync(scenario) == "the batch was committed"
        assert first.staging.counters.committed_messages > 0
        assert second.staging.batches == {}
        assert second.staging.counters.discarded["aborted"] > 0


async def test_staged_and_committed_batches_survive_a_broker_restart(tmp_path: Path) -> None:
    """With a data directory: a batch staged before a restart commits after
    it, and a batch committed before it is still answered "duplicate" (the
    exactly-once sink holds across restarts)."""
    data_dir = str(tmp_path)

    def before(address: str) -> None:
        with BlockingClient(address, name="task") as task, BlockingClient(address, name="d") as d:
            for batch in ("done", "open"):
                stage = Stage(batch, "0/0")
                for i in range(3):
                    task.publish("events", b"%s:%d" % (batch.encode(), i), stage=stage)
                assert task.finish_stage(stage, timeout=TIMEOUT) == 3
            outcome = d.commit("done", [("0/0", 3)], timeout=TIMEOUT)
            assert outcome.status == OutcomeStatus.COMMITTED

    def after(address: str) -> tuple[OutcomeStatus, OutcomeStatus, int, list[bytes]]:
        with BlockingClient(address, name="d2") as d, collecting(d, "events") as received:
            again = d.commit("done", [("0/0", 3)], timeout=TIMEOUT)
            opened = d.commit("open", [("0/0", 3)], timeout=TIMEOUT)
            wait_for(lambda: len(received) == 3, "the batch staged before the restart")
            return again.status, opened.status, opened.messages, [m.payload for m in received]

    async with running_broker(data_dir=data_dir) as broker:
        await trio.to_thread.run_sync(before, url(broker))
    async with running_broker(data_dir=data_dir) as broker:
        again, opened, messages, payloads = await trio.to_thread.run_sync(after, url(broker))
    assert again == OutcomeStatus.DUPLICATE
    assert (opened, messages) == (OutcomeStatus.COMMITTED, 3)
    assert payloads == [b"open:%d" % i for i in range(3)]


async def test_a_commit_to_a_topic_whose_log_cannot_be_opened_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch staged before a restart, committed while its topic's log
    cannot be opened (no file descriptor left, an unreadable directory):
    the TopicUnavailable raised while routing ended the whole broker. The
    commit is now refused before anything changes, and succeeds later."""
    from broker.server.storage._topic_logs import TopicLogs, TopicUnavailable

    data_dir = str(tmp_path)

    def stage(address: str) -> None:
        with BlockingClient(address, name="task") as task:
            staged = Stage("job", "0/0")
            for i in range(3):
                task.publish("events", b"%d" % i, stage=staged)
            assert task.finish_stage(staged, timeout=TIMEOUT) == 3

    def commit(address: str) -> tuple[str, OutcomeStatus, list[bytes]]:
        with BlockingClient(address, name="driver") as driver:
            with pytest.raises(StagingRefused) as refused:
                driver.commit("job", [("0/0", 3)], timeout=TIMEOUT)
            monkeypatch.undo()  # the log can be opened again
            with collecting(driver, "events") as received:
                outcome = driver.commit("job", [("0/0", 3)], timeout=TIMEOUT)
                wait_for(lambda: len(received) == 3, "the batch")
            return str(refused.value), outcome.status, [m.payload for m in received]

    async with running_broker(data_dir=data_dir) as broker:
        await trio.to_thread.run_sync(stage, url(broker))
    opened = TopicLogs.open

    def failing(logs: TopicLogs, name: str) -> Any:
        if name == "events":
            raise TopicUnavailable("the broker cannot open the log of topic 'events' now: EMFILE")
        return opened(logs, name)

    monkeypatch.setattr(TopicLogs, "open", failing)
    async with running_broker(data_dir=data_dir) as broker:
        why, status, payloads = await trio.to_thread.run_sync(commit, url(broker))
    assert "cannot open the log of topic 'events' now: EMFILE" in why
    assert status == OutcomeStatus.COMMITTED
    assert payloads == [b"0", b"1", b"2"]


async def test_the_committing_mark_is_written_before_routing_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kill -9 while a commit routes must leave the journal's "committing"
    record, so the next start completes the commit. The mark used to stay in
    the journal's buffer until routing ended: a kill meanwhile left no trace
    (a 200,000-row commit killed half a second in was stored twice without
    a word)."""
    import broker.server.staging._commit as commit_module
    from broker.server.staging._area import SPACE_COMMITTING

    seen: list[tuple[bool, int]] = []
    real_route = commit_module.route_commit

    async def route_commit(host: Any, account: Any, publishes: Any, **options: Any) -> None:
        journal = host.logs.journal
        seen.append((journal.pending, len(journal.items(SPACE_COMMITTING))))
        await real_route(host, account, publishes, **options)

    monkeypatch.setattr(commit_module, "route_commit", route_commit)

    def commit(address: str) -> OutcomeStatus:
        with BlockingClient(address, name="task") as task:
            stage = Stage("b", "0/0")
            task.publish("events", b"x", stage=stage)
            assert task.finish_stage(stage, timeout=TIMEOUT) == 1
            return task.commit("b", [("0/0", 1)], timeout=TIMEOUT).status

    async with running_broker(data_dir=str(tmp_path)) as broker:
        status = await trio.to_thread.run_sync(commit, url(broker))
    assert status == OutcomeStatus.COMMITTED
    assert seen == [(False, 1)]  # written (nothing pending), the mark in it
