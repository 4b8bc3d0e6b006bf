"""deploy/grafana: the provisioned datasource and the dashboard's panels and queries."""

from __future__ import annotations

import re
from typing import Any

import pytest

from .helpers import (
    GRAFANA,
    broker_metric_names,
    dashboard_panels,
    load_json,
    load_yaml,
    promql_broker_metrics,
)

#: What the dashboard must show, as metrics some panel's query uses.
REQUIRED_METRICS = {
    "broker_connection_debt_bytes",  # debt per connection
    "broker_connection_channel_debt_bytes",  # ... and per channel kind
    "broker_peak_debt_bytes",
    "broker_connection_peak_debt_bytes",
    "broker_connection_blocked",
    "broker_connection_throttled_seconds_total",
    "broker_connections_blocked",
    "broker_received_messages_total",  # throughput in and out, over every connection
    "broker_sent_messages_total",
    "broker_received_bytes_total",
    "broker_sent_bytes_total",
    "broker_connection_received_messages_total",  # ... and the busiest connections
    "broker_connection_sent_messages_total",
    "broker_dropped_frames_total",  # drops by reason
    "broker_queued_deliveries",
    "broker_buffer_reserved_bytes",  # reserved vs budget
    "broker_buffer_budget_bytes",
    "broker_connections_open",
    "broker_topics",
    "broker_subscriptions",
    "broker_lease_expirations_total",
    "broker_auth_failures_total",
    "broker_sessions",
    "broker_staged_bytes",
    "broker_staging_limit_bytes",
    "broker_staging_outcomes_total",
    # cluster mode (issue 44, item 7)
    "broker_cluster_runs_in_flight",
    "broker_cluster_front_ends",
    "broker_cluster_runs_resent_total",
    "broker_cluster_store_failures_total",
    "broker_cluster_store_duplicates_total",
    "broker_cluster_store_seconds_bucket",
}


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return dict(load_json(GRAFANA / "dashboards" / "broker.json"))


@pytest.fixture(scope="module")
def datasource_uid() -> str:
    config = load_yaml(GRAFANA / "provisioning" / "datasources" / "prometheus.yml")
    (datasource,) = config["datasources"]
    assert datasource["type"] == "prometheus"
    return str(datasource["uid"])


def _queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target and templating query."""
    queries = []
    for panel in dashboard_panels(dashboard):
        for target in panel.get("targets", []):
            queries.append((f"panel {panel['title']!r} {target['refId']}", target["expr"]))
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") == "query":
            query = variable["query"]
            text = query["query"] if isinstance(query, dict) else query
            queries.append((f"variable {variable['name']}", text))
    return queries


def test_dashboard_identity(dashboard: dict[str, Any]) -> None:
    assert dashboard["uid"] and dashboard["title"]
    assert isinstance(dashboard["schemaVersion"], int)
    ids = [panel["id"] for panel in dashboard_panels(dashboard)]
    assert len(ids) == len(set(ids)), "panel ids are unique"


def test_every_query_uses_the_provisioned_datasource(
    dashboard: dict[str, Any], datasource_uid: str
) -> None:
    def check(where: str, datasource: Any) -> None:
        assert datasource == {"type": "prometheus", "uid": datasource_uid}, where

    for panel in dashboard_panels(dashboard):
        if panel["type"] == "row":
            continue
        check(f"panel {panel['title']!r}", panel.get("datasource"))
        assert panel.get("targets"), f"panel {panel['title']!r} has queries"
        for target in panel["targets"]:
            check(f"panel {panel['title']!r} {target['refId']}", target.get("datasource"))
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            check(f"variable {variable['name']}", variable["datasource"])


def test_queries_use_existing_metrics_and_defined_variables(dashboard: dict[str, Any]) -> None:
    known = broker_metric_names()
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    for where, expr in _queries(dashboard):
        unknown = promql_broker_metrics(expr) - known
        assert not unknown, f"{where}: not in broker.metrics.METRICS: {sorted(unknown)}"
        for used in re.findall(r"\$(?!__)\{?([A-Za-z_]\w*)", expr):
            assert used in variables, f"{where}: undefined variable ${used}"


def test_the_dashboard_shows_what_operators_need(dashboard: dict[str, Any]) -> None:
    used = set().union(*(promql_broker_metrics(expr) for _, expr in _queries(dashboard)))
    missing = REQUIRED_METRICS - used
    assert not missing, f"no panel shows {sorted(missing)}"


def test_panels_do_not_overlap(dashboard: dict[str, Any]) -> None:
    cells: dict[tuple[int, int], dict[str, Any]] = {}
    for panel in dashboard_panels(dashboard):
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                other = cells.setdefault((x, y), panel)
                assert other is panel, f"{panel['title']!r} overlaps {other['title']!r}"


def test_dashboard_provider_loads_the_dashboards_directory() -> None:
    config = load_yaml(GRAFANA / "provisioning" / "dashboards" / "broker.yml")
    (provider,) = config["providers"]
    assert provider["type"] == "file"
    assert provider["options"]["path"], "a path inside the Grafana container"
