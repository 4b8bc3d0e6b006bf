"""``broker.delivery = "exactly-once"`` with real local Spark against a real
broker: retried tasks, failed jobs and a streaming query restarted from its
checkpoint publish every row once, or not at all."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from broker.client import BlockingClient, BlockingSubscription

from .conftest import TIMEOUT
from .test_sink import flaky_frame, fresh_topic


def drain(subscription: BlockingSubscription, expected: int) -> list[bytes]:
    """Everything delivered: ``expected`` messages, then whatever else comes
    within half a second (a duplicate would)."""
    payloads = [subscription.receive(timeout=TIMEOUT).payload for _ in range(expected)]
    deadline = time.monotonic() + 0.5
    while time.monotonic() < deadline:
        try:
            payloads.append(subscription.receive(timeout=0.05).payload)
        except TimeoutError:
            continue
    return payloads


def exactly_once(frame: Any, address: str, topic: str) -> Any:
    return (
        frame.write.format("broker")
        .option("broker.servers", address)
        .option("topic", topic)
        .option("broker.delivery", "exactly-once")
        .mode("append")
    )


def test_a_retried_task_publishes_each_row_once(spark: Any, broker_address: str) -> None:
    """Partition 0's first attempt fails after 50 of its rows were staged
    (local[2,2] retries it): only the successful attempts are committed."""
    topic = fresh_topic()
    flaky = flaky_frame(spark)
    with BlockingClient(broker_address) as client, client.subscribe(topic) as subscription:
        exactly_once(flaky, broker_address, topic).save()
        payloads = drain(subscription, 200)
    assert sorted(payloads) == sorted(b"r%d" % i for i in range(200))


def test_a_failed_job_publishes_nothing(spark: Any, broker_address: str) -> None:
    """Every attempt of partition 1 fails after staging rows: the job fails,
    the driver aborts, and no row of any partition is ever visible."""
    from pyspark import TaskContext

    topic = fresh_topic()

    def always_fail(rows: Any) -> Any:
        for index, row in enumerate(rows):
            if TaskContext.get().partitionId() == 1 and index == 20:
                raise RuntimeError("injected failure")
            yield row

    frame = spark.createDataFrame([(f"r{i}",) for i in range(100)], "value string")
    broken = frame.repartition(2).rdd.mapPartitions(always_fail).toDF(frame.schema)
    with BlockingClient(broker_address) as client, client.subscribe(topic) as subscription:
        with pytest.raises(Exception, match="injected failure"):
            exactly_once(broken, broker_address, topic).save()
        client.publish(topic, b"marker")
        assert subscription.receive(timeout=TIMEOUT).payload == b"marker"


@pytest.mark.parametrize("delivery", ["exactly-once", "at-least-once"])
def test_a_restarted_streaming_query_publishes_no_batch_twice(
    spark: Any,
    broker_address: str,
    tmp_path: Path,
    delivery: str,
) -> None:
    """A query commits batch 0 to the broker, but (as if it crashed right
    then) its checkpoint never records the commit; restarted from the
    checkpoint it runs batch 0 again. Exactly once, the broker answers that
    the batch was committed and nothing is published twice; at least once
    (for contrast), the batch is published again."""
    topic = fresh_topic()
    source = tmp_path / "in"
    source.mkdir()
    (source / "a.txt").write_text("\n".join(f"line {i}" for i in range(100)) + "\n")
    checkpoint = tmp_path / "checkpoint"

    def run_query() -> int:
        """Run to the end of the input; returns how many rows it processed."""
        stream = spark.readStream.format("text").load(str(source))
        query = (
            stream.writeStream.format("broker")
            .option("broker.servers", broker_address)
            .option("topic", topic)
            .option("broker.delivery", delivery)
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(TIMEOUT)
        assert query.exception() is None
        return sum(progress["numInputRows"] for progress in query.recentProgress)

    lines = sorted(b"line %d" % i for i in range(100))
    with BlockingClient(broker_address) as client, client.subscribe(topic) as subscription:
        assert run_query() == 100
        first = drain(subscription, 100)
        # Forget that batch 0 was committed: Spark will run it again.
        commit_log = checkpoint / "commits" / "0"
        assert commit_log.exists()
        commit_log.unlink()
        (checkpoint / "commits" / ".0.crc").unlink(missing_ok=True)
        assert run_query() == 100  # batch 0 ran again, all of it
        client.publish(topic, b"marker")
        second = drain(subscription, 1 if delivery == "exactly-once" else 101)
    assert sorted(first) == lines
    if delivery == "exactly-once":
        assert second == [b"marker"]
    else:
        assert sorted(second) == sorted([*lines, b"marker"])
