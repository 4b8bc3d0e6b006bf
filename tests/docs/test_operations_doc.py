"""docs/operations.md stays true to the code: every setting with its real
default, every alert with a runbook, every documented command and metric real."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import yaml

from broker.cli import build_parser
from broker.config import DEFAULT_TOPIC_RULE, FIELDS, TOPIC_KEYS, BrokerConfig
from broker.metrics import METRICS
from broker.workers._merge import SUPERVISOR_FAMILIES

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")


def toml_value(value: object) -> str:
    if isinstance(value, str):
        return f'"{value}"'
    return str(value)


def test_every_setting_is_in_the_reference_with_its_default() -> None:
    rows = {
        match[1]: match[2]
        for match in re.finditer(r"^\| `(\w+)` \| `([^`]*)` \|", DOC, re.MULTILINE)
    }
    # Every field is a setting with a row, but `topics`: the [[topics]] tables (below).
    assert {f.name for f in dataclasses.fields(BrokerConfig)} == {*FIELDS, "topics"}
    settings = {f.name: toml_value(f.default) for f in dataclasses.fields(BrokerConfig)}
    del settings["topics"]
    assert rows == settings


def test_every_topics_key_is_in_the_reference_with_its_default() -> None:
    """The [[topics]] table of "Data directory": each key, and its default
    after the words (`| `retain_bytes` | 1 GiB: `1073741824` |`)."""
    rows = {
        match[1]: match[2]
        for match in re.finditer(r"^\| `(\w+)` \| [^`|]+: `([^`]*)` \|", DOC, re.MULTILINE)
    }
    assert rows.pop("pattern")
    defaults = {key: toml_value(getattr(DEFAULT_TOPIC_RULE, key)) for key in TOPIC_KEYS}
    del defaults["pattern"]
    assert rows == defaults


def test_every_alert_has_a_runbook_section() -> None:
    rules = yaml.safe_load((ROOT / "deploy" / "prometheus" / "alerts.yml").read_text())
    alerts = [rule["alert"] for group in rules["groups"] for rule in group["rules"]]
    headings = re.findall(r"^### (Broker\w+)$", DOC, re.MULTILINE)
    assert headings == alerts


def test_the_metrics_named_exist() -> None:
    named = set(re.findall(r"`(broker_[a-z_]+)", DOC))
    # A worker broker's own series, and the supervisor's of a multi-worker one.
    known = {spec.name for spec in METRICS} | set(SUPERVISOR_FAMILIES)
    assert named and named <= known, named - known


def test_the_commands_named_exist() -> None:
    parser = build_parser()
    subcommands = next(action for action in parser._actions if action.dest == "command").choices
    assert subcommands is not None
    named = set(re.findall(r"`broker (\w+)", DOC))
    assert named <= set(subcommands), named - set(subcommands)
