"""``broker bench patterns`` at a tiny size: its JSON shape and its loss
check (every record of every topic read once, numbered without a gap
by the pattern). Never a speed."""

from __future__ import annotations

import json

from broker.bench import patterns
from broker.cli._bench import BENCH_SUITES


def test_patterns_is_a_bench_suite() -> None:
    assert BENCH_SUITES["patterns"][0] == "broker.bench.patterns"


def test_patterns_bench_reads_every_record_once() -> None:
    figures = json.loads(json.dumps(patterns.run(count=1000)))
    assert figures["python_loop_10m_s"] > 0 and figures["records"] == 1000
    for workload in ("plain", "pattern", "many"):
        assert figures[f"{workload}_received"] == 1000
        assert figures[f"{workload}_lost"] == figures[f"{workload}_duplicates"] == 0
        assert figures[f"{workload}_msgs_per_s"] > 0
    assert figures["publish_only_msgs_per_s"] > 0
    assert figures["pattern_broker_cpu_s_per_msg"] > 0
    assert figures["pattern_ratio"] > 0 and figures["pattern_of_publish_only"] > 0
    assert figures["pattern_of_many"] > 0
    assert "pattern / plain" in "\n".join(patterns.table(figures))
