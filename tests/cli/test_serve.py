"""``broker serve``: ``--log-level`` after the command, and a taken address
named in one line, the metrics port checked before the broker says it listens."""

from __future__ import annotations

import signal
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from broker.cli import build_parser

from .helpers import TIMEOUT, Subscriber, broker_command, run, serving


@pytest.mark.parametrize(
    ("argv", "level"),
    [
        (["serve"], None),  # (then $BROKER_LOG_LEVEL, or INFO: see test_cli.py)
        (["--log-level", "DEBUG", "serve"], "DEBUG"),
        (["serve", "--log-level", "DEBUG"], "DEBUG"),
        (["serve", "--log-level", "warning"], "WARNING"),
        (["--log-level", "ERROR", "sub", "news", "--log-level", "DEBUG"], "DEBUG"),
        (["--log-level", "ERROR", "stat"], "ERROR"),
    ],
)
def test_log_level_before_or_after_the_command(argv: list[str], level: str | None) -> None:
    """Before: ``broker serve --log-level DEBUG`` was refused."""
    assert build_parser().parse_args(argv).log_level == level


def test_serve_runs_with_log_level_after_the_command() -> None:
    # `broker --log-level WARNING serve ... --log-level INFO`: the later one wins.
    with serving("--log-level", "INFO") as served:
        pass
    assert " INFO broker.server: broker listening on " in served.stderr


@contextmanager
def taken_port() -> Iterator[int]:
    """A port of 127.0.0.1 that another socket listens on."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def test_a_taken_client_port_is_named() -> None:
    """Before: ``cannot listen: [Errno 98] Address already in use`` (which address?)."""
    with taken_port() as port:
        result = run(
            "serve",
            "--memory-only",
            "--listen",
            f"127.0.0.1:{port}",
            "--metrics-listen",
            "127.0.0.1:0",
        )
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.splitlines()[-1] == (
        f"broker serve: cannot listen for clients on 127.0.0.1:{port}: Address already in use "
        "(another process has it: stop it, or choose another with --listen)"
    )
    assert "Traceback" not in result.stderr


def test_a_taken_metrics_port_is_named_before_listening_is_said() -> None:
    """Before: "broker listening on ..." first, then an error naming no address."""
    with taken_port() as port:
        result = run(
            "serve",
            "--memory-only",
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            f"127.0.0.1:{port}",
        )
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr == (
        f"broker serve: cannot listen for HTTP (metrics) on 127.0.0.1:{port}: Address already "
        "in use (another process has it: stop it, or choose another with --metrics-listen)\n"
    )


def test_the_module_runs_as_the_command() -> None:
    assert broker_command()[1:] == ["-m", "broker"]
    result = run("--version")
    assert result.returncode == 0
    assert result.stdout.startswith("broker ")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGHUP])
def test_a_signal_as_soon_as_it_says_it_listens_stops_it_gracefully(
    signum: signal.Signals,
) -> None:
    """Before: SIGINT right after "broker listening" came before the signal
    handler was in place: exit status 1 and a KeyboardInterrupt traceback.
    SIGHUP (a closed terminal) killed it at once: exit 129, no drain, no line."""
    process = subprocess.Popen(
        broker_command(
            "serve", "--memory-only", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline().startswith("broker listening on ")
        process.send_signal(signum)
        _, err = process.communicate(timeout=TIMEOUT)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate(timeout=TIMEOUT)
    assert process.returncode == 0, err
    assert f"{signum.name}: shutting down gracefully" in err
    assert "Traceback" not in err


def test_serve_with_workers_says_where_and_merges_their_metrics() -> None:
    import urllib.request

    with serving("--workers", "2") as served:
        assert served.process.stdout is not None
        workers = served.process.stdout.readline()
        assert workers.startswith("2 workers, direct: w0 on 127.0.0.1:"), workers
        with urllib.request.urlopen(served.metrics + "/metrics", timeout=TIMEOUT) as answer:
            text = answer.read().decode()
        assert 'broker_worker_up{worker="w0"} 1.0' in text
        assert 'broker_worker_up{worker="w1"} 1.0' in text
        assert run("pub", "--broker", served.address, "news", "hello").returncode == 0
    # SIGINT drained both workers: serving() checked the exit status 0.
    assert "Traceback" not in served.stderr


def test_sighup_drains_a_supervisor_and_its_workers() -> None:
    with serving("--workers", "2", stop=signal.SIGHUP) as served:
        assert run("pub", "--broker", served.address, "news", "hello").returncode == 0
    # serving() checked the exit status: 0, not -1 (killed by the signal).
    assert "Traceback" not in served.stderr


@pytest.mark.parametrize("value", ["0", "-1", "many", "257"])
def test_a_bad_worker_count_is_one_line(value: str) -> None:
    result = run("serve", "--memory-only", "--workers", value)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f'broker serve: workers must be a number from 1 to 256 or "auto" (one per core), '
        f"got '{value}'"
    ]


def test_a_worker_that_cannot_start_stops_the_broker_with_its_reason(tmp_path: Path) -> None:
    from broker.log import DirLock

    data = tmp_path / "data"
    held = DirLock(data / "workers" / "w1")  # as if another broker had w1's directory
    try:
        result = run(
            "serve",
            *("--data-dir", str(data), "--workers", "2"),
            *("--listen", "127.0.0.1:0", "--metrics-listen", ""),
        )
    finally:
        held.release()
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert any(
        line.startswith("broker worker w1: worker w1's directory") and "in use" in line
        for line in lines
    ), lines
    assert lines[-1] == "broker serve: worker w1 did not start (exit status 1)"
    assert "Traceback" not in result.stderr


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_workers_end_when_their_supervisor_is_killed() -> None:
    import os
    import time

    command = ["--log-level", "WARNING", "serve", "--memory-only", "--workers", "2"]
    command += ["--listen", "127.0.0.1:0", "--metrics-listen", ""]
    process = subprocess.Popen(broker_command(*command), stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        assert process.stdout.readline().startswith("broker listening on ")
        pid = process.pid
        workers = [
            int(child)
            for task in os.listdir(f"/proc/{pid}/task")
            for child in Path(f"/proc/{pid}/task/{task}/children").read_text().split()
        ]
        assert len(workers) == 2 and all(map(_running, workers))
    finally:
        process.kill()
        process.wait(TIMEOUT)
        if process.stdout is not None:
            process.stdout.close()
    deadline = time.monotonic() + TIMEOUT
    while any(map(_running, workers)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(map(_running, workers))


def test_a_second_ctrl_c_stops_a_draining_broker_at_once() -> None:
    """A second SIGINT during the drain was ignored in silence: the broker
    went on waiting for a client that does not read, up to its deadline."""
    process = subprocess.Popen(
        broker_command(
            "serve", "--memory-only", "--listen", "127.0.0.1:0", "--metrics-listen", "",
            "--set", "shutdown_deadline=600",
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    stopped = None
    try:
        assert process.stdout is not None and process.stderr is not None
        address = process.stdout.readline().split()[-1]
        # A subscriber that stops reading: the drain waits for it.
        stopped = Subscriber("t", "--broker", address)
        stopped.process.send_signal(signal.SIGSTOP)
        process.send_signal(signal.SIGINT)
        for line in process.stderr:
            if "shutting down gracefully" in line:
                assert "(within 600 s; SIGINT again to stop at once)" in line
                break
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=TIMEOUT)  # (not 600 s)
    finally:
        if stopped is not None:
            stopped.process.send_signal(signal.SIGCONT)
            stopped.kill()
        if process.poll() is None:
            process.kill()
            process.communicate(timeout=TIMEOUT)
    assert process.returncode == 0, err
    assert "SIGINT again: stopping at once" in err
    assert "Traceback" not in err
