"""The commit registry in a real JetStream KV bucket (``broker-commits``):
a batch committed through a front end is answered "duplicate" by another
front end started on a new data directory over the same cluster, and its
rows are in the topic once; the bucket keeps at most ``staging_remember``
values, the oldest dropped first, and a front end with another limit
gives the bucket its own.

One real ``nats-server`` (the ``nats_url`` fixture). Deadlines are hang
guards only: nothing waits for a time to pass.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from broker.client import StagingRefused, open_client
from broker.config import BrokerConfig
from broker.nats import JetStream, open_nats
from broker.protocol import OutcomeStatus
from broker.server.sessions._kv_bucket import open_record_bucket
from broker.server.staging._registry import registry_key
from broker.server.staging._stream import STREAM, staged_subject
from tests.server.helpers import make_config, running_broker, url
from tests.server.test_commit_registry import stage_rows

#: Hang guard of each test (seconds).
DEADLINE = 120.0
MEMBERS = [("0/0", 3), ("1/0", 2)]


async def test_a_retried_commit_on_a_new_disk_is_a_duplicate(nats_url: str, tmp_path: Path) -> None:
    def config(data_dir: str) -> BrokerConfig:
        return make_config(
            data_dir=str(tmp_path / data_dir),
            cluster=nats_url,
            cluster_replicas=1,
            cluster_unsafe_sync=True,  # (one server: no system account to ask)
        )

    with trio.fail_after(DEADLINE):
        async with running_broker(config("a")) as first, open_client(url(first)) as task:
            await stage_rows(task, MEMBERS)
            outcome = await task.commit("job-1", MEMBERS)
            assert outcome.status == OutcomeStatus.COMMITTED
        async with running_broker(config("b")) as second, open_client(url(second)) as driver:
            again = await driver.commit("job-1", MEMBERS)
            assert again.status == OutcomeStatus.DUPLICATE
            with pytest.raises(StagingRefused):
                await driver.abort("job-1")
            await driver.publish("orders", b"end")  # (not staged: the last record)
            async with driver.subscribe("orders", start="earliest") as subscription:
                read: list[bytes] = []
                while not read or read[-1] != b"end":
                    read.append((await subscription.receive()).payload)
    staged = [b"%s:%d" % (member.encode(), row) for member, rows in MEMBERS for row in range(rows)]
    assert read == [*staged, b"end"]  # (once each, in commit order)


async def test_a_batch_staged_on_a_lost_disk_commits_from_the_staging_stream(
    nats_url: str, tmp_path: Path
) -> None:
    """Rows staged through a front end whose disk is then lost (a new data
    directory) are in JetStream's staging stream: the commit through the
    new front end makes each visible once, and drops them from the stream."""

    def config(data_dir: str) -> BrokerConfig:
        return make_config(
            data_dir=str(tmp_path / data_dir),
            cluster=nats_url,
            cluster_replicas=1,
            cluster_unsafe_sync=True,  # (one server: no system account to ask)
        )

    with trio.fail_after(DEADLINE):
        async with running_broker(config("a")) as first, open_client(url(first)) as task:
            await stage_rows(task, MEMBERS, "job-2", "lost-disk")
        subject = staged_subject((None, "job-2"), None)
        async with open_nats(nats_url, name="test") as client:
            assert await JetStream(client).get_last_msg(STREAM, subject) is not None
        async with running_broker(config("b")) as second, open_client(url(second)) as driver:
            outcome = await driver.commit("job-2", MEMBERS)
            assert (outcome.status, outcome.messages) == (OutcomeStatus.COMMITTED, 5)
            await driver.publish("lost-disk", b"end")
            async with driver.subscribe("lost-disk", start="earliest") as subscription:
                read: list[bytes] = []
                while not read or read[-1] != b"end":
                    read.append((await subscription.receive()).payload)
            async with open_nats(nats_url, name="test") as client:
                js = JetStream(client)
                while await js.get_last_msg(STREAM, subject) is not None:  # noqa: ASYNC110 (polled)
                    await trio.sleep(0.05)  # (dropped once the commit is noted)
    staged = [b"%s:%d" % (member.encode(), row) for member, rows in MEMBERS for row in range(rows)]
    assert read == [*staged, b"end"]  # (once each, in commit order)


async def test_the_bucket_keeps_its_limit_of_values(nats_url: str) -> None:
    async with open_nats(nats_url, name="test") as client:
        js = JetStream(client)
        bucket = await open_record_bucket(js, 1, "test-commits", max_values=3)
        for n in range(5):
            await bucket.write(f"c.{n}", b"%d" % n, 0)
        assert [await bucket.read(f"c.{n}") is not None for n in range(5)] == [
            False,
            False,
            True,
            True,
            True,
        ]
        wider = await open_record_bucket(js, 1, "test-commits", max_values=10)
        info = await js.stream_info("KV_test-commits")
        assert info.config.max_msgs == 10
        await wider.write("c.5", b"5", 0)
        assert await wider.read("c.2") is not None
        assert registry_key((None, "job-1")).startswith("c.")
