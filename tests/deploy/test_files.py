"""Every deploy/ file parses; deploy/broker.toml; deploy/compose.yaml."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from broker.config import FIELDS, TOPIC_KEYS, BrokerConfig, load_config, parse_address

from .helpers import DEPLOY, REPO, load_json, load_toml, load_yaml, load_yaml_all

YAML_FILES = sorted([*DEPLOY.rglob("*.yml"), *DEPLOY.rglob("*.yaml")])
JSON_FILES = sorted(DEPLOY.rglob("*.json"))


def _id(path: Path) -> str:
    return str(path.relative_to(DEPLOY))


def test_the_deploy_files_are_there() -> None:
    expected = [
        "Dockerfile",
        "README.md",
        "broker.toml",
        "compose.yaml",
        "prometheus/prometheus.yml",
        "prometheus/alerts.yml",
        "prometheus/alerts_test.yml",
        "grafana/provisioning/datasources/prometheus.yml",
        "grafana/provisioning/dashboards/broker.yml",
        "grafana/dashboards/broker.json",
        "systemd/broker.service",
        "k8s/kustomization.yaml",
    ]
    missing = [name for name in expected if not (DEPLOY / name).is_file()]
    assert not missing
    assert (REPO / ".dockerignore").is_file()


def test_the_guide_points_to_workers_for_more_than_one_core() -> None:
    """One broker uses every core with `workers`: the guide says so, not "run several"."""
    guide = " ".join((DEPLOY / "README.md").read_text().split())
    sentence = guide[guide.index("To use more than one core") :].split(".")[0]
    assert "`workers`" in sentence
    assert "run several" not in sentence


@pytest.mark.parametrize("path", YAML_FILES, ids=_id)
def test_yaml_file_parses(path: Path) -> None:
    documents = load_yaml_all(path)
    assert documents, f"{path} holds no YAML document"
    assert all(isinstance(doc, dict) for doc in documents)


@pytest.mark.parametrize("path", JSON_FILES, ids=_id)
def test_json_file_parses(path: Path) -> None:
    assert isinstance(load_json(path), dict)


# ---------------------------------------------------------------- broker.toml


def test_example_config_loads() -> None:
    config = load_config(DEPLOY / "broker.toml", environ={})
    assert parse_address(config.listen)[1] == 7400
    assert parse_address(config.metrics_listen)[1] == 9400


def test_example_config_mentions_every_setting() -> None:
    text = (DEPLOY / "broker.toml").read_text(encoding="utf-8")
    mentioned = set(re.findall(r"^#? ?([a-z_]+) = ", text, re.MULTILINE))
    # Every field is a setting by name, but `topics`: [[topics]] tables.
    assert {f.name for f in dataclasses.fields(BrokerConfig)} == {*FIELDS, "topics"}
    missing = set(FIELDS) - mentioned
    assert not missing, f"deploy/broker.toml does not describe {sorted(missing)}"
    assert re.search(r"^# \[\[topics\]\]$", text, re.MULTILINE), "an example [[topics]] table"
    for key in TOPIC_KEYS:
        assert re.search(rf"\b{key}\b", text), f"deploy/broker.toml does not describe {key}"


def test_the_example_topics_tables_load(tmp_path: Path) -> None:
    """The commented [[topics]] example, uncommented, is a valid config."""
    text = (DEPLOY / "broker.toml").read_text(encoding="utf-8")
    start = text.index("# [[topics]]")
    example = re.match(r"(?:#(?: .*)?\n)+", text[start:])
    assert example is not None
    uncommented = "\n".join(line[2:] for line in example.group(0).splitlines())
    path = tmp_path / "broker.toml"
    path.write_text(uncommented, encoding="utf-8")
    config = load_config(path, environ={})
    assert len(config.topics) >= 1 and config.log_dir is None


def test_example_config_values_are_the_defaults_but_the_addresses() -> None:
    table = load_toml(DEPLOY / "broker.toml")["broker"]
    defaults = BrokerConfig()
    differing = {
        name: (value, getattr(defaults, name))
        for name, value in table.items()
        if name not in ("listen", "metrics_listen") and value != getattr(defaults, name)
    }
    assert not differing, f"values the file says are the defaults and are not: {differing}"


# ---------------------------------------------------------------- compose.yaml


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return dict(load_yaml(DEPLOY / "compose.yaml"))


def _bind_mounts(service: dict[str, Any]) -> dict[str, str]:
    """Host path (relative to deploy/) -> container path, of the service's bind mounts."""
    mounts = {}
    for volume in service.get("volumes", []):
        source, target, *_ = volume.split(":")
        if source.startswith("."):
            mounts[source] = target
    return mounts


def test_compose_services_and_dependencies(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) >= {"broker", "prometheus", "grafana"}
    for name, service in services.items():
        assert "healthcheck" in service, f"{name} has a healthcheck"
        for dependency, condition in service.get("depends_on", {}).items():
            assert dependency in services
            assert condition["condition"] == "service_healthy"
    assert "broker" in services["prometheus"]["depends_on"]
    assert "prometheus" in services["grafana"]["depends_on"]
    for name, service in services.items():
        for source in _bind_mounts(service):
            assert (DEPLOY / source).exists(), f"{name} mounts {source}, which does not exist"
    named = {v.split(":")[0] for s in services.values() for v in s.get("volumes", [])}
    assert {n for n in named if not n.startswith(".")} <= set(compose.get("volumes", {}))


def test_compose_broker_builds_the_dockerfile_and_mounts_the_config(
    compose: dict[str, Any],
) -> None:
    broker = compose["services"]["broker"]
    context = (DEPLOY / broker["build"]["context"]).resolve()
    assert context == REPO
    assert (context / broker["build"]["dockerfile"]).resolve() == DEPLOY / "Dockerfile"
    mounts = _bind_mounts(broker)
    assert mounts["./broker.toml"] == broker["environment"]["BROKER_CONFIG"]
    published = {int(str(p).rsplit(":", 1)[1]) for p in broker["ports"]}
    assert published == {7400, 1883, 9400}
    assert parse_address(broker["environment"]["BROKER_MQTT_LISTEN"])[1] == 1883
    metrics_port = parse_address(broker["environment"]["BROKER_METRICS_LISTEN"])[1]
    healthcheck = broker["healthcheck"]["test"]
    assert healthcheck[1:3] == ["broker", "health"]
    assert healthcheck[healthcheck.index("--metrics") + 1] == f"127.0.0.1:{metrics_port}"
    deadline = load_config(DEPLOY / "broker.toml", environ={}).shutdown_deadline
    assert broker["stop_signal"] == "SIGTERM"
    assert float(broker["stop_grace_period"].rstrip("s")) > deadline


def test_compose_broker_keeps_its_data_directory_in_a_named_volume(
    compose: dict[str, Any],
) -> None:
    broker = compose["services"]["broker"]
    command = broker.get("command", [])
    flagged = command[command.index("--data-dir") + 1] if "--data-dir" in command else None
    data_dir = flagged or broker["environment"]["BROKER_DATA_DIR"]
    assert "--memory-only" not in command
    mounts = {}
    for volume in broker["volumes"]:
        source, target, *options = volume.split(":")
        mounts[target] = (source, options)
    source, options = mounts[data_dir]
    assert source in compose["volumes"] and "ro" not in options, "a writable named volume"


def test_compose_prometheus_and_grafana_mounts_match_their_configs(
    compose: dict[str, Any],
) -> None:
    services = compose["services"]
    prometheus = services["prometheus"]
    config_dir = _bind_mounts(prometheus)["./prometheus"]
    config_flag = next(c for c in prometheus["command"] if c.startswith("--config.file="))
    assert PurePosixPath(config_flag.split("=", 1)[1]).parent == PurePosixPath(config_dir)
    scrape = load_yaml(DEPLOY / "prometheus" / "prometheus.yml")["scrape_configs"]
    targets = [t for job in scrape for sc in job["static_configs"] for t in sc["targets"]]
    assert "broker:9400" in targets, "Prometheus scrapes the compose service broker"

    grafana = services["grafana"]
    mounts = _bind_mounts(grafana)
    assert mounts["./grafana/provisioning"] == "/etc/grafana/provisioning"
    provider = load_yaml(DEPLOY / "grafana/provisioning/dashboards/broker.yml")["providers"][0]
    assert mounts["./grafana/dashboards"] == provider["options"]["path"]
    datasource = load_yaml(DEPLOY / "grafana/provisioning/datasources/prometheus.yml")
    url = datasource["datasources"][0]["url"]
    assert re.fullmatch(r"http://prometheus:9090/?", url), "the compose service prometheus"
    environment = grafana["environment"]
    assert environment["GF_AUTH_ANONYMOUS_ENABLED"] == "true"
    assert environment["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"
    assert "${GRAFANA_ADMIN_PASSWORD" in environment["GF_SECURITY_ADMIN_PASSWORD"]
