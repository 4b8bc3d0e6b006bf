"""A local Spark session for the tests and measurements: two cores, the UI
off, a quick JVM, the broker's data source registered."""

from __future__ import annotations

import os
import sys
from typing import Any


def local_session(name: str, attempts: int) -> Any:
    """A ``SparkSession`` on ``local[2,attempts]`` (each task tried up to
    ``attempts`` times) named ``name``."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    import broker.spark

    session = (
        SparkSession.builder.master(f"local[2,{attempts}]")
        .appName(name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    broker.spark.register(session)
    return session
