"""``broker serve --workers 2`` as an operator runs it (a real process on
127.0.0.1): its metrics endpoint answers from the moment the client port
accepts."""

from __future__ import annotations

import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

from broker.bench._procs import free_port

from ..cli.helpers import TIMEOUT, broker_command

#: Seconds between two connection attempts while waiting for a port.
POLL = 0.002


def accepts(port: int) -> bool:
    """Whether something accepts a TCP connection on 127.0.0.1:``port`` now."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT).close()
    except OSError:
        return False
    return True


@contextmanager
def supervisor_on(client: int, metrics: int) -> Iterator[subprocess.Popen[bytes]]:
    """``broker serve --workers 2`` (memory-only) on those ports, stopped
    (SIGINT, status 0) when the block ends."""
    process = subprocess.Popen(
        broker_command(
            "--log-level",
            "WARNING",
            "serve",
            "--workers",
            "2",
            "--memory-only",
            "--listen",
            f"127.0.0.1:{client}",
            "--metrics-listen",
            f"127.0.0.1:{metrics}",
        ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        yield process
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=TIMEOUT)
        assert process.returncode == 0, stderr.decode()
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate(timeout=TIMEOUT)


def test_the_metrics_port_answers_the_moment_the_client_port_accepts() -> None:
    """A probe that waits for the client port and then scrapes is answered.
    (The supervisor bound its metrics port only once every worker was up:
    0.6-1.3 s after the client port accepted, refused meanwhile.)"""
    client, metrics = free_port(), free_port()
    with supervisor_on(client, metrics) as process:
        deadline = time.monotonic() + TIMEOUT
        while not accepts(client):
            assert process.poll() is None, process.communicate()[1].decode()
            assert time.monotonic() < deadline, "the client port never accepted"
            time.sleep(POLL)
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=TIMEOUT) as got:
            assert got.status == 200
            text = got.read().decode()
        assert "broker_workers 2.0" in text
        assert 'broker_worker_up{worker="w0"}' in text
