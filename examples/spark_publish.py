"""A real Spark job that publishes into the broker.

    broker serve &                                    # a local broker
    broker sub events --count 3 &                     # watch the first rows arrive
    python examples/spark_publish.py --rows 100000    # generate, transform, publish

It generates ``--rows`` rows (or reads ``--csv FILE``: its first column is
the key, the whole line the value), turns each into a 100-byte JSON-ish
payload keyed by a user id, and publishes them to ``--topic`` with the
``broker`` data source, then prints rows/s. ``--delivery exactly-once``
stages the rows and commits them when the job succeeds (no row twice, even
when tasks are retried). The same job with Spark's Kafka sink differs in one
line: ``format("kafka")`` and ``option("kafka.bootstrap.servers", ...)``.
Needs ``pip install -e '.[spark]'`` (pyspark 4, pyarrow) and Java 17.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python examples/spark_publish.py")
    parser.add_argument("--broker", default="127.0.0.1:7400", help="broker.servers")
    parser.add_argument("--topic", default="events")
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--csv", help="publish this CSV file instead of generated rows")
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument(
        "--delivery", choices=["at-least-once", "exactly-once"], default="at-least-once"
    )
    args = parser.parse_args(argv)

    # (Before Spark starts: without a broker, every task would fail with a
    # traceback of its own, and the job with pages of them.)
    unreachable = _unreachable(args.broker)
    if unreachable:
        print(f"spark_publish: {unreachable}", file=sys.stderr)
        return 1
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import broker.spark

    spark = (
        SparkSession.builder.master(args.master)
        .appName("broker-example")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    broker.spark.register(spark)
    if args.csv:
        lines = spark.read.text(args.csv)
        frame = lines.select(
            F.split("value", ",").getItem(0).alias("key"), F.col("value").alias("value")
        )
    else:
        frame = (
            spark.range(args.rows, numPartitions=args.partitions)
            .withColumn("key", F.concat(F.lit("user-"), (F.col("id") % 1000).cast("string")))
            .withColumn(
                "value",
                F.rpad(
                    F.concat(F.lit('{"id":'), F.col("id").cast("string"), F.lit(',"v":"')),
                    99,
                    "x",
                ),
            )
            .select(F.concat("value", F.lit("}")).alias("value"), "key")
        )
    frame = frame.cache()
    rows = frame.count()  # generate before timing the publish
    started = time.perf_counter()
    (
        frame.write.format("broker")  # format("kafka") for Spark's Kafka sink
        .option("broker.servers", args.broker)  # option("kafka.bootstrap.servers", ...)
        .option("topic", args.topic)
        .option("broker.delivery", args.delivery)
        .mode("append")
        .save()
    )
    elapsed = time.perf_counter() - started
    print(
        f"published {rows} rows to {args.topic!r} ({args.delivery}) in {elapsed:.2f} s: "
        f"{rows / elapsed:,.0f} rows/s"
    )
    spark.stop()
    return 0


def _unreachable(servers: str) -> str | None:
    """Why a broker of ``servers`` (``broker.servers``) cannot be reached
    (the first that cannot), or None when every one can."""
    import socket

    from broker.client import ClientError, parse_servers, split_url

    try:
        urls = parse_servers(servers)
    except ClientError as error:
        return f"--broker: {error}"
    for url in urls:
        host, port, _tls = split_url(url)
        try:
            socket.create_connection((host, port), timeout=5).close()
        except OSError as error:
            reason = error.strerror or error
            return f"cannot connect to the broker at {host}:{port}: {reason} (is it running?)"
    return None


if __name__ == "__main__":
    raise SystemExit(main())
