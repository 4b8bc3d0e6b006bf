"""Ctrl-C during ``broker bench``: the bench stops its workers and brokers
and exits 130, with no traceback from any of them (its child processes
printed theirs: a worker interrupted in its imports, or told by its broker
that it was shutting down)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from .helpers import TIMEOUT, broker_command


def _children(pid: int) -> dict[int, str]:
    """The processes whose parent is ``pid``, with their command lines."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found[int(entry.name)] = command
    return found


@pytest.mark.parametrize("when", ["broker started", "worker running"])
def test_ctrl_c_ends_the_bench_and_its_processes_without_a_traceback(when: str) -> None:
    bench = subprocess.Popen(
        broker_command("bench", "broker", "--quick"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # (its own process group, as a terminal's job)
        # A terminal's job takes Ctrl-C; a suite run as a background job of a
        # script has SIGINT ignored, and the bench would inherit that.
        preexec_fn=_default_sigint,
    )
    wanted = "broker.bench._worker" if when == "worker running" else " serve "
    seen: dict[int, str] = {}
    try:
        deadline = time.monotonic() + TIMEOUT
        while not any(wanted in command for command in seen.values()):
            assert bench.poll() is None and time.monotonic() < deadline, bench.stderr
            time.sleep(0.02)
            seen = _children(bench.pid)
        # A Ctrl-C at the terminal: SIGINT to the job's process group.
        os.killpg(bench.pid, signal.SIGINT)
        _out, err = bench.communicate(timeout=TIMEOUT)
    finally:
        if bench.poll() is None:  # (failed before its Ctrl-C: end it all the same)
            seen.update(_children(bench.pid))
            bench.kill()
            # Its brokers run in sessions of their own and hold its output
            # pipes: killed by PID, or reading its output would never end.
            for pid in seen:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            bench.communicate(timeout=TIMEOUT)
    assert bench.returncode == 130, err
    assert "Traceback" not in err
    assert err == ""
    # Nothing it started is left running.
    for pid in seen:
        assert not Path(f"/proc/{pid}").exists() or "zombie" in _state(pid), seen[pid]


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _state(pid: int) -> str:
    try:
        return (Path(f"/proc/{pid}") / "status").read_text()
    except OSError:
        return "zombie"
