"""The supervisor of a multi-worker broker: it makes the sockets, starts N
worker processes, restarts one that ends, and passes signals on.

One broker process is one core. ``broker serve --workers N`` runs N worker
processes behind one address instead: each is a full broker (its own event
loop, accounts and budgets) that owns the topics rendezvous hashing gives
it. The supervisor itself handles no client traffic: it holds the data
directory's lock, the listening sockets (so a restarted worker listens on
the same ones and nothing waiting in a backlog is refused), watches the
workers and serves the merged metrics.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from broker.config import BrokerConfig
from broker.log import DirLock
from broker.protocol import Member, owner_id
from broker.server import clear_row, create_counts, rehome_state

from ._client import FetchError, http_get
from ._info import WorkerInfo
from ._sockets import reuseport_group, tcp_listener, unix_datagram, unix_listener
from ._spec import SPEC_VARIABLE, WorkerSpec

__all__ = ["Supervisor", "WorkerFailed", "WorkerProcess", "serve_workers"]

log = logging.getLogger("broker.workers")

#: Seconds a worker has to start listening before it counts as failed.
START_TIMEOUT = 60.0
#: Restart delays: the first, and the most (doubling in between).
RESTART_DELAY = 0.1
RESTART_DELAY_MAX = 5.0
#: A worker that ran this long before it ended is restarted without delay growth.
HEALTHY_AFTER = 30.0
#: Seconds a worker has beyond the shutdown deadline before it is killed.
STOP_GRACE = 10.0
#: A worker that runs is asked for its ``/healthz`` this often (seconds),
#: each time within ``WATCH_TIMEOUT``; after ``HUNG_AFTER`` unanswered asks
#: in a row (a minute or more) it is hung (its event loop does not run):
#: it is killed, and restarted as any worker that ends. (A loop blocked that
#: long by legitimate work, such as hundreds of large logs opened at once
#: by their first publishes, has cut all its clients at their lease already.)
WATCH_EVERY = 5.0
WATCH_TIMEOUT = 5.0
HUNG_AFTER = 12
#: Hosts that mean every interface (not an address a client can dial).
WILDCARDS = frozenset({"", "0.0.0.0", "::"})


class WorkerFailed(Exception):
    """A worker could not start (its own error line went to stderr before)."""


@dataclass
class WorkerProcess:
    """One worker: its sockets (kept by the supervisor across restarts) and
    what the supervisor knows of its current process."""

    index: int
    id: str
    public: socket.socket
    direct: socket.socket
    link: socket.socket
    link_path: str
    handover: socket.socket
    handover_path: str
    #: The worker's direct address as clients are told it.
    member: Member
    process: trio.Process | None = None
    #: Listening now (its ready line came, its process has not ended).
    up: bool = False
    restarts: int = 0
    #: Its private metrics endpoint (host, port), once it is up.
    metrics: tuple[str, int] | None = None
    #: The last way it ended (an exit status, or minus the signal).
    last_exit: int | None = None
    _ready: trio.Event = field(default_factory=trio.Event)
    _changed: trio.Event = field(default_factory=trio.Event)

    @property
    def pid(self) -> int | None:
        """Its current (or last) process's id."""
        return None if self.process is None else self.process.pid

    def _change(self, up: bool) -> None:
        self.up = up
        self._changed.set()
        self._changed = trio.Event()

    async def wait_up(self, restarts: int = 0) -> None:
        """Until this worker is up after at least ``restarts`` restarts."""
        while not (self.up and self.restarts >= restarts):
            await self._changed.wait()


def _advertised(config: BrokerConfig, host: str) -> str:
    if config.advertise_host:
        return config.advertise_host
    return socket.gethostname() if host in WILDCARDS else host


class Supervisor:
    """N worker processes behind one address; from :func:`serve_workers`."""

    def __init__(self, config: BrokerConfig, count: int, *, log_level: str = "INFO") -> None:
        self.config = config
        self.count = count
        self.log_level = log_level
        self.epoch = int(time.time() * 1000)
        #: The public address (bound; useful with port 0).
        self.address: tuple[str, int] = ("", 0)
        self.workers: list[WorkerProcess] = []
        self.closing = False
        self._runtime: Path | None = None
        self._lock: DirLock | None = None
        #: The life pipe: workers get its read end; only this process holds
        #: the write end, so it closes exactly when the supervisor ends.
        self._life: tuple[int, int] | None = None
        #: The principals whose connections the workers count together (with auth).
        self._principals: list[str] = []
        self._counts: Path | None = None

    # ---------------------------------------------------------------- set-up

    def _worker_config(self) -> BrokerConfig:
        """A worker's configuration: its share of the global budget."""
        config = self.config
        share = max(config.connection_budget, config.global_budget // self.count)
        return config.replace(global_budget=share, workers="1")

    def make_sockets(self) -> None:
        """Lock the data directory and make every worker's sockets."""
        config = self.config
        if config.log_dir is not None:
            self._lock = DirLock(config.log_dir)
            ids = [f"w{index}" for index in range(self.count)]
            rehome_state(
                Path(config.log_dir),
                lambda topic: owner_id(topic, ids),
                lambda session: ids[session[0] % self.count] if session else None,
            )
        host, port = config.listen_address
        self._runtime = Path(tempfile.mkdtemp(prefix="broker-workers-"))
        self._life = os.pipe()
        if config.auth_file:
            from broker.auth import load_auth_file

            self._principals = sorted(load_auth_file(config.auth_file).principals)
            self._counts = self._runtime / "connections.counts"
            create_counts(self._counts, self.count, self._principals)
        publics = reuseport_group(host, port, self.count)
        self.address = (host, publics[0].getsockname()[1])
        advertised = _advertised(config, host)
        for index, public in enumerate(publics):
            direct_port = config.worker_port + index if config.worker_port else 0
            direct = tcp_listener(host, direct_port)
            worker_id = f"w{index}"
            path = self._runtime / f"{worker_id}.sock"
            link = unix_listener(path)
            handover_path = self._runtime / f"{worker_id}.handover"
            handover = unix_datagram(handover_path)
            member = Member(worker_id, advertised, direct.getsockname()[1])
            self.workers.append(
                WorkerProcess(
                    index,
                    worker_id,
                    public,
                    direct,
                    link,
                    str(path),
                    handover,
                    str(handover_path),
                    member,
                )
            )

    def spec(self, worker: WorkerProcess, ready_fd: int) -> WorkerSpec:
        """What ``worker``'s process is told."""
        return WorkerSpec(
            worker=worker.id,
            epoch=self.epoch,
            members=tuple(w.member for w in self.workers),
            link_paths={w.id: w.link_path for w in self.workers},
            public_fd=worker.public.fileno(),
            direct_fd=worker.direct.fileno(),
            link_fd=worker.link.fileno(),
            handover_paths={w.id: w.handover_path for w in self.workers},
            handover_fd=worker.handover.fileno(),
            ready_fd=ready_fd,
            life_fd=self._life[0] if self._life else -1,
            config=self._worker_config(),
            log_level=self.log_level,
            connection_counts=None if self._counts is None else str(self._counts),
        )

    def infos(self) -> list[WorkerInfo]:
        """Every worker as the merged metrics endpoint reads it, now."""
        return [
            WorkerInfo(
                id=w.id,
                pid=w.pid if w.up else None,
                up=w.up,
                restarts=w.restarts,
                direct=w.member.address,
                metrics=w.metrics or ("127.0.0.1", 0),
            )
            for w in self.workers
        ]

    def close(self) -> None:
        """Close the sockets, remove the link sockets' directory, release the lock."""
        for worker in self.workers:
            for sock in (worker.public, worker.direct, worker.link, worker.handover):
                sock.close()
        if self._life is not None:
            for fd in self._life:
                os.close(fd)
            self._life = None
        if self._runtime is not None:
            shutil.rmtree(self._runtime, ignore_errors=True)
            self._runtime = None
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    # ---------------------------------------------------------------- running

    async def _start(self, worker: WorkerProcess) -> tuple[trio.Process, bool]:
        """Start ``worker``'s process and read its ready line: the process,
        and whether it hung (no ready line, nor its end, in ``START_TIMEOUT``)."""
        read_fd, write_fd = os.pipe()
        try:
            spec = self.spec(worker, write_fd)
            env = dict(os.environ)
            env[SPEC_VARIABLE] = spec.to_json()
            process = await trio.lowlevel.open_process(
                [sys.executable, "-m", "broker.workers"],
                pass_fds=(
                    spec.public_fd,
                    spec.direct_fd,
                    spec.link_fd,
                    spec.handover_fd,
                    spec.life_fd,
                    write_fd,
                ),
                env=env,
                start_new_session=True,  # Ctrl-C reaches the supervisor, which passes it on
            )
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        worker.process = process
        async with trio.lowlevel.FdStream(read_fd) as pipe:
            line = b""
            with trio.move_on_after(START_TIMEOUT) as waiting:
                while not line.endswith(b"\n"):
                    chunk = await pipe.receive_some(4096)
                    if not chunk:
                        break
                    line += chunk
        if line.endswith(b"\n"):
            ready: dict[str, Any] = json.loads(line)
            host, port = ready["metrics"]
            worker.metrics = (host, port)
            worker._change(True)
            worker._ready.set()
        return process, waiting.cancelled_caught

    async def _keep(self, worker: WorkerProcess) -> None:
        """Run ``worker``, restarting it whenever it ends (but not while closing)."""
        delay = RESTART_DELAY
        while True:
            started = trio.current_time()
            process, hung = await self._start(worker)
            if not worker.up:
                if process.returncode is None:  # (hung, or ended but not yet reaped)
                    process.kill()
                worker.last_exit = await process.wait()
                # One that could not start (it exited with its error, or
                # hung) stops the broker the first time. One killed by a
                # signal meanwhile (kill -9, the OOM killer) is restarted as
                # any worker that ends: it may have served clients already,
                # and they reconnect.
                failed = hung or worker.last_exit >= 0
                if failed and worker.restarts == 0 and not worker._ready.is_set():
                    raise WorkerFailed(
                        f"worker {worker.id} did not start (exit status {process.returncode})"
                    )
            else:
                log.info("worker %s (pid %d) is up", worker.id, process.pid)
                async with trio.open_nursery() as watching:
                    watching.start_soon(self._watch, worker, process)
                    await process.wait()
                    watching.cancel_scope.cancel()
                worker.last_exit = process.returncode
                worker._change(False)
            if self.closing:
                return
            code = process.returncode
            assert code is not None
            how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
            if trio.current_time() - started >= HEALTHY_AFTER:
                delay = RESTART_DELAY
            log.warning("worker %s (pid %d) ended (%s): restarting it", worker.id, process.pid, how)
            worker.restarts += 1
            if self._counts is not None:  # its connections ended with it
                clear_row(self._counts, worker.index, self._principals)
            await trio.sleep(delay)
            delay = min(delay * 2, RESTART_DELAY_MAX)

    async def _watch(self, worker: WorkerProcess, process: trio.Process) -> None:
        """Kill ``worker``'s ``process`` once it has not answered its health
        check ``HUNG_AFTER`` times in a row (a crash is seen by its exit; a
        hang only so). Ends with the process (cancelled)."""
        missed = 0
        while True:
            await trio.sleep(WATCH_EVERY)
            address = worker.metrics
            if address is None or self.closing:
                continue
            answered = False
            with trio.move_on_after(WATCH_TIMEOUT):
                try:
                    status, _ = await http_get(address, "/healthz", max_bytes=1024)
                    answered = status == 200
                except FetchError:
                    pass
            missed = 0 if answered else missed + 1
            if missed >= HUNG_AFTER:
                log.error(
                    "worker %s (pid %d) did not answer %d health checks in a row: it hangs; "
                    "killing it (it is restarted)",
                    worker.id,
                    process.pid,
                    missed,
                )
                process.kill()
                return

    async def wait_ready(self) -> None:
        """Until every worker has listened once."""
        for worker in self.workers:
            await worker._ready.wait()

    async def shutdown(self) -> None:
        """Graceful: SIGTERM to every worker (each says Goodbye to its
        clients and drains them, within ``shutdown_deadline``), then wait;
        a worker still running ``STOP_GRACE`` seconds past the deadline is killed."""
        self.closing = True
        running = [w.process for w in self.workers if w.process and w.process.returncode is None]
        for process in running:
            process.send_signal(signal.SIGTERM)
        with trio.move_on_after(self.config.shutdown_deadline + STOP_GRACE):
            for process in running:
                await process.wait()
        for process in running:
            if process.returncode is None:
                log.warning("worker pid %d did not stop in time: killing it", process.pid)
                process.kill()
                await process.wait()

    def kill_all(self) -> None:
        """End every worker at once (the supervisor is cancelled, not shut down)."""
        self.closing = True
        for worker in self.workers:
            if worker.process is not None and worker.process.returncode is None:
                worker.process.kill()


async def serve_workers(
    config: BrokerConfig,
    count: int,
    *,
    log_level: str = "INFO",
    supervisor: Supervisor | None = None,
    task_status: trio.TaskStatus[Supervisor] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run ``count`` workers behind ``config.listen`` until :meth:`Supervisor.shutdown`
    (or cancelled: then every worker is killed); ``task_status.started(supervisor)``
    once every worker listens. A worker that cannot start the first time
    raises :class:`WorkerFailed`; later, a worker that ends is restarted.

    ``supervisor`` (made with the same ``config`` and ``count``, its sockets
    not made yet) is the one to run, for a caller that serves its
    :meth:`~Supervisor.infos` before the client port listens (``broker
    serve`` binds the merged metrics endpoint first, so that it answers as
    soon as clients can connect)."""
    if supervisor is None:
        supervisor = Supervisor(config, count, log_level=log_level)
    supervisor.make_sockets()
    try:
        async with trio.open_nursery() as nursery:
            for worker in supervisor.workers:
                nursery.start_soon(supervisor._keep, worker)
            await supervisor.wait_ready()
            task_status.started(supervisor)
    finally:
        supervisor.kill_all()
        with trio.CancelScope(shield=True), trio.move_on_after(STOP_GRACE):
            for worker in supervisor.workers:
                if worker.process is not None:
                    await worker.process.wait()
        supervisor.close()
