"""A real local Spark session (one per test session: its start costs seconds)
and a real broker process on loopback."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

TIMEOUT = 60


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession

    import broker.spark

    session = (
        SparkSession.builder.master("local[2,2]")  # one retry per task
        .appName("broker-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    broker.spark.register(session)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def broker_address() -> Iterator[str]:
    """A broker process for the Spark tests, on a free loopback port."""
    process = subprocess.Popen(
        [sys.executable, "-m", "broker", "--log-level", "WARNING", "serve"],
        env={**os.environ, "BROKER_LISTEN": "127.0.0.1:0", "BROKER_METRICS_LISTEN": ""},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line.startswith("broker listening on "), line
    try:
        yield line.split()[-1]
    finally:
        process.terminate()
        process.communicate(timeout=TIMEOUT)  # also closes the pipe
    assert process.returncode == 0
