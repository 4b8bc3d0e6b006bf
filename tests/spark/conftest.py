"""A real local Spark session (one per test session: its start costs seconds)
and a real broker process on loopback."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from .session import local_session

TIMEOUT = 60


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every Spark test is slow (a JVM, a local Spark session): ``-m "not slow"``
    skips them. Without Java they skip, saying so (under CI, where
    ``$BROKER_REQUIRE_TOOLS`` is 1 and Java is installed, they would fail).
    A module that sets ``NEEDS_JVM = False`` (unit tests of option parsing)
    is neither."""
    no_java = shutil.which("java") is None and os.environ.get("BROKER_REQUIRE_TOOLS") != "1"
    for item in items:
        if "tests/spark/" in item.nodeid and getattr(
            getattr(item, "module", None), "NEEDS_JVM", True
        ):
            item.add_marker(pytest.mark.slow)
            if no_java:
                item.add_marker(
                    pytest.mark.skip(
                        reason="Spark needs Java 17 (apt-get install openjdk-17-jre-headless)"
                    )
                )


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    session = local_session("broker-tests", attempts=2)  # one retry per task
    yield session
    session.stop()


@contextlib.contextmanager
def broker_serving(*serve_args: str) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """A ``broker serve`` process with ``serve_args``, on a free loopback
    port: its address and the process; it must stop cleanly."""
    process = subprocess.Popen(
        [sys.executable, "-m", "broker", "--log-level", "WARNING", "serve", *serve_args],
        env={**os.environ, "BROKER_LISTEN": "127.0.0.1:0", "BROKER_METRICS_LISTEN": ""},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line.startswith("broker listening on "), line
    try:
        yield line.split()[-1], process
    finally:
        process.terminate()
        process.communicate(timeout=TIMEOUT)  # also closes the pipe
    assert process.returncode == 0


@pytest.fixture(scope="session")
def broker_process() -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """A memory-only broker process for the Spark tests: its address and the process."""
    with broker_serving("--memory-only") as serving:
        yield serving


@pytest.fixture(scope="session")
def broker_address(broker_process: tuple[str, subprocess.Popen[str]]) -> str:
    return broker_process[0]


#: Topics "lossy.*" keep about 520 records of 1000 bytes: older ones are deleted.
CONFIG = """
[[topics]]
pattern = "lossy.*"
retain_bytes = 524288
term_bytes = 131072
when_full = "drop-oldest"
"""


@pytest.fixture(scope="session")
def log_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The address of a broker process with a data directory (topic logs)."""
    root = tmp_path_factory.mktemp("log-broker")
    (root / "broker.toml").write_text(CONFIG)
    with broker_serving(
        "--config", str(root / "broker.toml"), "--data-dir", str(root / "data")
    ) as (
        address,
        _,
    ):
        yield address


@pytest.fixture(scope="session")
def cluster_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The address of a broker in cluster mode: a front end over a
    ``nats-server`` (JetStream, every write synced) that keeps its topics."""
    from broker.nats._servers import open_nats_servers

    from ..nats.raw import require_nats_server

    require_nats_server()
    root = tmp_path_factory.mktemp("cluster-broker")
    (root / "broker.toml").write_text(CONFIG)
    with (
        open_nats_servers(root / "nats", 1, system_account=True, app_jsz_import=True) as servers,
        broker_serving(
            "--config",
            str(root / "broker.toml"),
            "--data-dir",
            str(root / "data"),
            "--cluster",
            servers.urls[0],
            "--set",
            "cluster_replicas=1",
        ) as (address, _),
    ):
        yield address


@pytest.fixture(params=["local", "cluster"])
def engine_broker(request: pytest.FixtureRequest) -> str:
    """A broker with a topic log of each storage engine (see
    ``tests/server/test_topic_store.py``): the local topic log, and cluster
    mode's replicated streams. Tests that take it run on both."""
    name = "log_broker" if request.param == "local" else "cluster_broker"
    address: str = request.getfixturevalue(name)
    return address


def rss_bytes(pid: int) -> int:
    """The resident memory of process ``pid``."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")
