"""Staged publishing with the trio client and the async cluster client: the
same API as the blocking client's (``publish(stage=)``, ``finish_stage``,
``commit``, ``abort``), over loopback; ``tests/server/test_staging.py``
covers the blocking client and the broker's side."""

from __future__ import annotations

from contextlib import AsyncExitStack

import pytest
import trio

from broker.client import ClientError, StagingRefused, open_client, open_cluster_client, route
from broker.protocol import OutcomeStatus, Stage
from tests.server.helpers import TIMEOUT, running_broker, url, wait_idle


async def test_staged_messages_appear_only_once_committed() -> None:
    async with (
        running_broker() as broker,
        open_client(url(broker), name="sub") as reader,
        open_client(url(broker), name="task") as task,
        open_client(url(broker), name="driver") as driver,
        reader.subscribe("events") as subscription,
    ):
        counts = {}
        for member, rows in (("0/0", 3), ("0/1", 5)):
            stage = Stage("job-1", member)
            for row in range(rows):
                await task.publish("events", b"%s:%d" % (member.encode(), row), stage=stage)
            counts[member] = await task.finish_stage(stage)
        assert counts == {"0/0": 3, "0/1": 5}
        assert task.statistics()["topics"] == 0  # the stages' handles are let go
        with trio.move_on_after(0.2):
            await subscription.receive()
            pytest.fail("a staged message was routed before its commit")
        outcome = await driver.commit("job-1", [("0/1", 5)])
        assert outcome.status == OutcomeStatus.COMMITTED
        with trio.fail_after(TIMEOUT):
            got = [(await subscription.receive()).payload for _ in range(5)]
        assert got == [b"0/1:%d" % row for row in range(5)]
        again = await driver.commit("job-1", [("0/1", 5)])
        assert again.status == OutcomeStatus.DUPLICATE  # idempotent
        with pytest.raises(StagingRefused):
            await driver.abort("job-1")  # committed already


async def test_a_wrong_count_refuses_the_commit_and_abort_discards() -> None:
    async with (
        running_broker() as broker,
        open_client(url(broker), name="task") as task,
    ):
        stage = Stage("job-2", "m")
        await task.publish("t", b"staged", stage=stage)
        assert await task.finish_stage(stage) == 1
        with pytest.raises(StagingRefused):
            await task.commit("job-2", [("m", 2)])
        aborted = await task.abort("job-2")
        assert aborted.status == OutcomeStatus.ABORTED and aborted.messages == 1


async def test_the_async_cluster_client_stages_on_every_broker() -> None:
    async with AsyncExitStack() as stack:
        brokers = [await stack.enter_async_context(running_broker()) for _ in range(2)]
        servers = [url(b) for b in brokers]
        topics = [f"t{i}" for i in range(8)]
        assert {route(t, servers) for t in topics} == set(servers)
        reader = await stack.enter_async_context(open_cluster_client(servers, name="sub"))
        task = await stack.enter_async_context(open_cluster_client(servers, name="task"))
        subscriptions = {t: await stack.enter_async_context(reader.subscribe(t)) for t in topics}
        stage = Stage("job-3", "p0")
        for topic in topics:
            await task.publish(topic, topic.encode(), stage=stage)
        per_server = await task.finish_stage(stage)
        assert sum(per_server.values()) == len(topics) and set(per_server) == set(servers)
        outcomes = await task.commit("job-3", {"p0": per_server})
        assert {o.status for o in outcomes.values()} == {OutcomeStatus.COMMITTED}
        with trio.fail_after(TIMEOUT):
            for topic, subscription in subscriptions.items():
                assert (await subscription.receive()).payload == topic.encode()
        aborted = await task.abort("job-4")  # nothing staged: aborted everywhere
        assert set(aborted) == set(servers)
        await stack.aclose()
        for broker in brokers:
            await wait_idle(broker)


async def test_counts_naming_a_broker_the_client_does_not_know_commit_nothing() -> None:
    """Counts from ``finish_stage`` keyed by addresses that are no longer the
    client's (the workers' direct ports changed at a restart) used to be
    dropped: each broker got a commit without the members, discarded what
    was staged and answered "committed"."""
    async with AsyncExitStack() as stack:
        brokers = [await stack.enter_async_context(running_broker()) for _ in range(2)]
        servers = [url(b) for b in brokers]
        topics = [f"t{i}" for i in range(8)]
        task = await stack.enter_async_context(open_cluster_client(servers, name="task"))
        stage = Stage("job-5", "p0")
        for topic in topics:
            await task.publish(topic, topic.encode(), stage=stage)
        per_server = await task.finish_stage(stage)
        moved = {f"127.0.0.1:{9 + n}": count for n, count in enumerate(per_server.values())}
        with pytest.raises(ClientError, match="nothing was committed"):
            await task.commit("job-5", {"p0": moved})
        # Still staged, whole: the right counts commit it all.
        outcomes = await task.commit("job-5", {"p0": per_server})
        assert {o.status for o in outcomes.values()} == {OutcomeStatus.COMMITTED}
        assert sum(o.messages for o in outcomes.values()) == len(topics)
