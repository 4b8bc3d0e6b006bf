"""The ``broker`` data source with real local Spark against a real broker."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from broker.client import BlockingClient, BlockingSubscription

from .conftest import TIMEOUT

_topics = itertools.count()


def fresh_topic() -> str:
    return f"spark-{next(_topics)}"


def receive(subscription: BlockingSubscription, count: int) -> list[Any]:
    return [subscription.receive(timeout=TIMEOUT) for _ in range(count)]


def assert_nothing_more(subscription: BlockingSubscription) -> None:
    with pytest.raises(TimeoutError):
        subscription.receive(timeout=0.5)


def test_batch_rows_arrive_with_keys_and_headers(spark: Any, broker_address: str) -> None:
    topic = fresh_topic()
    rows = [(f"value {i}", f"k{i % 7}".encode(), [("n", str(i).encode())]) for i in range(2000)]
    frame = spark.createDataFrame(
        rows, "value string, key binary, headers array<struct<key:string,value:binary>>"
    ).repartition(4)
    with BlockingClient(broker_address) as client, client.subscribe(topic) as subscription:
        (
            frame.write.format("broker")
            .option("broker.servers", broker_address)
            .option("topic", topic)
            .mode("append")
            .save()
        )
        messages = receive(subscription, len(rows))
        assert_nothing_more(subscription)
    got = sorted((m.payload.decode(), m.key, m.headers) for m in messages)
    assert got == sorted((v, k, h) for v, k, h in rows)


def test_a_topic_column_routes_each_row(spark: Any, broker_address: str) -> None:
    first, second = fresh_topic(), fresh_topic()
    frame = spark.createDataFrame(
        [(first if i % 3 else second, bytearray(b"%d" % i)) for i in range(300)],
        "topic string, value binary",
    )
    with (
        BlockingClient(broker_address) as client,
        client.subscribe(first) as one,
        client.subscribe(second) as two,
    ):
        frame.write.format("broker").option("broker.servers", broker_address).mode("append").save()
        a = {int(m.payload) for m in receive(one, 200)}
        b = {int(m.payload) for m in receive(two, 100)}
    assert a == {i for i in range(300) if i % 3}
    assert b == {i for i in range(300) if not i % 3}


def flaky_frame(spark: Any, rows: int = 200) -> Any:
    """``rows`` rows ``r0``... in two partitions, whose partition 0 fails on
    its first attempt after 50 rows (``local[2,2]`` retries it)."""
    from pyspark import TaskContext

    def fail_once(rows: Any) -> Any:
        for index, row in enumerate(rows):
            context = TaskContext.get()
            if context.partitionId() == 0 and context.attemptNumber() == 0 and index == 50:
                raise RuntimeError("injected failure after 50 rows")
            yield row

    frame = spark.createDataFrame([(f"r{i}",) for i in range(rows)], "value string")
    return frame.repartition(2).rdd.mapPartitions(fail_once).toDF(frame.schema)


def run_script(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Run a Python script in a new process (its own Spark application, with
    the workers on this interpreter); fails the test unless it exits 0."""
    environment = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
        **env,
    }
    done = subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_a_retried_task_publishes_again_at_least_once(spark: Any, broker_address: str) -> None:
    """A task that fails after publishing part of its rows is retried
    (local[2,2]); under at-least-once its first rows arrive twice."""
    topic = fresh_topic()
    flaky = flaky_frame(spark)
    with BlockingClient(broker_address) as client, client.subscribe(topic) as subscription:
        (
            flaky.write.format("broker")
            .option("broker.servers", broker_address)
            .option("topic", topic)
            .mode("append")
            .save()
        )
        # Partition 0's first attempt published some rows, possibly all 50,
        # before it failed (rows are written as they come); the retry
        # published its whole partition again.
        payloads: list[bytes] = []
        deadline = time.monotonic() + TIMEOUT
        while len(set(payloads)) < 200 and time.monotonic() < deadline:
            payloads.append(subscription.receive(timeout=TIMEOUT).payload)
        time.sleep(0.5)
        while subscription.pending:
            payloads.append(subscription.receive_nowait().payload)
    assert set(payloads) == {b"r%d" % i for i in range(200)}
    # At least once: nothing lost; the failed attempt's rows may arrive twice.
    assert 200 <= len(payloads) <= 250


def test_streaming_batches_are_published(spark: Any, broker_address: str, tmp_path: Path) -> None:
    topic = fresh_topic()
    source = tmp_path / "in"
    source.mkdir()
    (source / "a.txt").write_text("\n".join(f"line {i}" for i in range(100)) + "\n")
    stream = spark.readStream.format("text").load(str(source))
    with BlockingClient(broker_address) as client, client.subscribe(topic) as subscription:
        query = (
            stream.writeStream.format("broker")
            .option("broker.servers", broker_address)
            .option("topic", topic)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(TIMEOUT)
        got = {m.payload for m in receive(subscription, 100)}
        assert_nothing_more(subscription)
    assert got == {b"line %d" % i for i in range(100)}


@pytest.mark.parametrize(
    ("columns", "options", "message"),
    [
        ("key string", {"topic": "t"}, 'needs a "value" column'),
        ("value int", {"topic": "t"}, 'column "value" must be binary or string, not int'),
        ("value string, key int", {"topic": "t"}, 'column "key" must be binary or string'),
        ("value string, headers array<string>", {"topic": "t"}, 'column "headers" must be'),
        ("value string", {}, 'set the "topic" option or give the DataFrame a "topic" column'),
        ("value string, topic int", {}, 'column "topic" must be string'),
        ("value string", {"topic": "t", "broker.delivery": "never"}, '"broker.delivery" must be'),
        ("value string", {"topic": "t", "broker.tls": "maybe"}, '"broker.tls" must be'),
        ("value string", {"topic": "t", "broker.colour": "red"}, "unknown option"),
        ("value string", {"topic": "t", "broker.reconnect": "-1"}, '"broker.reconnect" must be'),
    ],
)
def test_bad_schemas_and_options_fail_before_any_task(
    spark: Any, broker_address: str, columns: str, options: dict[str, str], message: str
) -> None:
    from pyspark.errors import AnalysisException, PySparkException

    frame = spark.createDataFrame([], columns)
    writer = frame.write.format("broker").option("broker.servers", broker_address).mode("append")
    for name, value in options.items():
        writer = writer.option(name, value)
    with pytest.raises((AnalysisException, PySparkException)) as caught:
        writer.save()
    assert message in str(caught.value)


def test_missing_servers_and_overwrite_are_refused(spark: Any) -> None:
    from pyspark.errors import AnalysisException, PySparkException

    frame = spark.createDataFrame([("x",)], "value string")
    with pytest.raises((AnalysisException, PySparkException), match=r"broker\.servers"):
        frame.write.format("broker").option("topic", "t").mode("append").save()
    with pytest.raises((AnalysisException, PySparkException), match='mode\\("append"\\)'):
        frame.write.format("broker").option("broker.servers", "x:1").option("topic", "t").mode(
            "overwrite"
        ).save()


def test_an_unreachable_broker_fails_the_job_with_the_reason(spark: Any) -> None:
    frame = spark.createDataFrame([("x",)], "value string")
    with pytest.raises(Exception, match=r"cannot connect to 127\.0\.0\.1:1"):
        (
            frame.write.format("broker")
            .option("broker.servers", "127.0.0.1:1")
            .option("broker.timeout", "5")
            .option("topic", "t")
            .mode("append")
            .save()
        )


# pyspark's RDD.collect (behind foreachPartition) leaves its result socket to the
# garbage collector (pyspark/util.py _load_from_socket): not a leak of ours.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_foreach_partition_helper(spark: Any, broker_address: str) -> None:
    import functools

    from broker.spark import publish_partition

    topic = fresh_topic()
    frame = spark.createDataFrame(
        [(f"p{i}", f"k{i}") for i in range(100)], "value string, key string"
    )
    with BlockingClient(broker_address) as client, client.subscribe(topic) as subscription:
        frame.foreachPartition(
            functools.partial(publish_partition, servers=broker_address, topic=topic)
        )
        got = {(m.payload, m.key) for m in receive(subscription, 100)}
    assert got == {(b"p%d" % i, b"k%d" % i) for i in range(100)}


def test_a_slow_subscriber_slows_the_job_and_memory_stays_flat(
    spark: Any, broker_process: tuple[str, Any]
) -> None:
    """Backpressure reaches Spark: a reliable subscriber taking 2,000 rows/s
    paces a 10,000-row job, and the broker's memory does not grow with it."""
    import threading

    from .conftest import rss_bytes

    address, process = broker_process
    topic = fresh_topic()
    rows, rate = 10_000, 2_000
    frame = spark.createDataFrame(
        [(b"%05d" % i + b"x" * 995,) for i in range(rows)], "value binary"
    )
    frame = frame.repartition(2).cache()
    frame.count()
    before = rss_bytes(process.pid)
    peaks = [before]
    received: list[bytes] = []
    done = threading.Event()

    def consume() -> None:
        started = time.monotonic()
        for i in range(rows):
            received.append(subscription.receive(timeout=TIMEOUT).payload[:5])
            ahead = started + (i + 1) / rate - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)

    def sample() -> None:
        while not done.wait(0.1):
            peaks.append(rss_bytes(process.pid))

    with BlockingClient(address) as client, client.subscribe(topic) as subscription:
        threads = [threading.Thread(target=consume), threading.Thread(target=sample)]
        for thread in threads:
            thread.start()
        started = time.monotonic()
        # (Spark finds the registered source from the session's own thread.)
        (
            frame.write.format("broker")
            .option("broker.servers", address)
            .option("topic", topic)
            .mode("append")
            .save()
        )
        elapsed = time.monotonic() - started
        done.set()
        for thread in threads:
            thread.join(TIMEOUT)
    peak = max(peaks)
    assert sorted(received) == [b"%05d" % i for i in range(rows)]
    # The job could not finish before the subscriber had taken nearly all of it:
    # what the broker and the windows hold is a small fraction of 10 MB.
    assert elapsed > 0.7 * rows / rate
    assert peak - before < 64 * 1024 * 1024


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # as above
def test_foreach_partition_refuses_columns_it_cannot_publish(
    spark: Any, broker_address: str
) -> None:
    import functools

    from broker.spark import publish_partition

    frame = spark.createDataFrame([(5,)], "value int")
    with pytest.raises(Exception, match='column "value" must be binary or string, not int'):
        frame.foreachPartition(
            functools.partial(publish_partition, servers=broker_address, topic="t", tls=False)
        )
