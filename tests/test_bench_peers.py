"""``broker bench peers``: the broker beside Mosquitto in one run. Its
figures are checked for shape and sanity (every message arrived,
percentiles positive and ordered), never for speed."""

from __future__ import annotations

import json

import pytest

from broker.bench import peers
from broker.cli import main
from broker.cli._bench import DEFAULT_SUITES
from tests.deploy.helpers import missing_tool
from tests.test_cli import run_broker


def test_without_mosquitto_the_suite_says_what_to_install_and_nothing_else(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(peers, "mosquitto_path", lambda: None)
    assert main(["bench", "peers", "--quick", "--json"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err == "broker bench peers: needs mosquitto, which is not installed " + (
        "(apt install mosquitto)\n"
    )


def test_bench_without_a_suite_leaves_peers_out() -> None:
    """``broker bench`` alone runs what needs no other software."""
    assert "peers" not in DEFAULT_SUITES
    assert {"actors", "protocol", "broker"} <= set(DEFAULT_SUITES)


@pytest.mark.slow
def test_peers_measures_both_brokers_at_every_rate() -> None:
    if peers.mosquitto_path() is None:
        missing_tool("mosquitto", "apt install mosquitto")
    result = run_broker("bench", "peers", "--quick", "--json")
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)["peers"]
    assert figures["python_loop_10m_s"] > 0
    for rate in peers.TABLE_RATES:
        for name in ("ours", "ours_client", "mosquitto_qos1", "mosquitto_qos0"):
            prefix = f"{name}_rate_{rate}_"
            assert figures[prefix + "received"] == rate * figures["duration_s"], (prefix, figures)
            assert 0 < figures[prefix + "p50_us"] <= figures[prefix + "p99_us"], (prefix, figures)
            assert figures[prefix + "broker_cpu_us_per_msg"] >= 0, (prefix, figures)
        for qos in (1, 0):
            for ratio in ("p50", "p99"):
                assert figures[f"ratio_qos{qos}_rate_{rate}_{ratio}"] > 0, figures
    # The table shows a row per rate and broker.
    lines = peers.table(figures)
    assert len(lines) == 2 + 4 * len(peers.TABLE_RATES)
    assert "ours client" in lines[2]
    assert "mosquitto qos1" in lines[3]
