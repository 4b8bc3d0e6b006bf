"""A Spark batch job that reads a topic back, and how fast.

    broker serve --data-dir /tmp/broker &
    python examples/spark_publish.py --topic events --rows 1000000
    python examples/spark_read.py --topic events

It reads every record ``--topic`` keeps with ``spark.read.format("broker")``
(the columns of Spark's Kafka source), twice (the first run also starts
Spark's Python workers), and prints rows/s of each run and the first rows.
Needs ``pip install -e '.[spark]'`` and Java 17.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python examples/spark_read.py")
    parser.add_argument("--broker", default="127.0.0.1:7400", help="broker.servers")
    parser.add_argument("--topic", default="events")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args(argv)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    import broker.spark

    spark = (
        SparkSession.builder.master(args.master)
        .appName("broker-read")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    broker.spark.register(spark)
    frame = (
        spark.read.format("broker")  # format("kafka") for Spark's Kafka source
        .option("broker.servers", args.broker)  # option("kafka.bootstrap.servers", ...)
        .option("subscribe", args.topic)
        .load()
    )
    for run in range(1, args.runs + 1):
        started = time.perf_counter()
        rows = frame.groupBy().count().collect()[0][0]  # every row read, none collected
        elapsed = time.perf_counter() - started
        print(
            f"run {run}: read {rows} rows of {args.topic!r} in {elapsed:.2f} s: "
            f"{rows / elapsed:,.0f} rows/s"
        )
    # The first rows by offset. (A bare show(3) would stop reading a task's
    # rows after 3, and Spark's Python worker would print a BrokenPipeError
    # traceback for the rows it was still sending: ordering reads them all.)
    frame.orderBy("offset").select("offset", "key", "value").show(3, truncate=60)
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
