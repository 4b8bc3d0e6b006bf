"""deploy/k8s: the manifests fit together, match the image and the broker, and carry
the same alerts and config as deploy/prometheus and deploy/broker.toml."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from broker.config import load_config, parse_address

from .helpers import DEPLOY, K8S, PROMETHEUS, load_yaml, load_yaml_all


@pytest.fixture(scope="module")
def kustomization() -> dict[str, Any]:
    return dict(load_yaml(K8S / "kustomization.yaml"))


@pytest.fixture(scope="module")
def objects(kustomization: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The kustomization's resources, by kind (one object of each kind)."""
    found: dict[str, dict[str, Any]] = {}
    for name in kustomization["resources"]:
        for document in load_yaml_all(K8S / name):
            assert document["kind"] not in found, f"a second {document['kind']}"
            found[document["kind"]] = document
    return found


def _container(objects: dict[str, dict[str, Any]]) -> dict[str, Any]:
    (container,) = objects["StatefulSet"]["spec"]["template"]["spec"]["containers"]
    return dict(container)


def _config_text(objects: dict[str, dict[str, Any]]) -> str:
    return str(objects["ConfigMap"]["data"]["broker.toml"])


def test_kustomization_lists_every_manifest(kustomization: dict[str, Any]) -> None:
    listed = set(kustomization["resources"])
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == on_disk
    assert "namespace" not in kustomization, "namespace-agnostic"


def test_every_object_is_named_and_namespace_agnostic(
    objects: dict[str, dict[str, Any]],
) -> None:
    assert set(objects) == {
        "ConfigMap",
        "StatefulSet",
        "Service",
        "ServiceMonitor",
        "PrometheusRule",
    }
    for kind, document in objects.items():
        assert document["apiVersion"] and document["metadata"]["name"], kind
        assert "namespace" not in document["metadata"], f"{kind} names a namespace"
    assert objects["ServiceMonitor"]["apiVersion"] == "monitoring.coreos.com/v1"
    assert objects["PrometheusRule"]["apiVersion"] == "monitoring.coreos.com/v1"


def test_prometheus_rule_is_alerts_yml(objects: dict[str, dict[str, Any]]) -> None:
    alerts = load_yaml(PROMETHEUS / "alerts.yml")
    assert objects["PrometheusRule"]["spec"]["groups"] == alerts["groups"]


def test_configmap_is_deploy_broker_toml_and_loads(
    objects: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    text = _config_text(objects)
    assert text == (DEPLOY / "broker.toml").read_text(encoding="utf-8")
    path = tmp_path / "broker.toml"
    path.write_text(text, encoding="utf-8")
    load_config(path, environ={})


def test_statefulset_is_one_replica_never_two_at_once(objects: dict[str, dict[str, Any]]) -> None:
    """Was a Deployment with one replica and the Recreate strategy: a
    StatefulSet of one replica, updated by rolling (which stops the old pod
    before it starts the new one), ordered, governed by the Service."""
    spec = objects["StatefulSet"]["spec"]
    assert spec["replicas"] == 1, "one broker: two would be two separate brokers"
    assert spec.get("updateStrategy", {}).get("type", "RollingUpdate") == "RollingUpdate"
    assert spec.get("podManagementPolicy", "OrderedReady") == "OrderedReady"
    assert spec["serviceName"] == objects["Service"]["metadata"]["name"]
    selector = spec["selector"]["matchLabels"]
    labels = spec["template"]["metadata"]["labels"]
    assert selector.items() <= labels.items()


def test_statefulset_keeps_the_data_directory_on_a_persistent_volume(
    objects: dict[str, dict[str, Any]],
) -> None:
    """The data directory the broker is given (``--data-dir`` in args, else
    ``BROKER_DATA_DIR``) is where a claim of the volumeClaimTemplates is mounted."""
    spec = objects["StatefulSet"]["spec"]
    container = _container(objects)
    env = {item["name"]: item["value"] for item in container["env"]}
    args = list(container.get("args", []))
    data_dir = (
        args[args.index("--data-dir") + 1] if "--data-dir" in args else env["BROKER_DATA_DIR"]
    )
    assert "--memory-only" not in args
    (claim,) = spec["volumeClaimTemplates"]
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == data_dir]
    assert mount["name"] == claim["metadata"]["name"] and not mount.get("readOnly")
    pod_volumes = {volume["name"] for volume in spec["template"]["spec"].get("volumes", [])}
    assert claim["metadata"]["name"] not in pod_volumes, "the claim, not a pod volume"
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert claim["spec"]["resources"]["requests"]["storage"]
    retention = spec["persistentVolumeClaimRetentionPolicy"]
    assert retention == {"whenDeleted": "Retain", "whenScaled": "Retain"}
    # The image's user can write to it: fsGroup is its group.
    pod_security = spec["template"]["spec"]["securityContext"]
    assert pod_security["fsGroup"] == pod_security["runAsGroup"]


def test_pod_security_and_resources(objects: dict[str, dict[str, Any]]) -> None:
    pod = objects["StatefulSet"]["spec"]["template"]["spec"]
    # Service links would inject BROKER_SERVICE_HOST, BROKER_PORT, ... into the
    # broker's BROKER_* configuration namespace.
    assert pod["enableServiceLinks"] is False
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    container = _container(objects)
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    resources = container["resources"]
    assert resources["requests"]["memory"] and resources["limits"]["memory"]


def test_pod_probes_and_ports_match_the_broker(objects: dict[str, dict[str, Any]]) -> None:
    container = _container(objects)
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    env = {item["name"]: item["value"] for item in container["env"]}
    assert (
        ports
        == {
            "client": parse_address(env["BROKER_LISTEN"])[1],
            "mqtt": parse_address(env["BROKER_MQTT_LISTEN"])[1],
            "metrics": parse_address(env["BROKER_METRICS_LISTEN"])[1],
        }
        == {"client": 7400, "mqtt": 1883, "metrics": 9400}
    )
    probes = {
        name: container[name]["httpGet"]
        for name in ("startupProbe", "livenessProbe", "readinessProbe")
        if name in container
    }
    assert probes["livenessProbe"]["path"] == "/healthz"
    assert probes["readinessProbe"]["path"] == "/readyz"
    for name, probe in probes.items():
        port = probe["port"]
        assert ports.get(port, port) == 9400, f"{name} asks the metrics port"
    annotations = objects["StatefulSet"]["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == 9400
    assert annotations["prometheus.io/path"] == "/metrics"


def test_pod_mounts_the_configmap_where_broker_config_points(
    objects: dict[str, dict[str, Any]],
) -> None:
    pod = objects["StatefulSet"]["spec"]["template"]["spec"]
    container = _container(objects)
    env = {item["name"]: item["value"] for item in container["env"]}
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    (mount,) = [m for m in container["volumeMounts"] if "configMap" in volumes.get(m["name"], {})]
    assert volumes[mount["name"]]["configMap"]["name"] == objects["ConfigMap"]["metadata"]["name"]
    assert env["BROKER_CONFIG"] == mount["mountPath"] + "/broker.toml"
    assert mount.get("readOnly") is True


def test_termination_grace_is_above_the_shutdown_deadline(
    objects: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    path = tmp_path / "broker.toml"
    path.write_text(_config_text(objects), encoding="utf-8")
    deadline = load_config(path, environ={}).shutdown_deadline
    grace = objects["StatefulSet"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > deadline + 5


def test_service_selects_the_pods_and_targets_named_ports(
    objects: dict[str, dict[str, Any]],
) -> None:
    service = objects["Service"]
    labels = objects["StatefulSet"]["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    container_ports = {p["name"]: p["containerPort"] for p in _container(objects)["ports"]}
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    expected = {"client": 7400, "mqtt": 1883, "metrics": 9400}
    assert {name: p["port"] for name, p in ports.items()} == expected
    for port in ports.values():
        assert port["targetPort"] in container_ports


def test_service_monitor_scrapes_the_service_metrics_port(
    objects: dict[str, dict[str, Any]],
) -> None:
    monitor = objects["ServiceMonitor"]["spec"]
    service = objects["Service"]
    assert monitor["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["port"] == "metrics" and endpoint.get("path", "/metrics") == "/metrics"
    # The operator's job label is the Service's name; the alerts select job="broker".
    assert "jobLabel" not in monitor and service["metadata"]["name"] == "broker"


def test_kustomization_image_is_the_containers(
    kustomization: dict[str, Any], objects: dict[str, dict[str, Any]]
) -> None:
    names = {image["name"] for image in kustomization.get("images", [])}
    assert _container(objects)["image"].split(":")[0] in names
