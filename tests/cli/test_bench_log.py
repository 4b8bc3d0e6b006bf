"""``broker bench broker --log-only``: the topic-log workloads (issue 21)
run, lose nothing and report every figure the issue asks for. The figures
themselves are not judged here (a shared machine makes them noisy)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from broker.bench._log_worker import OffsetCheck


def test_offsets_are_checked_for_gaps_and_duplicates() -> None:
    check = OffsetCheck()
    for offset in (1, 2, 3, 3, 6, 2, 7):
        check.see(offset)
    assert check.figures() == {
        "received": 7,
        "first_offset": 1,
        "last_offset": 7,
        "gaps": 2,  # 4 and 5
        "duplicates": 2,  # the second 3, and 2
    }


@pytest.mark.slow
def test_the_log_workloads_lose_nothing_and_report_their_figures() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "broker", "bench", "broker", "--log-only", "--quick", "--json"],
        capture_output=True,
        text=True,
        timeout=600,  # a hang guard: about a minute on an idle machine
        check=False,
    )
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)["broker"]
    assert figures["python_loop_10m_s"] > 0
    for key in (
        "log_one_to_one_ratio",
        "log_fanout_ratio",
        "log_one_to_one_broker_cpu_s_per_million",
        "log_fanout_broker_cpu_s_per_million_deliveries",
        "replay_records_per_s",
        "replay_ratio",
        "log_slow_fast_ratio",
        "log_slow_broker_rss_anon_growth_mib",
        "log_slow_disk_max_mib",
    ):
        assert figures[key] > 0, (key, figures)
    for key in (
        "one_to_one_lost",
        "fanout_lost",
        "log_one_to_one_lost",
        "log_fanout_lost",
        "replay_lost",
        "replay_duplicates",
        "log_slow_lost",
        "log_slow_duplicates",
        "log_slow_fast_alone_lost",
    ):
        assert figures[key] == 0, (key, figures)
    assert figures["replay_first_offset"] == 1
    assert figures["replay_records"] == 100_000
    assert (
        figures["log_slow_fast_received"]
        == figures["log_slow_slow_received"]
        == figures["log_slow_published"]
        > 0
    )
    assert figures["log_slow_disk_within_limit"] is True
    # The memory-only extras are not run with --log-only.
    assert "fanout_receive_each_deliveries_per_s" not in figures
