"""deploy/systemd/broker.service: systemd-analyze verify and security, and the
directives the deployment promises."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from broker.config import load_config

from .helpers import DEPLOY, SYSTEMD, require_tool

UNIT = SYSTEMD / "broker.service"
EXEC_START = "/opt/broker/bin/broker serve --config /etc/broker/broker.toml"


def _directives(text: str) -> dict[str, list[str]]:
    """``Section.Key`` -> the values it is given, in order (continuations joined)."""
    directives: dict[str, list[str]] = {}
    section = ""
    logical = re.sub(r"\\\n", " ", text)
    for raw in logical.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        directives.setdefault(f"{section}.{key.strip()}", []).append(value.strip())
    return directives


@pytest.fixture(scope="module")
def service() -> dict[str, list[str]]:
    directives = _directives(UNIT.read_text(encoding="utf-8"))
    return {k.removeprefix("Service."): v for k, v in directives.items()}


def _one(service: dict[str, list[str]], key: str) -> str:
    assert key in service, f"broker.service sets {key}="
    return service[key][-1]


def _seconds(value: str) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(s|sec|min|m)?", value)
    assert match, f"unsupported time span {value!r}"
    return float(match.group(1)) * (60 if match.group(2) in ("min", "m") else 1)


def _broker_executable() -> str:
    """The ``broker`` command of the environment running the tests."""
    found = Path(sys.executable).parent / "broker"
    if found.exists():
        return str(found)
    which = shutil.which("broker")
    assert which, "the broker command is installed (pip install .)"
    return which


def _testable_copy(tmp_path: Path) -> Path:
    """The unit with ExecStart= naming this environment's broker: systemd-analyze
    verify fails on an ExecStart= executable that does not exist, and
    /opt/broker/bin/broker does not exist on the build machine."""
    text = UNIT.read_text(encoding="utf-8")
    assert text.count("/opt/broker/bin/broker serve") == 1
    copy = tmp_path / "broker.service"
    copy.write_text(text.replace("/opt/broker/bin/broker", _broker_executable()))
    return copy


def test_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = require_tool("systemd-analyze", "apt-get install systemd")
    done = subprocess.run(
        [analyze, "verify", str(_testable_copy(tmp_path))],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0 and "broker.service" not in output, output


def test_systemd_analyze_security_rates_it_ok(tmp_path: Path) -> None:
    """Exposure at most 2.0 of 10 ("OK"; systemd's --threshold is in tenths)."""
    analyze = require_tool("systemd-analyze", "apt-get install systemd")
    done = subprocess.run(
        [analyze, "security", "--offline=yes", "--threshold=20", str(_testable_copy(tmp_path))],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr


def test_runs_the_broker_with_the_config(service: dict[str, list[str]]) -> None:
    assert _one(service, "ExecStart") == EXEC_START
    assert _one(service, "Type") in ("exec", "simple")
    assert _one(service, "Restart") == "on-failure"
    dynamic = service.get("DynamicUser", ["no"])[-1] == "yes"
    user = service.get("User", ["root"])[-1]
    assert dynamic or user not in ("root", "0"), "an unprivileged user"


def test_stops_gracefully_within_its_timeout(service: dict[str, list[str]]) -> None:
    assert _one(service, "KillSignal") == "SIGTERM"
    deadline = load_config(DEPLOY / "broker.toml", environ={}).shutdown_deadline
    assert _seconds(_one(service, "TimeoutStopSec")) > deadline + 5


def test_sandboxing_directives(service: dict[str, list[str]]) -> None:
    expected = {
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "PrivateDevices": "yes",
        "ProtectKernelTunables": "yes",
        "ProtectKernelModules": "yes",
        "ProtectKernelLogs": "yes",
        "ProtectControlGroups": "yes",
        "RestrictNamespaces": "yes",
        "RestrictSUIDSGID": "yes",
        "LockPersonality": "yes",
        "CapabilityBoundingSet": "",
    }
    for key, value in expected.items():
        assert _one(service, key) == value, f"{key}={value}"
    assert set(_one(service, "RestrictAddressFamilies").split()) == {
        "AF_INET",
        "AF_INET6",
        "AF_UNIX",
    }
    assert "@system-service" in service["SystemCallFilter"][0].split()


def test_resource_limits(service: dict[str, list[str]]) -> None:
    assert re.fullmatch(r"\d+[KMGT]?", _one(service, "MemoryMax"))
    max_connections = load_config(DEPLOY / "broker.toml", environ={}).max_connections
    assert int(_one(service, "LimitNOFILE")) > max_connections


def test_the_data_directory_is_the_state_directory(service: dict[str, list[str]]) -> None:
    """systemd creates /var/lib/broker for the dynamic user and names it in
    $STATE_DIRECTORY, which ``broker serve`` uses when nothing else names one."""
    assert _one(service, "StateDirectory") == "broker"
    assert _one(service, "StateDirectoryMode") == "0700"
    command = _one(service, "ExecStart").split()
    assert "--data-dir" not in command and "--memory-only" not in command
    assert not any(line.startswith("BROKER_DATA_DIR") for line in service.get("Environment", []))
    config = load_config(DEPLOY / "broker.toml", environ={})
    assert config.data_dir == "" and not config.memory_only
