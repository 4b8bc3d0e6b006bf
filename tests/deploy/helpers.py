"""Shared helpers of the deploy/ tests: paths, file loaders, a PromQL metric-name
extractor, the broker's metric names, and finding the external tools."""

from __future__ import annotations

import json
import os
import re
import shutil
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest
import yaml

from broker.metrics import METRICS

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
PROMETHEUS = DEPLOY / "prometheus"
GRAFANA = DEPLOY / "grafana"
K8S = DEPLOY / "k8s"
SYSTEMD = DEPLOY / "systemd"

#: Metric names Prometheus itself provides, allowed in expressions beside the broker's.
PROMETHEUS_BUILTINS = frozenset({"up", "scrape_duration_seconds", "scrape_samples_scraped"})


def load_yaml(path: Path) -> Any:
    """The single YAML document in ``path``."""
    with path.open(encoding="utf-8") as file:
        return yaml.safe_load(file)


def load_yaml_all(path: Path) -> list[Any]:
    """Every (non-empty) YAML document in ``path``."""
    with path.open(encoding="utf-8") as file:
        return [doc for doc in yaml.safe_load_all(file) if doc is not None]


def load_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def load_toml(path: Path) -> dict[str, Any]:
    return tomllib.loads(path.read_text(encoding="utf-8"))


def broker_metric_names() -> frozenset[str]:
    """The sample names the broker exposes, per :data:`broker.metrics.METRICS`.

    A counter's spec is named with its ``_total`` suffix, and its samples carry
    that name; the family name (without ``_total``) is not a sample name and is
    deliberately not in this set. No counter exports a ``_created`` sample.
    """
    names = set()
    for spec in METRICS:
        if spec.type == "counter":
            assert spec.name.endswith("_total"), f"counter {spec.name} is not named *_total"
        if spec.type == "histogram":
            names.update(spec.name + suffix for suffix in ("_bucket", "_sum", "_count"))
            continue
        names.add(spec.name)
    # The supervisor's own series (a broker of several workers).
    names.update(("broker_workers", "broker_worker_up", "broker_worker_restarts_total"))
    return frozenset(names)


# A PromQL string literal: "...", '...' (with backslash escapes) or `...`.
_PROMQL_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
# An identifier that starts with broker_ and is not part of a longer word
# (nor a Grafana variable such as $broker_x).
_BROKER_IDENTIFIER = re.compile(r"(?<![A-Za-z0-9_:$])broker_[A-Za-z0-9_:]*")
_PROMQL_COMMENT = re.compile(r"#[^\n]*")


def promql_broker_metrics(expr: str) -> set[str]:
    """The ``broker_*`` identifiers of a PromQL expression (label values,
    string literals and comments are ignored)."""
    without_strings = _PROMQL_STRING.sub('""', expr)
    without_comments = _PROMQL_COMMENT.sub("", without_strings)
    return set(_BROKER_IDENTIFIER.findall(without_comments))


# Set by .ci/run, which installs every tool the deploy tests use: there a
# missing tool fails the test; elsewhere (a user's `python3 -m pytest`) it skips.
REQUIRE_TOOLS_ENV = "BROKER_REQUIRE_TOOLS"


def missing_tool(name: str, install_hint: str) -> NoReturn:
    """Skip the test, saying what to install; under CI (``$BROKER_REQUIRE_TOOLS``
    set to 1) fail it instead, so that a CI machine without the tool is noticed."""
    message = f"{name} is not installed; this test needs it ({install_hint})"
    if os.environ.get(REQUIRE_TOOLS_ENV) == "1":
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def require_tool(name: str, install_hint: str) -> str:
    """The path of executable ``name``; without it the test skips (fails under CI)."""
    path = shutil.which(name)
    if path is None:
        missing_tool(name, install_hint)
    return path


def alert_rules() -> list[dict[str, Any]]:
    """Every alerting rule of deploy/prometheus/alerts.yml."""
    groups = load_yaml(PROMETHEUS / "alerts.yml")["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def alert_names() -> list[str]:
    return [rule["alert"] for rule in alert_rules()]


def dashboard_panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel of a Grafana dashboard, rows' nested panels included."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])
