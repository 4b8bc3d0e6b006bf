"""``broker pub`` and ``broker sub`` across a broker's restart: they connect
again (``--reconnect``, 60 s by default) and go on where they were, as
``mosquitto_sub`` and ``nats sub`` do. ``broker sub`` used to end at once
with "the broker closed the connection", while the restarted broker kept
its session waiting for it."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from broker.bench._procs import free_port

from .helpers import TIMEOUT, Subscriber, broker_command, run


@contextmanager
def broker_on(port: int, data_dir: Path) -> Iterator[subprocess.Popen[str]]:
    """``broker serve`` on ``127.0.0.1:port`` with ``data_dir``, listening."""
    process = subprocess.Popen(
        broker_command(
            "--log-level", "WARNING", "serve", "--listen", f"127.0.0.1:{port}",
            "--metrics-listen", "", "--data-dir", str(data_dir),
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        assert process.stdout.readline().startswith("broker listening on ")
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=TIMEOUT)


def test_sub_goes_on_across_a_broker_killed_and_restarted(tmp_path: Path) -> None:
    port = free_port()
    address = f"127.0.0.1:{port}"
    with broker_on(port, tmp_path) as first:
        subscriber = Subscriber("rs", "--broker", address, "--count", "2")
        assert run("pub", "rs", "one", "--broker", address).returncode == 0
        first.send_signal(signal.SIGKILL)
        first.wait(TIMEOUT)
    try:
        with broker_on(port, tmp_path):
            assert run("pub", "rs", "two", "--broker", address).returncode == 0
            status, out, err = subscriber.finish()
    finally:
        subscriber.kill()
    assert (status, out) == (0, b"one\ntwo\n"), err
    assert "reconnecting" in err


def test_sub_with_reconnect_0_ends_at_once_in_one_line(tmp_path: Path) -> None:
    port = free_port()
    with broker_on(port, tmp_path) as broker:
        subscriber = Subscriber("rs", "--broker", f"127.0.0.1:{port}", "--reconnect", "0")
        broker.send_signal(signal.SIGKILL)
        broker.wait(TIMEOUT)
        status, out, err = subscriber.finish()
    assert (status, out) == (1, b"")
    assert err.splitlines() == ["broker sub: the broker closed the connection"], err


def test_ctrl_c_while_reconnecting_ends_at_once(tmp_path: Path) -> None:
    """Ctrl-C was ignored until --reconnect ran out (leaving waited for a
    broker to flush to and to unsubscribe from), a second one still took
    10 s: with nothing to finish without a broker, it ends at once."""
    port = free_port()
    with broker_on(port, tmp_path) as broker:
        subscriber = Subscriber("rs", "--broker", f"127.0.0.1:{port}", "--reconnect", "600")
        broker.send_signal(signal.SIGKILL)
        broker.wait(TIMEOUT)
    try:
        assert subscriber.process.stderr is not None
        for line in subscriber.process.stderr:  # (it says it reconnects)
            if b"reconnecting" in line:
                break
        subscriber.process.send_signal(signal.SIGINT)
        status, out, err = subscriber.finish()  # (within TIMEOUT, not 600 s)
    finally:
        subscriber.kill()
    assert (status, out) == (130, b"")
    assert err.splitlines()[-1] == "broker sub: interrupted while reconnecting to the broker"
