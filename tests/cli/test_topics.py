"""``broker topics``, ``broker cursors`` and what issue 42 added to ``broker
sub`` (patterns, ``--from -N``, ``--until-end``, the MQTT hint) and to every
connecting command (``$BROKER_URL``), against real brokers with topic logs."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from .helpers import Served, run, serving


def env_for(served: Served) -> dict[str, str]:
    """The environment of a command that finds the broker by ``$BROKER_URL``."""
    return {**os.environ, "BROKER_URL": served.address}


def publish(env: dict[str, str], topic: str, *lines: str) -> None:
    result = run("pub", topic, stdin="".join(line + "\n" for line in lines), env=env)
    assert result.returncode == 0, result.stderr


@pytest.fixture
def logged(tmp_path: Path) -> Iterator[Served]:
    """A broker with a data directory holding a.x, a.y (records 1, 2, 3
    each) and b.z (one record)."""
    with serving("--data-dir", str(tmp_path / "data")) as broker:
        env = env_for(broker)
        publish(env, "a.x", "x1", "x2", "x3")
        publish(env, "a.y", "y1", "y2", "y3")
        publish(env, "b.z", "z1")
        yield broker


def ls(served: Served, *args: str) -> list[str]:
    result = run("topics", "ls", *args, env=env_for(served))
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_ls_lists_the_topics_on_disk_after_a_restart(tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    with serving("--data-dir", data) as broker:
        for topic in ("a.x", "a.y", "b.z"):
            publish(env_for(broker), topic, "one")
    with serving("--data-dir", data) as broker:
        publish(env_for(broker), "a.y", "two")  # (opened again; the others only on disk)
        lines = ls(broker)
        assert lines[0].split() == [
            "TOPIC", "FIRST", "END", "RECORDS", "BYTES", "LAST-APPEND", "SUBS", "CURSORS",
        ]  # fmt: skip
        assert [line.split()[0] for line in lines[1:]] == ["a.x", "a.y", "b.z"]
        assert [line.split()[0] for line in ls(broker, "a.*")[1:]] == ["a.x", "a.y"]
        rows = [json.loads(line) for line in ls(broker, "a.>", "--json")]
        assert [row["topic"] for row in rows] == ["a.x", "a.y"]
        assert {"first", "end", "records", "bytes", "open", "subscribers"} <= set(rows[0])


def test_show_prints_every_field_and_an_unknown_topic_is_said(logged: Served) -> None:
    result = run("topics", "show", "a.x", env=env_for(logged))
    assert result.returncode == 0, result.stderr
    fields = {line.split()[0]: line.split()[1] for line in result.stdout.splitlines()}
    assert fields["topic"] == "a.x"
    assert {"first", "end", "records", "bytes", "retention_bytes", "cursors"} <= set(fields)
    result = run("topics", "show", "a.q", env=env_for(logged))
    assert result.returncode == 1
    assert result.stderr == "broker topics: no topic 'a.q'\n"


def test_delete_needs_yes_and_then_deletes(logged: Served) -> None:
    result = run("topics", "delete", "a.x", env=env_for(logged))
    assert result.returncode == 2
    assert len(result.stderr.splitlines()) == 1
    assert "for good" in result.stderr and "--yes" in result.stderr
    assert "a.x" in [line.split()[0] for line in ls(logged)]
    result = run("topics", "delete", "a.x", "--yes", env=env_for(logged))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("deleted 'a.x': 3 record(s)")
    assert [line.split()[0] for line in ls(logged)[1:]] == ["a.y", "b.z"]
    result = run("topics", "delete", "a.x", "--yes", env=env_for(logged))
    assert result.returncode == 1
    assert result.stderr == "broker topics: no topic 'a.x'\n"


def test_purge_deletes_the_records_before_an_offset(logged: Served) -> None:
    result = run("topics", "purge", "a.y", "--before", "3", env=env_for(logged))
    assert result.returncode == 0, result.stderr
    assert result.stdout == "purged 'a.y': 2 record(s) deleted; its first offset is 3\n"
    result = run(
        "sub", "a.y", "--from", "earliest", "-e", "--format", "{offset} {payload}",
        env=env_for(logged),
    )  # fmt: skip
    assert (result.returncode, result.stdout) == (0, "3 y3\n"), result.stderr


def test_cursors_ls_and_delete(logged: Served) -> None:
    env = env_for(logged)
    result = run("sub", "a.x", "--cursor", "billing", "--from", "earliest", "-c", "2", env=env)
    assert (result.returncode, result.stdout) == (0, "x1\nx2\n"), result.stderr
    result = run("cursors", "ls", env=env)
    assert result.returncode == 0, result.stderr
    head, *rows = result.stdout.splitlines()
    assert head.split() == ["TOPIC", "CURSOR", "PRINCIPAL", "POSITION", "LAG"]
    assert [row.split()[:2] for row in rows] == [["a.x", "billing"]]
    assert rows[0].split()[3] == "3"  # (the next offset it reads)
    (row,) = [
        json.loads(line)
        for line in run("cursors", "ls", "a.*", "--json", env=env).stdout.splitlines()
    ]
    assert (row["topic"], row["cursor"], row["position"]) == ("a.x", "billing", 3)
    assert run("cursors", "ls", "b.*", env=env).stdout == ""
    result = run("cursors", "delete", "a.x", "billing", env=env)
    assert (result.returncode, result.stdout) == (0, "deleted cursor 'billing' of 'a.x'\n")
    assert run("cursors", "ls", "--json", env=env).stdout == ""
    result = run("cursors", "delete", "a.x", "billing", env=env)
    assert result.returncode == 1
    assert len(result.stderr.splitlines()) == 1 and "billing" in result.stderr


def test_sub_pattern_reads_each_matching_topic_to_its_end(logged: Served) -> None:
    result = run(
        "sub", "a.*", "--from", "earliest", "-e", "--format", "{topic} {offset} {payload}",
        env=env_for(logged),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert sorted(lines) == [f"a.{t} {n} {t}{n}" for t in "xy" for n in (1, 2, 3)]
    for topic in ("a.x", "a.y"):  # (in order per topic)
        assert [line for line in lines if line.startswith(topic)] == [
            f"{topic} {n} {topic[-1]}{n}" for n in (1, 2, 3)
        ]


def test_sub_the_last_n_records_to_the_end(logged: Served) -> None:
    result = run(
        "sub", "a.x", "b.z", "--from", "-2", "-e", "--format", "{topic} {offset}",
        env=env_for(logged),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == ["a.x 2", "a.x 3", "b.z 1"]


def test_sub_until_end_from_the_latest_prints_nothing(logged: Served) -> None:
    result = run("sub", "a.x", "-e", env=env_for(logged))
    assert (result.returncode, result.stdout) == (0, ""), result.stderr


def test_broker_url_is_the_default_and_broker_wins(logged: Served) -> None:
    env = env_for(logged)
    publish(env, "c.c", "hello")  # (pub found it by $BROKER_URL)
    result = run("sub", "c.c", "--from", "earliest", "-e", env=env)
    assert (result.returncode, result.stdout) == (0, "hello\n"), result.stderr
    elsewhere = {**env, "BROKER_URL": "127.0.0.1:1"}
    result = run(
        "sub", "c.c", "--from", "earliest", "-e", "--broker", logged.address, env=elsewhere
    )
    assert (result.returncode, result.stdout) == (0, "hello\n"), result.stderr
    result = run("topics", "ls", env=elsewhere)
    assert result.returncode == 1
    assert "cannot connect to 127.0.0.1:1" in result.stderr


@pytest.mark.parametrize(
    ("topic", "hint"),
    [
        ("sensors/+/temp", "write 'sensors.*.temp'"),
        ("news/#", "write 'news.>'"),
        ("news.#", "write 'news.>'"),
    ],
)
def test_sub_mqtt_wildcards_get_a_hint(topic: str, hint: str) -> None:
    result = run("sub", topic, "--broker", "127.0.0.1:1")
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith("broker sub: ") and line.endswith(hint)


@pytest.mark.parametrize(
    "args",
    [
        ["sub", "a..*"],
        ["sub", "orders*"],
        ["sub", "a.>.b"],
        ["topics", "ls", "a.>.b"],
        ["cursors", "ls", "a..b"],
    ],
)
def test_a_bad_pattern_is_one_line(args: list[str]) -> None:
    result = run(*args, "--broker", "127.0.0.1:1")
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()
    assert "'.'-separated tokens where '*' is exactly one token" in line


def test_groups_ls_and_delete(logged: Served) -> None:
    env = env_for(logged)
    result = run("sub", "a.x", "--group", "workers", "--from", "earliest", "-c", "3", env=env)
    assert (result.returncode, result.stdout) == (0, "x1\nx2\nx3\n"), result.stderr
    result = run("groups", "ls", env=env)
    assert result.returncode == 0, result.stderr
    head, *rows = result.stdout.splitlines()
    assert head.split() == ["TOPIC", "GROUP", "PRINCIPAL", "MEMBERS", "FLOOR", "LAG", "OUTSTANDING"]
    assert [row.split()[:2] for row in rows] == [["a.x", "workers"]]
    (row,) = [
        json.loads(line) for line in run("groups", "ls", "--json", env=env).stdout.splitlines()
    ]
    assert (row["topic"], row["group"], row["members"]) == ("a.x", "workers", 0)
    result = run("groups", "delete", "a.x", "workers", env=env)
    assert (result.returncode, result.stdout) == (0, "deleted group 'workers' of 'a.x'\n")
    assert run("groups", "ls", "--json", env=env).stdout == ""
    result = run("groups", "delete", "a.x", "workers", env=env)
    assert result.returncode == 1
    assert len(result.stderr.splitlines()) == 1 and "no group" in result.stderr
