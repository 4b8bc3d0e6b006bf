"""``broker bench groups`` at a tiny size: its JSON shape and its
exactly-once check (every offset settled once, spread over the members).
Never a speed."""

from __future__ import annotations

import json

from broker.bench import groups
from broker.cli._bench import BENCH_SUITES


def test_groups_is_a_bench_suite() -> None:
    assert BENCH_SUITES["groups"][0] == "broker.bench.groups"


def test_groups_bench_settles_every_record_once() -> None:
    figures = json.loads(json.dumps(groups.run(count=600)))
    assert figures["python_loop_10m_s"] > 0 and figures["records"] == 600
    assert figures["plain_received"] == 600
    assert figures["plain_lost"] == figures["plain_duplicates"] == 0
    assert figures["plain_msgs_per_s"] > 0 and figures["plain_broker_cpu_s_per_msg"] > 0
    for n in groups.SIZES:
        counts = figures[f"group_{n}_member_counts"]
        assert len(counts) == n and sum(counts) == 600
        assert figures[f"group_{n}_distinct_offsets"] == 600
        assert figures[f"group_{n}_duplicates"] == figures[f"group_{n}_outside_range"] == 0
        assert figures[f"group_{n}_exactly_once"] is True
        assert figures[f"group_{n}_msgs_per_s"] > 0
        assert figures[f"group_{n}_broker_cpu_s_per_msg"] > 0
        assert 0 <= figures[f"group_{n}_split_max_deviation_pct"] <= 100 * (n - 1)
    assert figures["group_1_split_max_deviation_pct"] == 0
    assert figures["group_1_ratio"] > 0
    assert figures["exactly_once"] is True
    assert "\n".join(groups.table(figures)).count("group of") >= 3
