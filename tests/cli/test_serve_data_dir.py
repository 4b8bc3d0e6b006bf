"""``broker serve`` and its data directory: ``--data-dir``/``--memory-only``,
the default location, a directory that cannot be created or written, and a
data directory another broker holds (one line, never a traceback)."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio

import broker.server
from broker.cli import build_parser, main
from broker.cli._data_dir import default_data_dir, prepare_data_dir, with_data_dir
from broker.cli._serve import _config_from
from broker.config import BrokerConfig, ConfigError
from broker.log import DataDirLocked, LogStore

from .helpers import TIMEOUT, broker_command, run

ROOT = os.geteuid() == 0
LISTEN = ("--listen", "127.0.0.1:0", "--metrics-listen", "")


# ---------------------------------------------------------------- flags


def test_the_flags_parse_and_exclude_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    assert parser.parse_args(["serve", "--data-dir", "/d"]).data_dir == "/d"
    args = parser.parse_args(["serve", "--memory-only"])
    assert (args.memory_only, args.data_dir) == (True, None)
    with pytest.raises(SystemExit) as exited:
        parser.parse_args(["serve", "--memory-only", "--data-dir", "/d"])
    assert exited.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def _config(monkeypatch: pytest.MonkeyPatch, *argv: str, **env: str) -> BrokerConfig:
    for name in ("BROKER_CONFIG", "BROKER_DATA_DIR", "BROKER_MEMORY_ONLY"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return _config_from(build_parser().parse_args(["serve", *argv]))


def test_the_flags_win_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    plain = _config(monkeypatch)
    assert (plain.data_dir, plain.memory_only) == ("", False)
    flagged = _config(monkeypatch, "--data-dir", "/d", BROKER_MEMORY_ONLY="1")
    assert (flagged.data_dir, flagged.memory_only, flagged.log_dir) == ("/d", False, Path("/d"))
    memory = _config(monkeypatch, "--memory-only", BROKER_DATA_DIR="/e")
    assert (memory.memory_only, memory.log_dir) == (True, None)
    from_env = _config(monkeypatch, BROKER_DATA_DIR="/e")
    assert from_env.log_dir == Path("/e")
    assert _config(monkeypatch, "--set", "memory_only=yes").memory_only is True


# ---------------------------------------------------------------- the default location


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"STATE_DIRECTORY": "/var/lib/broker", "XDG_STATE_HOME": "/x"}, "/var/lib/broker"),
        ({"STATE_DIRECTORY": "/s/one:/s/two"}, "/s/one"),
        ({"XDG_STATE_HOME": "/x/state", "HOME": "/h"}, "/x/state/broker"),
        ({"XDG_STATE_HOME": "relative/state", "HOME": "/h"}, "/h/.local/state/broker"),
        ({"STATE_DIRECTORY": "", "XDG_STATE_HOME": "", "HOME": "/h"}, "/h/.local/state/broker"),
        ({"HOME": "/h"}, "/h/.local/state/broker"),
    ],
)
def test_the_default_data_directory(env: dict[str, str], expected: str) -> None:
    assert default_data_dir(env) == Path(expected)


def test_the_default_comes_from_the_process_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert default_data_dir() == tmp_path / "broker"
    assert with_data_dir(BrokerConfig()).log_dir == tmp_path / "broker"


def test_only_an_empty_data_dir_is_filled() -> None:
    env = {"HOME": "/h"}
    assert with_data_dir(BrokerConfig(data_dir="/mine"), env).data_dir == "/mine"
    memory = BrokerConfig(memory_only=True)
    assert with_data_dir(memory, env) is memory
    assert with_data_dir(BrokerConfig(), env).data_dir == "/h/.local/state/broker"


# ---------------------------------------------------------------- creating and checking it


def test_a_missing_directory_is_created_for_its_owner_only(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "data"
    prepare_data_dir(target)
    assert target.is_dir()
    assert target.stat().st_mode & 0o777 == 0o700
    assert list(target.iterdir()) == []  # the write check leaves nothing behind
    prepare_data_dir(target)  # an existing one is fine


def test_a_file_in_the_way_is_refused(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match=r"data directory .*/file is not a directory \("):
        prepare_data_dir(tmp_path / "file")
    with pytest.raises(ConfigError, match=r"cannot create data directory .*: Not a directory"):
        prepare_data_dir(tmp_path / "file" / "data")


@pytest.mark.skipif(ROOT, reason="root writes to a 0o500 directory anyway")
def test_an_unwritable_directory_is_refused(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    try:
        with pytest.raises(ConfigError) as caught:
            prepare_data_dir(locked)
        assert str(caught.value) == (
            f"data directory {locked} is not writable: Permission denied "
            "(choose another with --data-dir, or run with --memory-only)"
        )
        with pytest.raises(ConfigError, match=r"cannot create data directory .*Permission denied"):
            prepare_data_dir(locked / "data")
    finally:
        locked.chmod(0o700)


def test_a_write_that_fails_is_refused_as_root_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check writes a file (root passes permission checks, not a read-only mount)."""

    def read_only(**kwargs: Any) -> Any:
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(tempfile, "TemporaryFile", read_only)
    with pytest.raises(ConfigError) as caught:
        prepare_data_dir(tmp_path)
    assert str(caught.value) == (
        f"data directory {tmp_path} is not writable: Read-only file system "
        "(choose another with --data-dir, or run with --memory-only)"
    )


def _one_line_refusal(result: subprocess.CompletedProcess[str], status: int) -> str:
    assert result.returncode == status, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("broker serve: "), result.stderr
    return lines[0]


def test_serve_says_in_one_line_that_it_cannot_create_the_directory(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    result = run("serve", "--data-dir", str(tmp_path / "file" / "data"), *LISTEN)
    line = _one_line_refusal(result, 2)
    assert f"cannot create data directory {tmp_path}/file/data: Not a directory" in line


@pytest.mark.skipif(ROOT, reason="root writes to a 0o500 directory anyway")
def test_serve_says_in_one_line_that_the_directory_is_not_writable(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    try:
        result = run("serve", "--data-dir", str(locked), *LISTEN)
    finally:
        locked.chmod(0o700)
    assert "is not writable: Permission denied" in _one_line_refusal(result, 2)


@dataclass
class Started:
    process: subprocess.Popen[str]
    #: What it wrote on stderr (once it has stopped).
    stderr: str = ""


@contextmanager
def _started(*args: str, env: dict[str, str] | None = None) -> Iterator[Started]:
    """``broker --log-level INFO serve ARGS`` until it says it listens; then SIGINT."""
    process = subprocess.Popen(
        broker_command("--log-level", "INFO", "serve", *LISTEN, *args),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    started = Started(process)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("broker listening on "), line + process.communicate()[1]
        yield started
        process.send_signal(signal.SIGINT)
        assert process.wait(TIMEOUT) == 0
    finally:
        if process.poll() is None:
            process.kill()
        started.stderr = process.communicate(timeout=TIMEOUT)[1]


def test_serve_creates_and_names_the_default_directory(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BROKER_")}
    env.pop("STATE_DIRECTORY", None)
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    with _started(env=env) as started:
        assert (tmp_path / "state" / "broker").is_dir()
    assert f"INFO broker: data directory {tmp_path}/state/broker\n" in started.stderr

    del env["XDG_STATE_HOME"]  # a fresh machine's user: ~/.local/state/broker
    env["HOME"] = str(tmp_path / "home")
    with _started(env=env) as started:
        assert (tmp_path / "home" / ".local" / "state" / "broker").is_dir()
    assert f"data directory {tmp_path}/home/.local/state/broker\n" in started.stderr

    env["STATE_DIRECTORY"] = str(tmp_path / "systemd")  # systemd's StateDirectory=
    with _started(env=env) as started:
        assert (tmp_path / "systemd").is_dir()
    assert f"data directory {tmp_path}/systemd\n" in started.stderr


def test_serve_says_when_it_is_memory_only(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path)}
    with _started("--memory-only", env=env) as started:
        pass
    assert "INFO broker: memory-only: topics are not retained\n" in started.stderr
    assert not (tmp_path / "broker").exists()


# ---------------------------------------------------------------- a log error at start


def _failing_server(failure: BaseException) -> Any:
    async def serve_broker(*args: Any, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        raise failure

    return serve_broker


@pytest.mark.parametrize(
    "failure",
    [
        DataDirLocked("data directory /d is in use by another broker (lock held on /d/.lock)"),
        ExceptionGroup(
            "nested",
            [
                ExceptionGroup(
                    "inner", [DataDirLocked("data directory /d is in use by another broker")]
                )
            ],
        ),
    ],
    ids=["plain", "in nested groups"],
)
def test_a_log_error_at_start_is_one_line_and_status_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], failure: BaseException
) -> None:
    monkeypatch.setattr(broker.server, "serve_broker", _failing_server(failure))
    assert main(["serve", "--memory-only", *LISTEN]) == 1
    err = capsys.readouterr().err
    assert err.startswith("broker serve: data directory /d is in use by another broker")
    assert err.count("\n") == 1 and "Traceback" not in err


def test_a_file_error_at_start_is_not_said_to_be_the_address(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: every OSError of the starting broker read "cannot listen for clients"."""
    failure = PermissionError(13, "Permission denied", "/d/.lock")
    monkeypatch.setattr(broker.server, "serve_broker", _failing_server(failure))
    assert main(["serve", "--memory-only", *LISTEN]) == 1
    assert capsys.readouterr().err == "broker serve: [Errno 13] Permission denied: '/d/.lock'\n"


def test_a_data_directory_another_broker_holds_is_refused_in_one_line(tmp_path: Path) -> None:
    store = LogStore(tmp_path)  # this process holds the directory's lock
    try:
        process = subprocess.Popen(
            broker_command("--log-level", "WARNING", "serve", "--data-dir", str(tmp_path), *LISTEN),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert process.stdout is not None
            started = process.stdout.readline()
            if started:  # it listens on a directory it could not lock: stop it
                process.send_signal(signal.SIGINT)
            out, err = process.communicate(timeout=TIMEOUT)
        finally:
            if process.poll() is None:
                process.kill()
                process.communicate(timeout=TIMEOUT)
    finally:
        store.close()
    assert not started, "the broker started on a data directory another one holds"
    result = subprocess.CompletedProcess(process.args, process.returncode, out, err)
    line = _one_line_refusal(result, 1)
    assert line == (
        f"broker serve: data directory {tmp_path} is in use by another broker "
        f"(lock held on {tmp_path}/.lock)"
    )
