"""Automatic registration: with ``pyspark_broker`` importable (as it is once
the package is installed), a new Spark application knows ``format("broker")``
without ``broker.spark.register``."""

from __future__ import annotations

import textwrap
from pathlib import Path

from broker.client import BlockingClient

from .conftest import TIMEOUT
from .test_sink import fresh_topic, run_script

ROOT = Path(__file__).resolve().parents[2]

JOB = textwrap.dedent(
    """
    import sys
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[1]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    frame = spark.createDataFrame([("auto-registered",)], "value string")
    (
        frame.write.format("broker")
        .option("broker.servers", sys.argv[1])
        .option("topic", sys.argv[2])
        .mode("append")
        .save()
    )
    spark.stop()
    """
)


def test_a_new_application_finds_the_data_source_by_itself(
    broker_address: str, tmp_path: Path
) -> None:
    topic = fresh_topic()
    script = tmp_path / "job.py"
    script.write_text(JOB)
    # Run from elsewhere, with the project on the path the way an installed
    # package is (site-packages), not as the working directory.
    with BlockingClient(broker_address) as client, client.subscribe(topic) as subscription:
        run_script([str(script), broker_address, topic], tmp_path, PYTHONPATH=str(ROOT))
        assert subscription.receive(timeout=TIMEOUT).payload == b"auto-registered"
