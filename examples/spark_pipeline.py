"""A streaming Spark job from one topic to another, exactly once end to end.

    broker serve --data-dir /tmp/broker &                  # a broker that keeps topic logs
    python examples/spark_publish.py --topic orders --rows 100000
    python examples/spark_pipeline.py --source orders --sink orders.checked \\
        --checkpoint /tmp/orders-checkpoint --available-now

It reads ``--source`` with ``spark.readStream.format("broker")`` (from its
first record, at most ``--max-per-trigger`` records per micro-batch), turns
each record into an upper-cased copy with the offset it came from, and
publishes the result to ``--sink`` with ``broker.delivery =
exactly-once``. Spark keeps the source offsets of each micro-batch in the
checkpoint; the sink commits each micro-batch once. Stopped (Ctrl-C, a
crash) and started again with the same ``--checkpoint``, it goes on where
it stopped: every record reaches ``--sink`` exactly once. With
``--available-now`` it processes what the topic holds and stops (printing
how many rows it read); without, it runs until interrupted. The same job
with Spark's Kafka source differs in one line per end: ``format("kafka")``
and ``option("kafka.bootstrap.servers", ...)`` (and Kafka's sink is at
least once). Needs ``pip install -e '.[spark]'`` and Java 17.
"""

from __future__ import annotations

import argparse
import os
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python examples/spark_pipeline.py")
    parser.add_argument("--broker", default="127.0.0.1:7400", help="broker.servers")
    parser.add_argument("--source", default="events", help="the topic read")
    parser.add_argument("--sink", default="events.upper", help="the topic written")
    parser.add_argument("--checkpoint", required=True, help="the query's checkpoint directory")
    parser.add_argument("--max-per-trigger", type=int, default=10_000)
    parser.add_argument("--available-now", action="store_true", help="process what is there, stop")
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args(argv)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import broker.spark

    spark = (
        SparkSession.builder.master(args.master)
        .appName("broker-pipeline")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    broker.spark.register(spark)
    records = (
        spark.readStream.format("broker")  # format("kafka") for Spark's Kafka source
        .option("broker.servers", args.broker)  # option("kafka.bootstrap.servers", ...)
        .option("subscribe", args.source)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(args.max_per_trigger))
        .load()
    )
    checked = records.select(
        "key",
        F.concat(
            F.upper(F.col("value").cast("string")),
            F.lit(f" <- {args.source}@"),
            F.col("offset").cast("string"),
        ).alias("value"),
    )
    writer = (
        checked.writeStream.format("broker")
        .option("broker.servers", args.broker)
        .option("topic", args.sink)
        .option("broker.delivery", "exactly-once")
        .option("checkpointLocation", args.checkpoint)
    )
    query = (writer.trigger(availableNow=True) if args.available_now else writer).start()
    try:
        query.awaitTermination()
    except KeyboardInterrupt:
        query.stop()
    rows = sum(progress["numInputRows"] for progress in query.recentProgress)
    print(f"read {rows} rows from {args.source!r}, wrote them to {args.sink!r} (exactly-once)")
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
