"""deploy/ for the topic logs (issue 21): the dashboard's "Topic log" row and
the alerts on the data directory, blocked topics, append errors and lag."""

from __future__ import annotations

import re
from typing import Any

import pytest

from .helpers import GRAFANA, REPO, alert_rules, load_json, promql_broker_metrics

#: What the "Topic log" row must show, as metrics its panels' queries use.
ROW_METRICS = {
    "broker_log_bytes",
    "broker_topic_log_bytes",
    "broker_log_appends_total",
    "broker_log_fsync_seconds_bucket",
    "broker_subscription_max_lag_records",
    "broker_subscription_lag_records",
    "broker_data_dir_free_bytes",
    "broker_topics_blocked",
}


@pytest.fixture(scope="module")
def row() -> list[dict[str, Any]]:
    """The panels after the "Topic log" row header, up to the next row."""
    panels = load_json(GRAFANA / "dashboards" / "broker.json")["panels"]
    start = next(
        i for i, p in enumerate(panels) if p["type"] == "row" and p["title"] == "Topic log"
    )
    rest = panels[start + 1 :]
    end = next((i for i, p in enumerate(rest) if p["type"] == "row"), len(rest))
    return list(rest[:end])


def test_the_topic_log_row_shows_bytes_appends_fsync_lag_and_free_disk(
    row: list[dict[str, Any]],
) -> None:
    exprs = [target["expr"] for panel in row for target in panel["targets"]]
    used = set().union(*(promql_broker_metrics(expr) for expr in exprs))
    assert used >= ROW_METRICS, f"the row does not show {sorted(ROW_METRICS - used)}"
    assert any(
        "histogram_quantile(0.99" in expr and "broker_log_fsync_seconds_bucket" in expr
        for expr in exprs
    ), "fsync p99"
    assert any(re.search(r"rate\(broker_log_appends_total", expr) for expr in exprs)
    for expr in exprs:
        assert 'job="broker", instance=~"$instance"' in expr, expr


def _rule(name: str) -> dict[str, Any]:
    (rule,) = [rule for rule in alert_rules() if rule["alert"] == name]
    return rule


@pytest.mark.parametrize(
    ("name", "metric", "for_", "severity"),
    [
        ("BrokerDataDirNearlyFull", "broker_data_dir_free_bytes", "5m", "warning"),
        ("BrokerTopicBlocked", "broker_topics_blocked", "1m", "critical"),
        ("BrokerLogAppendErrors", "broker_log_append_errors_total", None, "warning"),
        ("BrokerSubscriptionLagging", "broker_subscription_max_lag_records", "10m", "warning"),
    ],
)
def test_the_topic_log_alerts(name: str, metric: str, for_: str | None, severity: str) -> None:
    rule = _rule(name)
    assert metric in promql_broker_metrics(rule["expr"])
    assert rule.get("for") == for_
    assert rule["labels"]["severity"] == severity


def test_the_thresholds_are_the_documented_ones() -> None:
    assert re.search(
        r"broker_data_dir_size_bytes\{[^}]*\}\s*<\s*0\.1\b",
        _rule("BrokerDataDirNearlyFull")["expr"],
    )
    assert re.search(r"\}\s*>\s*0$", _rule("BrokerTopicBlocked")["expr"])
    lagging = _rule("BrokerSubscriptionLagging")
    assert re.search(r"\}\s*>\s*100000$", lagging["expr"])
    assert "records" in lagging["annotations"]["description"]


def test_the_runbooks_are_in_the_topic_log_section() -> None:
    text = (REPO / "docs" / "operations.md").read_text(encoding="utf-8")
    section = text[text.index("\n## Topic log alerts: runbook\n") :]
    for name in (
        "BrokerDataDirNearlyFull",
        "BrokerTopicBlocked",
        "BrokerLogAppendErrors",
        "BrokerSubscriptionLagging",
    ):
        assert f"\n### {name}\n" in section, name
