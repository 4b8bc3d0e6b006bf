"""Running the ``broker`` command in subprocesses against a real broker on
127.0.0.1 (ports chosen by the system). Timeouts here are hang guards only."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

#: Hang guard of every subprocess wait (seconds).
TIMEOUT = 60


def broker_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "broker", *args]


def run(
    *args: str, stdin: str | bytes | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``broker ARGS`` to its end, ``stdin`` its input (a str as UTF-8); its
    output decoded as UTF-8 (other bytes as surrogate escapes)."""
    data = stdin.encode() if isinstance(stdin, str) else stdin
    result = subprocess.run(
        broker_command(*args),
        input=data,
        capture_output=True,
        env=env,
        timeout=TIMEOUT,
        check=False,
    )
    return subprocess.CompletedProcess(
        result.args,
        result.returncode,
        result.stdout.decode("utf-8", "surrogateescape"),
        result.stderr.decode("utf-8", "surrogateescape"),
    )


@dataclass
class Served:
    """A ``broker serve`` process: its client address and metrics base URL."""

    address: str
    metrics: str
    process: subprocess.Popen[str]
    #: What it wrote on stderr (once it has stopped).
    stderr: str = ""

    def stat(self) -> dict[str, Any]:
        """The broker's ``/stat.json``, through ``broker stat --json``."""
        result = run("stat", "--json", "--metrics", self.metrics)
        assert result.returncode == 0, result.stderr
        document: dict[str, Any] = json.loads(result.stdout)
        return document


@contextmanager
def serving(*flags: str, stop: signal.Signals = signal.SIGINT) -> Iterator[Served]:
    """``broker serve`` on ports of the system's choosing until the block ends
    (then stopped with ``stop``, which must end it with status 0); memory-only
    unless ``flags`` name a ``--data-dir`` (never the shared default data
    directory: another test run may hold its lock)."""
    if "--data-dir" not in flags and "--memory-only" not in flags:
        flags = ("--memory-only", *flags)
    process = subprocess.Popen(
        broker_command(
            "--log-level",
            "WARNING",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
            *flags,
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    served = Served("", "", process)
    try:
        assert process.stdout is not None
        listening = process.stdout.readline()
        metrics = process.stdout.readline()
        assert listening.startswith("broker listening on "), listening
        assert metrics.startswith("metrics on http://"), metrics
        served.address = listening.split()[-1]
        served.metrics = metrics.split()[-1].removesuffix("/metrics")
        yield served
        process.send_signal(stop)
        assert process.wait(TIMEOUT) == 0
    finally:
        if process.poll() is None:
            process.kill()
        _, served.stderr = process.communicate(timeout=TIMEOUT)


class Subscriber:
    """A ``broker sub`` process, started and subscribed (it said so)."""

    def __init__(self, *args: str) -> None:
        self.process = subprocess.Popen(
            broker_command("sub", *args),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert self.process.stderr is not None
        said = self.process.stderr.readline().decode()
        assert said.startswith("subscribed to "), said + self.rest_of_stderr()

    def rest_of_stderr(self) -> str:
        if self.process.poll() is None:
            return ""
        assert self.process.stderr is not None
        return self.process.stderr.read().decode()

    def finish(self) -> tuple[int, bytes, str]:
        """Wait for its end: exit status, stdout, stderr after the first line."""
        out, err = self.process.communicate(timeout=TIMEOUT)
        return self.process.returncode, out, err.decode()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.communicate(timeout=TIMEOUT)


def interrupt(process: subprocess.Popen[Any]) -> None:
    """Ctrl-C, as a terminal sends it to the process."""
    process.send_signal(signal.SIGINT)
