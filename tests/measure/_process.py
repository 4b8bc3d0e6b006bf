"""What the measurement scripts share: a free port, waiting for a broker
process to listen, and a process's resident memory."""

from __future__ import annotations

import socket
import sys
import time


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_listening(port: int) -> None:
    """Return once something accepts connections on ``port`` (20 s at most)."""
    deadline = time.monotonic() + 20
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def rss_mib(pid: int) -> float:
    """Process ``pid``'s resident memory (MiB)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise LookupError(f"no VmRSS for process {pid}")


def serve_command(port: int, log_level: str = "WARNING", *settings: str) -> list[str]:
    """``broker serve`` on 127.0.0.1:``port`` without a metrics endpoint and
    memory-only (what these measurements were made with; and no shared data
    directory); ``settings`` are ``NAME=VALUE`` (each passed with ``--set``)."""
    command = [sys.executable, "-m", "broker", "--log-level", log_level, "serve", "--memory-only"]
    command += ["--listen", f"127.0.0.1:{port}", "--metrics-listen", ""]
    for setting in settings:
        command += ["--set", setting]
    return command
