"""``spark.read(Stream).format("broker")`` with real local Spark against a
real broker process that keeps topic logs: batch reads, starting and
ending offsets, a missing topic, data loss with and without
``failOnDataLoss``, and a streaming pipeline broker -> Spark -> broker that
is killed mid-way and restarted from its checkpoint, exactly once."""

from __future__ import annotations

import datetime
import itertools
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from broker.client import BlockingClient

from .conftest import TIMEOUT

_serial = itertools.count()


def topic(prefix: str = "src") -> str:
    return f"{prefix}.{next(_serial)}-{uuid.uuid4().hex[:6]}"


def publish(address: str, name: str, count: int, *, size: int = 0, first: int = 0) -> None:
    """Publish ``count`` records ``id=<n>`` (padded to ``size`` bytes), keyed."""
    with BlockingClient(address, name="test-publisher") as client:
        for n in range(first, first + count):
            value = (b"id=%d;" % n).ljust(size, b"x")
            client.publish(name, value, key=b"k%d" % (n % 10), headers=[("n", b"%d" % n)])
        client.flush(timeout=TIMEOUT)


def read(spark: Any, address: str, **options: str) -> Any:
    reader = spark.read.format("broker").option("broker.servers", address)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def assert_times(rows: list[Any], since: datetime.datetime) -> None:
    """Every row has its record's time: received during the test (its
    start, to the millisecond, up to now), never decreasing along a topic."""
    assert rows
    now = datetime.datetime.now(datetime.UTC)
    by_topic: dict[str, list[Any]] = {}
    for row in rows:
        by_topic.setdefault(row.topic, []).append(row)
    for topic_rows in by_topic.values():
        ordered = sorted(topic_rows, key=lambda r: r.offset)
        times = [_aware(r.timestamp) for r in ordered]
        assert None not in times
        assert since.replace(microsecond=since.microsecond // 1000 * 1000) <= times[0]
        assert times[-1] <= now
        assert times == sorted(times)


def _aware(value: datetime.datetime) -> datetime.datetime:
    """A timestamp Spark handed back (a naive local time) as an aware one."""
    assert isinstance(value, datetime.datetime)
    return value if value.tzinfo is not None else value.astimezone()


def ids(rows: list[Any]) -> list[int]:
    return sorted(int(bytes(row.value).split(b";")[0].removeprefix(b"id=")) for row in rows)


def test_a_batch_read_of_100k_records_equals_what_was_published(
    spark: Any, log_broker: str
) -> None:
    name = topic()
    since = datetime.datetime.now(datetime.UTC)
    publish(log_broker, name, 100_000)
    frame = read(spark, log_broker, subscribe=name, minPartitions="4")
    assert frame.rdd.getNumPartitions() == 4  # the range is split: four tasks read in parallel
    rows = frame.collect()
    assert len(rows) == 100_000
    assert [row.offset for row in sorted(rows, key=lambda r: r.offset)] == list(range(1, 100_001))
    by_offset = {row.offset: row for row in rows}
    for offset in (1, 50_000, 100_000):
        row = by_offset[offset]
        assert bytes(row.value) == b"id=%d;" % (offset - 1)
        assert bytes(row.key) == b"k%d" % ((offset - 1) % 10)
        assert (row.topic, row.partition) == (name, 0)
        assert [(h.key, bytes(h.value)) for h in row.headers] == [("n", b"%d" % (offset - 1))]
    assert ids(rows) == list(range(100_000))
    assert_times(rows, since)
    assert frame.columns == ["key", "value", "topic", "partition", "offset", "timestamp", "headers"]


def test_starting_and_ending_offsets(spark: Any, engine_broker: str) -> None:
    log_broker = engine_broker
    name = topic()
    publish(log_broker, name, 100)
    assert ids(read(spark, log_broker, subscribe=name).collect()) == list(range(100))
    assert ids(read(spark, log_broker, subscribe=name, startingOffsets="earliest").collect()) == (
        list(range(100))
    )
    later = read(spark, log_broker, subscribe=name, startingOffsets=f'{{"{name}": {{"0": 51}}}}')
    assert [r.offset for r in later.orderBy("offset").collect()] == list(range(51, 101))
    window = read(
        spark,
        log_broker,
        subscribe=name,
        startingOffsets=f'{{"{name}": {{"0": -2}}}}',
        endingOffsets=f'{{"{name}": {{"0": 11}}}}',
    )
    assert [r.offset for r in window.orderBy("offset").collect()] == list(range(1, 11))
    with pytest.raises(Exception, match="not for batch queries"):
        read(spark, log_broker, subscribe=name, startingOffsets="latest").collect()
    with pytest.raises(Exception, match="gives no offset for"):
        read(spark, log_broker, subscribe=name, startingOffsets='{"other": {"0": 1}}').collect()


def test_a_pattern_reads_every_matching_topic(spark: Any, log_broker: str) -> None:
    prefix = f"pat{uuid.uuid4().hex[:6]}"
    since = datetime.datetime.now(datetime.UTC)
    publish(log_broker, f"{prefix}.a", 5)
    publish(log_broker, f"{prefix}.b", 7)
    publish(log_broker, f"{prefix}x.c", 3)  # not matched: another first token
    publish(log_broker, f"{prefix}.a.deep", 2)  # not matched: '*' is exactly one token
    rows = read(spark, log_broker, subscribePattern=f"{prefix}.*").collect()
    assert sorted({(r.topic, len([x for x in rows if x.topic == r.topic])) for r in rows}) == [
        (f"{prefix}.a", 5),
        (f"{prefix}.b", 7),
    ]
    assert_times(rows, since)


def test_a_missing_topic_reads_nothing_and_is_not_created(spark: Any, log_broker: str) -> None:
    name = topic("missing")
    assert read(spark, log_broker, subscribe=name).count() == 0
    with BlockingClient(log_broker) as client:
        assert client.offsets().get(name) is None


def test_a_stream_starting_at_latest_reads_only_what_comes_after(
    spark: Any, log_broker: str, tmp_path: Path
) -> None:
    name = topic()
    publish(log_broker, name, 20)
    output = tmp_path / "out"

    def run() -> None:
        query = (
            spark.readStream.format("broker")
            .option("broker.servers", log_broker)
            .option("subscribe", name)
            .load()
            .writeStream.format("parquet")
            .option("path", str(output))
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(TIMEOUT)
        assert query.exception() is None

    run()
    assert spark.read.parquet(str(output)).count() == 0
    since = datetime.datetime.now(datetime.UTC)
    publish(log_broker, name, 10, first=20)
    run()  # from the checkpoint: exactly the 10 new records
    rows = spark.read.parquet(str(output)).collect()
    assert ids(rows) == list(range(20, 30))
    assert_times(rows, since)


def test_a_stream_starting_past_a_topics_end_says_so(
    spark: Any, log_broker: str, tmp_path: Path
) -> None:
    """It used to say the log ended "before the 500 this query had reached
    (was its log deleted?)" of a query that had reached nothing."""
    name = topic()
    publish(log_broker, name, 100)
    query = (
        spark.readStream.format("broker")
        .option("broker.servers", log_broker)
        .option("subscribe", name)
        .option("startingOffsets", f'{{"{name}": {{"0": 500}}}}')
        .load()
        .writeStream.format("parquet")
        .option("path", str(tmp_path / "out"))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    with pytest.raises(Exception, match=r"starts topic .* at offset 500, past its end"):
        query.awaitTermination(TIMEOUT)


def lossy_topic(address: str) -> tuple[str, int]:
    """A topic whose first records retention deleted: its name and first offset kept."""
    name = topic("lossy")
    publish(address, name, 3000, size=1000)
    with BlockingClient(address) as client:
        first, end = client.offsets([name])[name]
    assert end == 3001
    assert first > 1
    return name, first


def test_data_loss_fails_the_query_naming_topic_and_range(spark: Any, log_broker: str) -> None:
    name, first = lossy_topic(log_broker)
    start = f'{{"{name}": {{"0": 1}}}}'
    with pytest.raises(Exception) as failure:
        read(spark, log_broker, subscribe=name, startingOffsets=start).count()
    message = str(failure.value)
    assert f"topic {name!r}: records 1 to {first - 1}" in message
    assert "failOnDataLoss" in message
    # From "earliest" nothing is lost: it starts at the first record kept.
    assert read(spark, log_broker, subscribe=name).count() == 3001 - first


def test_without_fail_on_data_loss_lost_records_are_skipped(spark: Any, log_broker: str) -> None:
    name, first = lossy_topic(log_broker)
    rows = read(
        spark,
        log_broker,
        subscribe=name,
        startingOffsets=f'{{"{name}": {{"0": 1}}}}',
        failOnDataLoss="false",
        minPartitions="3",  # the first partition's range is lost entirely, the next in part
    ).collect()
    assert [r.offset for r in sorted(rows, key=lambda r: r.offset)] == list(range(first, 3001))


def test_a_killed_and_restarted_pipeline_writes_every_record_exactly_once(
    spark: Any, log_broker: str, tmp_path: Path
) -> None:
    """broker -> Spark -> broker, exactly once: the query is stopped in the
    middle of its micro-batches; as if it had crashed right after the
    broker committed a batch, its checkpoint also forgets that batch's
    commit. Restarted from the checkpoint it reads again exactly what it
    had not committed, and the sink publishes no batch twice."""
    source, sink = topic("in"), topic("out")
    total = 20_000
    publish(log_broker, source, total)
    checkpoint = tmp_path / "checkpoint"

    def start(trigger: dict[str, Any]) -> Any:
        from pyspark.sql import functions as F

        stream = (
            spark.readStream.format("broker")
            .option("broker.servers", log_broker)
            .option("subscribe", source)
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", "2000")
            .load()
        )
        transformed = stream.select("key", F.concat(F.col("value"), F.lit(b"|seen")).alias("value"))
        return (
            transformed.writeStream.format("broker")
            .option("broker.servers", log_broker)
            .option("topic", sink)
            .option("broker.delivery", "exactly-once")
            .option("checkpointLocation", str(checkpoint))
            .trigger(**trigger)
            .start()
        )

    query = start({"processingTime": "0 seconds"})
    deadline = time.monotonic() + TIMEOUT
    while len(list((checkpoint / "commits").glob("[0-9]*"))) < 3:
        assert time.monotonic() < deadline, "no three micro-batches committed in time"
        assert query.exception() is None
        time.sleep(0.1)
    query.stop()  # mid-way: later batches are not run, or cut in the middle
    commits = sorted(int(p.name) for p in (checkpoint / "commits").glob("[0-9]*"))
    assert commits and commits[-1] < total // 2000 - 1
    # The crash window: the broker committed the last batch, the checkpoint forgets it.
    last = commits[-1]
    (checkpoint / "commits" / str(last)).unlink()
    (checkpoint / "commits" / f".{last}.crc").unlink(missing_ok=True)

    query = start({"availableNow": True})
    assert query.awaitTermination(TIMEOUT * 3)
    assert query.exception() is None

    rows = read(spark, log_broker, subscribe=sink).collect()
    assert len(rows) == total
    assert ids(rows) == list(range(total))
    assert all(bytes(r.value).endswith(b"|seen") for r in rows)
