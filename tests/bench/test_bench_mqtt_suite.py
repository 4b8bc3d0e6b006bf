"""``broker bench mqtt``: the MQTT listener beside Mosquitto in one run.
Run tiny; its figures are checked for shape and for what is promised
(every message delivered where nothing may be lost), never for speed."""

from __future__ import annotations

from typing import Any

import pytest

from broker.bench import mqtt as bench
from broker.bench import peers
from broker.cli import main
from broker.cli._bench import DEFAULT_SUITES
from tests.deploy.helpers import missing_tool


def test_without_mosquitto_the_suite_says_what_to_install_and_nothing_else(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(bench, "mosquitto_path", lambda: None)
    assert main(["bench", "mqtt", "--quick", "--json"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err == "broker bench mqtt: needs mosquitto, which is not installed " + (
        "(apt install mosquitto)\n"
    )


def test_bench_without_a_suite_leaves_mqtt_out() -> None:
    assert "mqtt" not in DEFAULT_SUITES


def test_slow_consumer_asks_the_suite_for_that_workload_alone(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    asked: dict[str, Any] = {}

    def run(quick: bool = False, **options: Any) -> dict[str, Any]:
        asked.update(options, quick=quick)
        return {"python_loop_10m_s": 0.5}

    monkeypatch.setattr(bench, "mosquitto_path", lambda: "/bin/true")
    monkeypatch.setattr(bench, "run", run)
    assert main(["bench", "mqtt", "--slow-consumer", "--quick", "--json"]) == 0
    assert asked == {"quick": True, "slow_consumer_only": True}
    assert '"python_loop_10m_s": 0.5' in capsys.readouterr().out


@pytest.mark.slow
def test_mqtt_measures_both_brokers_and_loses_nothing_it_promises() -> None:
    if bench.mosquitto_path() is None:
        missing_tool("mosquitto", "apt install mosquitto")
    figures = bench.run(count=300, fanout_count=60, duration=1.0, slow_duration=0.5, rounds=1)
    assert figures["python_loop_10m_s"] > 0
    for broker in bench.BROKERS:
        for name in ("one_to_one", "fanout"):
            # QoS 1, and Mosquitto without a queue limit: nothing lost, on either.
            assert figures[f"{broker}_{name}_lost"] == 0, (broker, name, figures)
            assert figures[f"{broker}_{name}_per_s"] > 0
            assert figures[f"{broker}_{name}_broker_cpu_us_per_msg"] >= 0
        prefix = f"{broker}_rate_{bench.RATE}_"
        assert figures[prefix + "received"] == bench.RATE * 1.0, figures
        assert 0 < figures[prefix + "p50_us"] <= figures[prefix + "p99_us"], figures
    assert figures["ratio_one_to_one_rate"] > 0
    assert figures["ratio_fanout_rate"] > 0
    assert figures[f"ratio_rate_{bench.RATE}_p50"] > 0
    for broker in bench.SLOW_BROKERS:
        prefix = f"{broker}_slow_"
        assert figures[prefix + "published"] > 0, figures
        assert figures[prefix + "unacked"] == 0, figures
        for key in ("fast_per_s", "fast_alone_per_s", "slow_per_s", "rss_anon_growth_mib"):
            assert prefix + key in figures
    # This broker's slow subscriber, and its fast one, lose nothing; so does
    # Mosquitto's when it keeps everything (its default may drop: not asserted).
    for broker in ("ours", "mosquitto_unbounded"):
        assert figures[f"{broker}_slow_slow_lost"] == 0, figures
        assert figures[f"{broker}_slow_slow_duplicates"] == 0, figures
    assert figures["ours_slow_fast_lost"] == 0, figures
    lines = bench.table(figures)
    assert any(line.startswith("1->1 msg/s") for line in lines), lines
    assert sum(line.startswith(("ours ", "mosquitto ")) for line in lines) == 3, lines


@pytest.mark.parametrize("module", [module for _name, module in bench.FLOORS])
def test_the_flat_out_clients_against_a_floor_relay(module: str) -> None:
    """The floors, measured beside the brokers for reference, take the
    suite's flat-out clients (1->2 here: nothing lost)."""
    with peers.floor_process(module) as (url, process):
        figures = bench.throughput(bench.Server(url, process.pid), "bench/floor", 200, 2)
    assert figures["lost"] == 0, figures
    assert figures["duplicates"] == 0, figures
    assert figures["per_s"] > 0
