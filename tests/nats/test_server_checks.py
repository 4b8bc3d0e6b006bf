"""The front end's start-up checks of its NATS servers: the version, JetStream
on, and ``sync_interval: always`` on every server, from a real server's INFO
and answers to ``$SYS.REQ.SERVER.PING.JSZ`` (captured from nats-server 2.15.1
in tests/nats/data/, and asked of running servers)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from broker.nats._server_checks import (
    JSZ_PING_SUBJECT,
    check_info,
    check_jsz,
    check_server,
    check_stream_config,
    expected_answers,
    parse_version,
    servers_not_answering,
)
from broker.nats._servers import SYSTEM_PASSWORD, SYSTEM_USER, open_nats_servers
from tests.nats.raw import request, require_nats_server

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def nats_binary() -> Path:
    """The ``nats-server`` the tests start."""
    return require_nats_server()


def _load(name: str) -> Any:
    return json.loads((DATA / name).read_text())


CLUSTER_INFO: dict[str, Any] = _load("info_2.15.1_cluster.json")
CLUSTER_JSZ: list[dict[str, Any]] = _load("jsz_ping_cluster_sync_always.json")
SINGLE_INFO: dict[str, Any] = _load("info_2.15.1_single.json")
SINGLE_DEFAULT_SYNC_JSZ: list[dict[str, Any]] = _load("jsz_ping_single_default_sync.json")
NO_JETSTREAM_INFO: dict[str, Any] = _load("info_2.15.1_no_jetstream.json")
NO_JETSTREAM_JSZ: list[dict[str, Any]] = _load("jsz_ping_no_jetstream.json")


@pytest.mark.parametrize(
    ("text", "version"),
    [
        ("2.15.1", (2, 15, 1)),
        ("v2.11.0-RC.1", (2, 11, 0)),
        ("2.15.0-dev", (2, 15, 0)),
        ("2.9.10", (2, 9, 10)),
        ("", None),
        ("latest", None),
        (None, None),
        (2, None),
    ],
)
def test_versions_are_read(text: object, version: tuple[int, int, int] | None) -> None:
    assert parse_version(text) == version


def test_a_healthy_cluster_has_no_problem() -> None:
    assert len(CLUSTER_JSZ) == 3
    assert check_server(CLUSTER_INFO, CLUSTER_JSZ) == []


@pytest.mark.parametrize("version", ["2.9.10", "2.10.0", "2.10.22", "0.1.0"])
def test_a_server_too_old_is_refused(version: str) -> None:
    info = CLUSTER_INFO | {"version": version}
    (problem,) = check_server(info, CLUSTER_JSZ)
    assert problem.startswith(f"nats-server n1 is {version}, too old: cluster mode needs 2.10.23")
    answer = copy.deepcopy(CLUSTER_JSZ[0])
    answer["server"]["ver"] = version
    assert len(check_jsz(answer)) == 1


@pytest.mark.parametrize("version", ["2.10.23", "2.11.0", "2.15.1", "3.0.0"])
def test_a_recent_enough_server_is_taken(version: str) -> None:
    assert check_info(CLUSTER_INFO | {"version": version}) == []


def test_an_unreadable_version_is_refused() -> None:
    (problem,) = check_info(CLUSTER_INFO | {"version": "latest"})
    assert "no version that can be read ('latest')" in problem


def test_a_server_without_jetstream_is_refused_once() -> None:
    (problem,) = check_server(NO_JETSTREAM_INFO, NO_JETSTREAM_JSZ)
    assert "has JetStream off" in problem


def test_a_server_that_does_not_sync_every_write_is_refused() -> None:
    (problem,) = check_server(SINGLE_INFO, SINGLE_DEFAULT_SYNC_JSZ)
    assert problem.startswith("JetStream on nats-server n1 does not sync every write")
    assert "sync_interval: always" in problem
    assert "--cluster-unsafe-sync" in problem
    assert check_server(SINGLE_INFO, SINGLE_DEFAULT_SYNC_JSZ, unsafe_sync=True) == []


def test_one_server_of_three_without_sync_is_named() -> None:
    answers = copy.deepcopy(CLUSTER_JSZ)
    del answers[2]["data"]["config"]["sync_always"]
    name = answers[2]["server"]["name"]
    (problem,) = check_server(CLUSTER_INFO, answers)
    assert problem.startswith(f"JetStream on nats-server {name} does not sync every write")


def test_a_bare_jsz_document_is_checked_too() -> None:
    assert check_jsz(CLUSTER_JSZ[0]["data"]) == []
    (problem,) = check_jsz(SINGLE_DEFAULT_SYNC_JSZ[0]["data"])
    assert "does not sync every write" in problem


def test_no_answer_means_the_sync_cannot_be_verified() -> None:
    for answers in (None, []):
        (problem,) = check_server(CLUSTER_INFO, answers)
        assert problem.startswith("cannot verify that JetStream syncs every write")
        assert JSZ_PING_SUBJECT in problem
    assert check_server(CLUSTER_INFO, None, unsafe_sync=True) == []


def test_every_problem_is_one_line() -> None:
    problems = (
        check_server(CLUSTER_INFO | {"version": "2.9.10", "jetstream": False}, None)
        + check_server(SINGLE_INFO, SINGLE_DEFAULT_SYNC_JSZ)
        + check_stream_config({"name": "t", "persist_mode": "async"})
    )
    assert len(problems) == 5
    assert all("\n" not in problem for problem in problems)


def test_how_many_answers_to_wait_for() -> None:
    assert expected_answers(CLUSTER_JSZ[:1]) == 3
    assert expected_answers(SINGLE_DEFAULT_SYNC_JSZ) == 1
    assert expected_answers([]) == 1


def test_servers_that_did_not_answer_are_named() -> None:
    assert servers_not_answering(CLUSTER_JSZ) == []
    missing = CLUSTER_JSZ[2]["server"]["name"]
    assert servers_not_answering(CLUSTER_JSZ[:2]) == [missing]
    assert servers_not_answering(SINGLE_DEFAULT_SYNC_JSZ) == []


def test_a_stream_persisting_asynchronously_is_refused() -> None:
    (problem,) = check_stream_config({"name": "orders", "persist_mode": "async"})
    assert "orders" in problem
    assert check_stream_config({"name": "orders", "persist_mode": "default"}) == []
    assert check_stream_config({"name": "orders"}) == []


def test_a_cluster_asked_over_the_client_port(tmp_path: Path, nats_binary: Path) -> None:
    """A system-account user and an account importing the JSZ ping both get
    every server's answer, which pass the checks; an account without the
    import gets no responders, so the sync cannot be verified."""
    with open_nats_servers(
        tmp_path / "always", 3, system_account=True, app_jsz_import=True, binary=nats_binary
    ) as servers:
        for auth in ({"user": SYSTEM_USER, "password": SYSTEM_PASSWORD}, {}):
            info, answers = request(servers.urls[1], JSZ_PING_SUBJECT, expect=3, wait=10, **auth)
            jsz = [json.loads(body) for _, body in answers]
            assert len(jsz) == expected_answers(jsz) == 3
            assert check_server(info, jsz) == []
    with open_nats_servers(
        tmp_path / "default", 1, system_account=True, sync_always=False, binary=nats_binary
    ) as servers:
        info, answers = request(servers.urls[0], JSZ_PING_SUBJECT, expect=1, wait=10)
        assert answers == [("503", b"")]
        (problem,) = check_server(info, None)
        assert problem.startswith("cannot verify")
        auth = {"user": SYSTEM_USER, "password": SYSTEM_PASSWORD}
        info, answers = request(servers.urls[0], JSZ_PING_SUBJECT, expect=1, wait=10, **auth)
        (problem,) = check_server(info, [json.loads(body) for _, body in answers])
        assert "does not sync every write" in problem
