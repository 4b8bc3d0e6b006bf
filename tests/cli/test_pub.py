"""``broker pub``: headers, files, all of stdin, key separators, CRLF and empty
lines, repeat and rate, refusals, and Ctrl-C on a terminal."""

from __future__ import annotations

import base64
import json
import os
import pty
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from .helpers import TIMEOUT, Served, Subscriber, broker_command, interrupt, run


def received(subscriber: Subscriber) -> list[dict[str, Any]]:
    """What a ``--json`` subscriber printed, payloads and keys decoded to bytes."""
    status, out, err = subscriber.finish()
    assert status == 0, err
    messages = []
    for line in out.decode().splitlines():
        message = json.loads(line)
        decode = base64.b64decode if message["encoding"] == "base64" else (lambda s: s.encode())
        message["payload"] = decode(message["payload"])
        if message["key"] is not None:
            message["key"] = decode(message["key"])
        messages.append(message)
    return messages


def test_keys_headers_files_and_all_of_stdin(served: Served, tmp_path: Path) -> None:
    subscriber = Subscriber("news", "--json", "--count", "4", "--broker", served.address)
    try:
        image = tmp_path / "image.bin"
        image.write_bytes(bytes(range(256)) * 4)
        steps = [
            run(
                "pub",
                "news",
                "hi",
                "-k",
                "k1",
                "-H",
                "a=1",
                "-H",
                "b=x=y",
                "--broker",
                served.address,
            ),
            run("pub", "news", "--file", str(image), "--broker", served.address),
            run("pub", "news", "-s", "--broker", served.address, stdin=b"two\nlines\r\n"),
            run("pub", "news", "--stdin-whole", "--broker", served.address, stdin=b""),
        ]
        for step in steps:
            assert step.returncode == 0, step.stderr
            assert step.stderr == "published 1 message(s) to 'news'\n"
        messages = received(subscriber)
    finally:
        subscriber.kill()
    assert [m["payload"] for m in messages] == [
        b"hi",
        bytes(range(256)) * 4,
        b"two\nlines\r\n",
        b"",
    ]
    assert messages[0]["key"] == b"k1"
    assert messages[0]["headers"] == [["a", "1"], ["b", "x=y"]]
    assert [m["key"] for m in messages[1:]] == [None, None, None]


def test_stdin_lines_with_key_separator_crlf_and_empty_lines(served: Served) -> None:
    lines = b"k1:one\r\nno key here\n\nk2:two:2\r\n\r\n:empty key\nlast"
    subscriber = Subscriber("news", "--json", "--count", "6", "--broker", served.address)
    try:
        result = run("pub", "news", "-K", ":", "--broker", served.address, stdin=lines)
        assert result.returncode == 0, result.stderr
        assert "published 7 message(s)" in result.stderr
        # Empty lines are messages too; the trailing \r of a CRLF line is not part of one.
        messages = received(subscriber)
    finally:
        subscriber.kill()
    assert [(m["key"], m["payload"]) for m in messages] == [
        (b"k1", b"one"),
        (None, b"no key here"),
        (None, b""),
        (b"k2", b"two:2"),
        (None, b""),
        (b"", b"empty key"),
    ]


def test_skip_empty_tab_separator_and_a_default_key(served: Served) -> None:
    subscriber = Subscriber("news", "--json", "--count", "3", "--broker", served.address)
    try:
        result = run(
            "pub",
            "news",
            "--skip-empty",
            "-K",
            r"\t",
            "--key",
            "fallback",
            "--broker",
            served.address,
            stdin="a\tone\n\n\r\nplain\n\nb\ttwo\n",
        )
        assert result.returncode == 0, result.stderr
        assert "published 3 message(s)" in result.stderr
        messages = received(subscriber)
    finally:
        subscriber.kill()
    assert [(m["key"], m["payload"]) for m in messages] == [
        (b"a", b"one"),
        (b"fallback", b"plain"),
        (b"b", b"two"),
    ]


def test_repeat_and_rate(served: Served) -> None:
    subscriber = Subscriber("news", "--count", "7", "--broker", served.address)
    try:
        repeated = run("pub", "news", "--repeat", "3", "--broker", served.address, stdin="a\nb\n")
        assert repeated.returncode == 0, repeated.stderr
        assert "published 6 message(s)" in repeated.stderr
        paced = run(
            "pub", "news", "z", "--repeat", "1", "--rate", "1000", "--broker", served.address
        )
        assert paced.returncode == 0, paced.stderr
        status, out, err = subscriber.finish()
    finally:
        subscriber.kill()
    assert status == 0, err
    assert out.decode().splitlines() == ["a", "a", "a", "b", "b", "b", "z"]
    # --rate: 5 messages at 10/s take at least 0.4 s (the first goes at once).
    started = time.monotonic()
    paced = run("pub", "news", "tick", "--repeat", "5", "--rate", "10", "--broker", served.address)
    assert paced.returncode == 0, paced.stderr
    assert time.monotonic() - started >= 0.4


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["news", "x", "--file", "f"], "give only one of MESSAGE, --file and -s/--stdin-whole"),
        (["news", "-s", "--file", "f"], "give only one of MESSAGE, --file and -s/--stdin-whole"),
        (["news", "x", "-K", ":"], "-K/--key-separator and --skip-empty apply to stdin lines"),
        (["news", "-K", ""], "-K/--key-separator must not be empty"),
        (["news", "x", "--repeat", "0"], "--repeat: must be at least 1, got 0"),
        (["news", "x", "--rate", "0"], "--rate: must be a number above 0, got 0"),
        (["news", "x", "-H", "novalue"], "expected NAME=VALUE, got 'novalue'"),
    ],
)
def test_contradictory_or_bad_arguments_are_refused(args: list[str], said: str) -> None:
    result = run("pub", *args, "--broker", "127.0.0.1:1")
    assert result.returncode == 2
    assert said in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (
            ["pub", "-t", "news", "-m", "hello"],
            "broker pub: -t is not an option: TOPIC is positional, first: broker pub news hello",
        ),
        (
            ["pub", "news", "-m", "hello"],
            "broker pub: -m is not an option: MESSAGE is positional, after TOPIC: "
            "broker pub news hello",
        ),
        (
            ["sub", "--topic", "news"],
            "broker sub: --topic is not an option: TOPIC is positional: "
            "broker sub news [more topics ...]",
        ),
    ],
)
def test_mosquittos_topic_and_message_flags_say_the_form_to_use(args: list[str], said: str) -> None:
    """``broker pub -t news -m hello`` printed the top-level usage and took
    ``news`` for the topic; now one line says that both are positional."""
    result = run(*args, "--broker", "127.0.0.1:1")
    assert result.returncode == 2
    assert result.stderr == said + "\n"
    assert "--topic" not in run("pub", "--help").stdout


@pytest.mark.parametrize("command", [["pub", "news", "x"], ["sub", "news"]])
@pytest.mark.parametrize(
    ("address", "said"),
    [
        ("127.0.0.1:abc", "address '127.0.0.1:abc': port 'abc' is not a number"),
        ("", "no broker address given"),
    ],
)
def test_a_broker_address_that_names_no_broker_is_a_usage_error(
    command: list[str], address: str, said: str
) -> None:
    """It exited 1, as if a broker had failed, where usage errors exit 2."""
    result = run(*command, "--broker", address)
    assert result.returncode == 2
    assert result.stderr == f"broker {command[0]}: {said}\n"


def test_an_unreadable_file_is_one_line(tmp_path: Path) -> None:
    result = run("pub", "news", "--file", str(tmp_path / "missing"), "--broker", "127.0.0.1:1")
    assert result.returncode == 1
    assert (
        result.stderr
        == f"broker pub: cannot read {tmp_path / 'missing'}: No such file or directory\n"
    )


def test_nothing_listening_is_one_line() -> None:
    result = run("pub", "news", "x", "--broker", "127.0.0.1:1")
    assert result.returncode == 1
    assert result.stderr == (
        "broker pub: cannot connect to 127.0.0.1:1: connection refused "
        "(is a broker running there?)\n"
    )


def test_ctrl_c_on_a_terminal_stops_at_once_and_says_how_many_were_published(
    served: Served,
) -> None:
    """Before: Ctrl-C was ignored until Enter (the read of the terminal went
    on), then a KeyboardInterrupt traceback."""
    subscriber = Subscriber("news", "--count", "2", "--broker", served.address)
    controller, terminal = pty.openpty()
    publisher = subprocess.Popen(
        broker_command("pub", "news", "--broker", served.address),
        stdin=terminal,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        os.write(controller, b"one\ntwo\n")
        status, out, err = subscriber.finish()  # both were published
        assert status == 0, err
        assert out.decode().splitlines() == ["one", "two"]
        # The publisher now waits for the terminal's next line.
        interrupt(publisher)
        _, stderr = publisher.communicate(timeout=TIMEOUT)
    finally:
        subscriber.kill()
        if publisher.poll() is None:
            publisher.kill()
            publisher.communicate(timeout=TIMEOUT)
        os.close(controller)
        os.close(terminal)
    assert publisher.returncode == 130
    assert stderr == (
        "broker pub: reading stdin (each line is a message); Ctrl-D to end\n"
        "broker pub: interrupted: published 2 message(s) to 'news'\n"
    )


def test_after_a_refusal_it_says_what_the_broker_confirmed(tmp_path: Path) -> None:
    """It used to count what it had handed to the client as published:
    "(published 1216 message(s) ... before that)" when the broker had
    refused every one of them."""
    from .helpers import serving

    auth = tmp_path / "auth.toml"
    auth.write_text('[principals.ro]\ntoken = "ro-token"\npublish = []\nsubscribe = ["t"]\n')
    with serving("--set", f"auth_file={auth}") as served:
        lines = b"".join(b"%d\n" % n for n in range(2000))
        result = run("pub", "t", "--broker", served.address, "--token", "ro-token", stdin=lines)
    assert result.returncode != 0
    last = result.stderr.splitlines()[-1]
    assert last.startswith("broker pub: (the broker confirmed 0 of the ")
    assert last.endswith(" message(s) given for 't' before that)")


def test_a_message_too_large_is_said_after_what_went_before_is_confirmed(
    served: Served,
) -> None:
    """The messages before one too large for ``max_message`` are delivered:
    it used to say "confirmed 0 of the 2", so a user who sent them again got
    each one twice. (A message larger than a frame, 70,000 bytes, goes.)"""
    subscriber = Subscriber("big", "--count", "3", "--broker", served.address)
    try:
        lines = b"a\nb\n" + b"y" * 70_000 + b"\n" + b"x" * (9 << 20) + b"\nd\n"
        result = run("pub", "big", "--broker", served.address, stdin=lines)
        assert result.returncode == 1
        said = result.stderr.splitlines()
        assert said[0].startswith("broker pub: a message of 943")
        assert said[0].endswith("is larger than the broker's max_message (8388608 bytes)")
        assert said[-1] == (
            "broker pub: (the broker confirmed 3 of the 3 message(s) given for 'big' before that)"
        )
        status, out, _err = subscriber.finish()
        assert (status, out) == (0, b"a\nb\n" + b"y" * 70_000 + b"\n")
    finally:
        subscriber.kill()


def test_reading_a_terminal_says_so() -> None:
    """``broker pub TOPIC`` on a terminal waited in silence for lines: a user
    who forgot MESSAGE saw a hang."""
    leader, follower = pty.openpty()
    try:
        result = subprocess.run(
            broker_command("pub", "news", "--broker", "127.0.0.1:1"),
            stdin=follower,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )
    finally:
        os.close(follower)
        os.close(leader)
    assert result.stderr.splitlines()[0] == (
        "broker pub: reading stdin (each line is a message); Ctrl-D to end"
    )
