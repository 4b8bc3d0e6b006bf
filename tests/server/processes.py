"""A real ``broker serve`` process on a data directory, for the tests that
``kill -9`` it and start it again (on the same port and directory)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.measure._process import free_port, wait_listening

from .helpers import TIMEOUT


class BrokerProcess:
    """``broker serve`` on a data directory, killed and started again."""

    def __init__(
        self, port: int, data_dir: Path, log: Path, settings: tuple[str, ...] = ()
    ) -> None:
        self.port = port
        self.data_dir = data_dir
        self.log = log
        #: ``--set`` assignments (``"lease=60"``) it is started with.
        self.settings = settings
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        command = [sys.executable, "-m", "broker", "--log-level", "WARNING", "serve"]
        command += ["--listen", self.url, "--metrics-listen", ""]
        command += ["--data-dir", str(self.data_dir)]
        for setting in self.settings:
            command += ["--set", setting]
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=log, stdin=subprocess.DEVNULL
            )
        wait_listening(self.port)

    def kill(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(TIMEOUT)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(TIMEOUT)


@contextmanager
def running_broker(tmp_path: Path, *settings: str) -> Iterator[BrokerProcess]:
    """A :class:`BrokerProcess` on a free port and ``tmp_path / "data"``,
    started, and killed at the end if still running."""
    broker = BrokerProcess(free_port(), tmp_path / "data", tmp_path / "broker.log", settings)
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()
