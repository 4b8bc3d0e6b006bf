"""``broker bench workers``: one process beside two workers (clients at the
owners, at the public address, and every message forwarded), then the slow
consumer across workers. Checked for shape and sanity (nothing lost, every
figure positive, the slow subscriber got what was published), never for speed."""

from __future__ import annotations

import json

import pytest

from broker.cli._bench import DEFAULT_SUITES
from tests.cli.test_cli import run_broker


def test_bench_without_a_suite_leaves_workers_out() -> None:
    assert "workers" not in DEFAULT_SUITES


@pytest.mark.slow
def test_workers_bench_measures_every_configuration() -> None:
    result = run_broker("bench", "workers", "--quick", "--json")
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)["workers"]
    assert figures["python_loop_10m_s"] > 0 and figures["topics"] == 8
    for configuration in ("one", "direct", "public", "forwarded"):
        assert figures[f"{configuration}_lost"] == 0
        assert figures[f"{configuration}_msgs_per_worker_cpu_s"] > 0
    for configuration in ("direct", "public", "forwarded"):
        assert figures[f"ratio_{configuration}_to_one"] > 0
        rounds = figures[f"ratio_{configuration}_to_one_rounds"]
        assert len(rounds) == 1 and all(r > 0 for r in rounds)  # (--quick: one round)
        assert figures[f"ratio_{configuration}_to_one_median_of_rounds"] == pytest.approx(
            rounds[0], abs=0.001
        )
    slow = {k.removeprefix("slow_consumer_"): v for k, v in figures.items() if "slow_consumer" in k}
    assert slow["lost"] == 0
    assert slow["slow_received"] == slow["slow_published"] > 0
    assert slow["fast_received"] == slow["fast_published"] > 0
    assert len(slow["worker_rss_anon_growth_mib"]) == 2
    assert slow["max_connection_debt"] > 0
