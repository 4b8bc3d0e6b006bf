"""Liveness and readiness: ``/healthz``, ``/readyz``, ``broker_ready`` and ``broker health``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from broker import cli
from broker.config import BrokerConfig
from broker.metrics import serve_metrics
from broker.metrics._http import MAX_CLIENTS
from broker.server import Broker, serve_broker
from tests.metrics.test_metrics import get, running, scrape
from tests.metrics.test_metrics_http import hold_idle

Address = tuple[str, int]


async def test_healthz_and_readyz_answer_while_the_broker_serves() -> None:
    async with running() as (_broker, metrics):
        live = await get(metrics, "/healthz")
        assert (live.status, live.body) == (200, b"ok\n")
        ready = await get(metrics, "/readyz")
        assert (ready.status, ready.body) == (200, b"ready\n")
        assert (await get(metrics, "/readyz", "HEAD")).body == b""
        assert (await scrape(metrics))("broker_ready") == 1
        index = await get(metrics, "/")
        assert b"/healthz" in index.body and b"/readyz" in index.body


async def test_idle_connections_to_the_metrics_port_do_not_fail_the_probes() -> None:
    # More idle connections than the server keeps waiting: it closes the
    # surplus, and a probe still gets its answer (never a 503).
    async with running() as (_broker, metrics):
        with trio.fail_after(30):
            async with hold_idle(metrics, MAX_CLIENTS + 16, 16, unanswered=False):
                live = await get(metrics, "/healthz")
                assert (live.status, live.body) == (200, b"ok\n")
                assert (await get(metrics, "/readyz")).status == 200
                address = "{}:{}".format(*metrics)
                argv = ["health", "--live", "--metrics", address, "--timeout", "10"]
                assert await trio.to_thread.run_sync(cli.main, argv) == 0
                assert (await get(metrics, "/metrics")).status == 200


async def test_readyz_turns_503_when_shutdown_begins_while_healthz_stays_200() -> None:
    config = BrokerConfig(listen="127.0.0.1:0", metrics_listen="", shutdown_deadline=5.0)
    async with trio.open_nursery() as nursery:
        broker: Broker = await nursery.start(serve_broker, config)
        metrics: Address = await nursery.start(serve_metrics, broker, "127.0.0.1", 0)
        # A connected client keeps the shutdown draining, so we can look at it.
        stream = await trio.open_tcp_stream(*broker.address)
        async with stream:
            nursery.start_soon(broker.shutdown)
            await trio.sleep(0.05)
            assert broker.closing
            not_ready = await get(metrics, "/readyz")
            assert not_ready.status == 503
            assert b"not accepting clients" in not_ready.body
            assert (await get(metrics, "/healthz")).status == 200
            assert (await scrape(metrics))("broker_ready") == 0
        nursery.cancel_scope.cancel()


async def test_broker_health_exits_0_when_ready_and_1_when_not() -> None:
    async with running() as (_broker, metrics):
        address = "{}:{}".format(*metrics)
        ready = await trio.to_thread.run_sync(cli.main, ["health", "--metrics", address])
        live = await trio.to_thread.run_sync(cli.main, ["health", "--live", "--metrics", address])
        assert (ready, live) == (0, 0)
    # Nobody listens there any more.
    gone = await trio.to_thread.run_sync(
        cli.main, ["health", "--metrics", address, "--timeout", "2"]
    )
    assert gone == 1


def test_a_health_check_of_nothing_says_what_to_check_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """It said "http://127.0.0.1:1/readyz: unreachable: <urlopen error [Errno
    111] Connection refused>": no "broker health:", and urllib's repr."""
    assert cli.main(["health", "--metrics", "127.0.0.1:1"]) == 1
    assert capsys.readouterr().err == (
        "broker health: cannot read http://127.0.0.1:1/readyz: connection refused"
        " (is a broker running there? give --metrics its metrics_listen)\n"
    )


def _serve_with_broker_config(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "broker", "serve", "--memory-only", "--listen", "127.0.0.1:0"],
        env={**os.environ, "BROKER_CONFIG": str(config)},
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_broker_serve_reads_the_config_named_by_broker_config(tmp_path: Path) -> None:
    config = tmp_path / "broker.toml"
    config.write_text('[broker]\nmax_frame = "not a number"\n')
    result = _serve_with_broker_config(config)
    assert result.returncode == 2
    assert result.stderr == (
        f"broker serve: max_frame: expected int, got 'not a number' (set by config {config})"
        " (named by BROKER_CONFIG)\n"
    )
    result = _serve_with_broker_config(tmp_path / "nope.toml")
    assert result.returncode == 2
    assert result.stderr == (
        f"broker serve: cannot read config {tmp_path / 'nope.toml'}: No such file or directory"
        " (named by BROKER_CONFIG)\n"
    )


def test_broker_serve_reports_a_bad_auth_file_and_exits_2(tmp_path: Path) -> None:
    auth = tmp_path / "auth.toml"
    auth.write_text("[principals.x]\n")
    result = subprocess.run(
        [sys.executable, "-m", "broker", "serve", "--memory-only", "--listen", "127.0.0.1:0"],
        env={**os.environ, "BROKER_AUTH_FILE": str(auth), "BROKER_METRICS_LISTEN": ""},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "principal 'x' must be a table" in result.stderr or "needs a token" in result.stderr
