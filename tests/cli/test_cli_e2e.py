"""The README's promise, end to end: ``broker serve`` in one process, ``broker
pub`` / ``broker sub`` / ``broker stat`` in others, metrics over HTTP, and a
graceful stop on SIGINT."""

from __future__ import annotations

import signal
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.helpers import TIMEOUT, broker_command, serving


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, str, subprocess.Popen[str]]]:
    # A data directory of the test's own, as the README's `broker serve` has
    # one by default (the default location may be held by another test run).
    with serving("--data-dir", str(tmp_path / "data")) as server:
        yield server.address, server.metrics, server.process


def test_pub_sub_round_trip_metrics_stat_and_graceful_stop(
    served: tuple[str, str, subprocess.Popen[str]],
) -> None:
    address, metrics_url, server = served
    subscriber = subprocess.Popen(
        broker_command("sub", "news", "--count", "3", "--broker", address),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert subscriber.stderr is not None
        assert "subscribed to 'news'" in subscriber.stderr.readline()

        # While the subscriber is connected, its connection has metric series.
        with urllib.request.urlopen(metrics_url + "/metrics", timeout=TIMEOUT) as response:
            exposition = response.read().decode()
        assert 'broker_connection_debt_bytes{connection="conn-1"}' in exposition
        stat = subprocess.run(
            broker_command("stat", "--metrics", metrics_url),
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )
        assert stat.returncode == 0, stat.stderr
        assert "conn-1" in stat.stdout and "'broker-sub'" in stat.stdout

        one = subprocess.run(
            broker_command("pub", "news", "hello", "--broker", address),
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )
        assert one.returncode == 0, one.stderr
        lines = subprocess.run(
            broker_command("pub", "news", "--broker", address),
            input="second\nthird\n",
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )
        assert lines.returncode == 0, lines.stderr
        assert "published 2 message(s)" in lines.stderr
        out, _ = subscriber.communicate(timeout=TIMEOUT)
        assert out.splitlines() == ["hello", "second", "third"]
        assert subscriber.returncode == 0
    finally:
        if subscriber.poll() is None:
            subscriber.kill()
        subscriber.communicate(timeout=TIMEOUT)

    server.send_signal(signal.SIGINT)
    assert server.wait(TIMEOUT) == 0


def test_pub_to_a_broker_that_is_not_there_fails_plainly() -> None:
    result = subprocess.run(
        broker_command("pub", "news", "x", "--broker", "127.0.0.1:1"),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert result.returncode == 1
    assert "broker pub:" in result.stderr
    assert "Traceback" not in result.stderr
