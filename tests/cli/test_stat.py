"""``broker stat``: the text shows budgets and topics (before: only --json
did), tolerates documents with less or more in them, and --watch refreshes
(redrawing a terminal like ``top``) until Ctrl-C."""

from __future__ import annotations

import json
import os
import pty
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker import cli
from broker.cli._stat_text import render

from .helpers import TIMEOUT, Served, Subscriber, broker_command, interrupt, run, serving


def test_the_text_shows_budgets_topics_and_subscriptions(served: Served) -> None:
    subscriber = Subscriber("news", "--mode", "lossy", "--broker", served.address)
    try:
        published = run("pub", "news", "hello", "--broker", served.address)
        assert published.returncode == 0, published.stderr
        result = run("stat", "--metrics", served.metrics)
    finally:
        subscriber.kill()
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    budgets = lines.index("budgets")
    assert lines[budgets + 1].startswith("  buffer_reserved=")
    assert "of global_budget=268435456 (" in lines[budgets + 1]
    assert "connection_high_watermark=" in result.stdout
    topics = lines.index("topics (1 opened since start; all of them: broker topics ls)")
    assert lines[topics + 1].split() == [
        "name",
        "publishers",
        "subscriptions",
        "queued",
        "messages_in",
    ]
    assert lines[topics + 2].split()[0] == "'news'"
    assert lines[topics + 2].split()[2:] == ["1", "0", "1"]
    assert "client='broker-sub'" in result.stdout
    assert "subscription 0  topic='news' mode=lossy queued=0 delivered=1" in result.stdout


def test_the_text_tolerates_missing_detail_and_new_sections() -> None:
    document: dict[str, Any] = {
        "version": 2,
        "broker": {"address": "10.0.0.1:7400"},
        "connections": [{"name": "conn-9"}],
        "totals": {"connections": 5000, "deliveries": {"queued": 3}},
        "top_connections_by_debt": [{"name": "conn-9", "debt": 7}],
    }
    text = render(document)
    assert text.splitlines() == [
        "broker       10.0.0.1:7400",
        "",
        "connections (1)",
        "  conn-9  ?  client=''",
        "",
        "totals",
        "  connections=5000 deliveries.queued=3",
        "",
        "top_connections_by_debt (1)",
        "    - name=conn-9 debt=7",
    ]
    assert render({}) == "\n"


def test_a_broker_that_is_not_there_is_one_line() -> None:
    result = run("stat", "--metrics", "127.0.0.1:1")
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr == (
        "broker stat: cannot read http://127.0.0.1:1/stat.json: connection refused"
        " (is a broker running there? give --metrics its metrics_listen)\n"
    )


def test_watch_into_a_pipe_appends_snapshots_until_ctrl_c(served: Served) -> None:
    watcher = subprocess.Popen(
        broker_command("stat", "--watch", "0.1", "--metrics", served.metrics),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert watcher.stdout is not None
        stamps = 0
        while stamps < 3:
            line = watcher.stdout.readline()
            assert line, watcher.stderr.read() if watcher.stderr else ""
            stamps += line.startswith("--- ")
        interrupt(watcher)
        out, err = watcher.communicate(timeout=TIMEOUT)
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.communicate(timeout=TIMEOUT)
    assert watcher.returncode == 0
    assert err == ""
    assert "\x1b[" not in out


@pytest.mark.parametrize("sigint_ignored", [False, True])
def test_watch_json_is_one_document_a_line(served: Served, sigint_ignored: bool) -> None:
    """Ctrl-C ends the watch, also when it was started with SIGINT ignored
    (as a background job of a script is), as it ends `broker pub`."""
    watcher = subprocess.Popen(
        broker_command("stat", "--json", "-w", "0.1", "--metrics", served.metrics),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
        if sigint_ignored
        else None,
    )
    try:
        assert watcher.stdout is not None
        documents = [json.loads(watcher.stdout.readline()) for _ in range(2)]
        interrupt(watcher)
        watcher.communicate(timeout=TIMEOUT)
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.communicate(timeout=TIMEOUT)
    assert watcher.returncode == 0
    assert [document["version"] for document in documents] == [2, 2]


def test_watch_on_a_terminal_redraws_the_screen(served: Served) -> None:
    controller, terminal = pty.openpty()
    watcher = subprocess.Popen(
        broker_command("stat", "--watch", "0.1", "--metrics", served.metrics),
        stdout=terminal,
        stderr=subprocess.PIPE,
    )
    try:
        shown = b""
        while shown.count(b"\x1b[H\x1b[2J") < 2:
            chunk = os.read(controller, 65536)
            assert chunk
            shown += chunk
        interrupt(watcher)
        watcher.communicate(timeout=TIMEOUT)
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.communicate(timeout=TIMEOUT)
        os.close(controller)
        os.close(terminal)
    assert watcher.returncode == 0
    screen = shown.split(b"\x1b[H\x1b[2J")[1].decode()
    assert f"{served.metrics}  every 0.1 s (Ctrl-C to stop)" in screen
    assert "\r\nbudgets\r\n" in screen


OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def stat_references() -> set[str]:
    """The names docs/operations.md tells a reader to look for in `broker stat`
    (the backquoted words of each sentence that starts with it)."""
    text = " ".join(OPERATIONS.read_text(encoding="utf-8").split())
    names: set[str] = set()
    for sentence in re.findall(r"`broker stat`[^.]*\.", text):
        names |= set(re.findall(r"`([^`]+)`", sentence))
    return {
        name
        for name in names
        if not name.startswith(("broker", "curl")) and not name.startswith("broker_")
    }


@pytest.fixture
def served_with_logs(tmp_path: Path) -> Iterator[Served]:
    """A running ``broker serve`` that keeps topic logs (in a fresh data directory)."""
    with serving("--data-dir", str(tmp_path / "data")) as broker:
        yield broker


def test_what_the_operations_runbooks_name_is_in_the_text(served_with_logs: Served) -> None:
    """Before: the runbooks pointed at `budgets` and `topics[].queued`, which
    only `broker stat --json` showed. (A broker with topic logs: the topic
    log runbooks name what its text shows of them.)"""
    served = served_with_logs
    names = stat_references()
    assert {"budgets", "buffer_reserved", "topics", "queued", "debt"} <= names
    assert {"first_offset", "last_offset", "position", "acked", "lag"} <= names
    subscriber = Subscriber("news", "--broker", served.address)
    publisher = subprocess.Popen(
        broker_command("pub", "news", "--broker", served.address),
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert publisher.stdin is not None and subscriber.process.stdout is not None
        publisher.stdin.write(b"hello\n")
        publisher.stdin.flush()
        assert subscriber.process.stdout.readline() == b"hello\n"
        result = run("stat", "--metrics", served.metrics)  # both connected
        publisher.stdin.close()
        assert publisher.wait(TIMEOUT) == 0
    finally:
        subscriber.kill()
        if publisher.poll() is None:
            publisher.kill()
        publisher.wait(TIMEOUT)
    assert result.returncode == 0, result.stderr
    words = set(re.findall(r"[a-z_]+", result.stdout))
    assert names <= words, names - words


@pytest.mark.parametrize("command", ["stat", "health"])
def test_a_metrics_address_that_is_not_http_is_one_line(served: Served, command: str) -> None:
    """The broker's client port given for --metrics (an easy mistake), or a
    bad port: one line saying what to give, not an http.client traceback."""
    for address, says in [
        (served.address, "did not answer as HTTP"),
        ("127.0.0.1:abc", "bad --metrics address"),
    ]:
        result = run(command, "--metrics", address)
        assert result.returncode == 1
        assert result.stderr.count("\n") == 1, result.stderr
        assert result.stderr.startswith(f"broker {command}: ") and says in result.stderr


@pytest.mark.parametrize(
    ("argv", "status"),
    [
        (["stat", "--watch"], 0),
        (["--log-level", "DEBUG", "stat", "-w", "0.5"], 0),
        (["stat", "--watch=1"], 0),
        (["serve"], 0),
        (["stat"], 130),
        (["sub", "news"], 130),
        (["--log-level", "DEBUG", "pub", "stat", "--watch"], 130),
    ],
)
def test_a_ctrl_c_while_the_commands_load_ends_stat_watch_normally(
    monkeypatch: pytest.MonkeyPatch, argv: list[str], status: int
) -> None:
    """A Ctrl-C in the first second or so (the commands loading) exited 130
    from ``stat --watch``, which Ctrl-C ends normally (status 0)."""

    def loading() -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build_parser", loading)
    assert cli.main(argv) == status
