"""deploy/prometheus: promtool checks, the metrics the rules use, and runbooks."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from .helpers import (
    PROMETHEUS,
    PROMETHEUS_BUILTINS,
    REPO,
    alert_names,
    alert_rules,
    broker_metric_names,
    load_yaml,
    promql_broker_metrics,
    require_tool,
)

RUNBOOK = "docs/operations.md"
#: The alerts the deployment promises (docs/operations.md has a runbook for each).
EXPECTED_ALERTS = {
    "BrokerDown",
    "BrokerConnectionStuckInDebt",
    "BrokerConnectionThrottled",
    "BrokerFramesDropped",
    "BrokerLeaseExpirations",
    "BrokerBufferBudgetNearlyFull",
    "BrokerAuthenticationFailures",
    "BrokerQueuedDeliveriesGrowing",
    "BrokerInternalErrors",
    "BrokerStagingNearlyFull",
    # the topic logs (issue 21)
    "BrokerDataDirNearlyFull",
    "BrokerTopicBlocked",
    "BrokerLogAppendErrors",
    "BrokerSubscriptionLagging",
    # the workers of `broker serve --workers N`
    "BrokerWorkerDown",
    "BrokerWorkerRestarting",
    # consumer groups (issue 41)
    "BrokerGroupLagging",
    "BrokerGroupDeadLetters",
    # cluster mode (issue 44)
    "BrokerClusterDisconnected",
    "BrokerClusterResends",
    "BrokerClusterQuorumLost",
    "BrokerClusterTopicSetAside",
}


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    promtool = require_tool("promtool", "apt-get install prometheus, or Prometheus' release")
    return subprocess.run(
        [promtool, *args], cwd=PROMETHEUS, capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.parametrize(
    "args",
    [
        ("check", "config", "prometheus.yml"),
        ("check", "rules", "alerts.yml"),
        ("test", "rules", "alerts_test.yml"),
    ],
    ids=" ".join,
)
def test_promtool(args: tuple[str, ...]) -> None:
    done = _promtool(*args)
    assert done.returncode == 0, f"promtool {' '.join(args)}:\n{done.stdout}\n{done.stderr}"


def test_the_promql_extractor() -> None:
    expr = (
        'sum by (kind) (rate(broker_connection_dropped_frames_total{reason="broker_x", '
        "job=~'broker_y'}[5m])) / on() group_left broker_buffer_budget_bytes"
        ' and up{instance=~"$instance"} # broker_in_a_comment'
    )
    assert promql_broker_metrics(expr) == {
        "broker_connection_dropped_frames_total",
        "broker_buffer_budget_bytes",
    }


def test_prometheus_config_scrapes_the_broker_and_loads_the_alerts() -> None:
    config = load_yaml(PROMETHEUS / "prometheus.yml")
    assert config["rule_files"] == ["alerts.yml"]
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    broker = jobs["broker"]  # the alerts select job="broker"
    interval = broker.get("scrape_interval", config["global"].get("scrape_interval"))
    assert interval == "15s"
    assert broker.get("metrics_path", "/metrics") == "/metrics"


def test_the_alerts_are_the_promised_ones() -> None:
    names = alert_names()
    assert len(names) == len(set(names)), "alert names are unique"
    assert set(names) == EXPECTED_ALERTS


def test_alert_expressions_use_existing_metrics() -> None:
    known = broker_metric_names()
    for rule in alert_rules():
        used = promql_broker_metrics(rule["expr"])
        assert used or re.search(r"\bup\b", rule["expr"]), f"{rule['alert']} uses no metric"
        unknown = used - known
        assert not unknown, f"{rule['alert']}: not in broker.metrics.METRICS: {sorted(unknown)}"
        assert 'job="broker"' in rule["expr"], f"{rule['alert']} selects job=broker"
    assert "up" in PROMETHEUS_BUILTINS


def test_alerts_have_severity_summary_description_and_runbook() -> None:
    for rule in alert_rules():
        name = rule["alert"]
        assert rule["labels"]["severity"] in ("critical", "warning"), name
        annotations = rule["annotations"]
        assert annotations.get("summary") and annotations.get("description"), name
        url = urlsplit(annotations["runbook_url"])
        assert url.path.endswith(RUNBOOK), f"{name}: runbook_url points into {RUNBOOK}"
        assert url.fragment == name.lower(), f"{name}: runbook anchor #{name.lower()}"


def test_every_alert_has_a_runbook_section() -> None:
    """docs/operations.md has a ``### <AlertName>`` heading for each alert,
    which GitHub turns into the anchor its runbook_url names."""
    operations = REPO / RUNBOOK
    assert operations.is_file(), f"{RUNBOOK} is missing"
    headings = set(re.findall(r"^### (\S+)\s*$", operations.read_text(encoding="utf-8"), re.M))
    missing = sorted(set(alert_names()) - headings)
    assert not missing, f"{RUNBOOK} has no '### <name>' section for {missing}"


def test_every_alert_is_unit_tested_firing_and_not_firing() -> None:
    tests = load_yaml(PROMETHEUS / "alerts_test.yml")
    assert tests["rule_files"] == ["alerts.yml"]
    firing: set[str] = set()
    quiet: set[str] = set()
    for case in tests["tests"]:
        for check in case.get("alert_rule_test", []):
            (firing if check.get("exp_alerts") else quiet).add(check["alertname"])
    for name in alert_names():
        assert name in firing, f"alerts_test.yml never expects {name} to fire"
        assert name in quiet, f"alerts_test.yml never expects {name} to stay quiet"
    expected_annotations: list[dict[str, Any]] = [
        alert["exp_annotations"]
        for case in tests["tests"]
        for check in case.get("alert_rule_test", [])
        for alert in check.get("exp_alerts") or []
    ]
    assert all("runbook_url" in a for a in expected_annotations), "tests pin the runbooks"


def test_rule_files_are_relative_to_the_prometheus_directory() -> None:
    for name in ("prometheus.yml", "alerts_test.yml"):
        for rule_file in load_yaml(PROMETHEUS / name)["rule_files"]:
            assert (PROMETHEUS / Path(rule_file)).is_file()
