"""``broker pub`` / ``broker sub`` with a topic name that breaks the rule:
one line on stderr, exit status 2, no traceback, and no hang (they used to
wait forever for a bind the broker could never accept).

The topic reaches the command as a real argument, through a subprocess. A
NUL cannot be passed that way at all (the operating system refuses it); the
client tests cover it.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import trio

from broker.protocol import TOPIC_NAME_RULE
from tests.server.helpers import running_broker, url

#: A hang guard only: the commands answer at once.
HANG_GUARD = 60

BAD_TOPICS: dict[str, tuple[str | bytes, str]] = {
    "empty": ("", "must not be empty"),
    "newline": ("news\nflash", "U+000A (a control character, Cc)"),
    "bidi override": ("abc\u202edef", "U+202E (a format character, Cf)"),
    "space": ("two words", "U+0020"),
    "20 KB": ("x" * 20_000, "too long: 20000 characters"),
    "not NFC": ("cafe\u0301", "NFC"),
    # Bytes that are not UTF-8 arrive as a lone surrogate (surrogateescape).
    "not UTF-8": (b"caf\xe9", "U+DCE9 (a surrogate, Cs)"),
}


async def run_command(*args: str | bytes) -> subprocess.CompletedProcess[bytes]:
    with trio.fail_after(HANG_GUARD):
        return await trio.run_process(
            [sys.executable, "-m", "broker", *args],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env={**os.environ, "PYTHONUTF8": "1"},
        )


@pytest.mark.parametrize("command", ["pub", "sub"])
@pytest.mark.parametrize(("topic", "says"), BAD_TOPICS.values(), ids=list(BAD_TOPICS))
async def test_a_bad_topic_is_one_line_and_exit_2(command: str, topic: str, says: str) -> None:
    async with running_broker() as broker:
        extra = ["hello"] if command == "pub" else []
        result = await run_command(command, topic, *extra, "--broker", url(broker))
        stderr = result.stderr.decode()
        assert result.returncode == 2, stderr
        assert "Traceback" not in stderr
        assert stderr.count("\n") == 1 and stderr.startswith(f"broker {command}: "), stderr
        assert says in stderr, stderr
        assert result.stdout == b""
        assert not broker.connections  # it never connected


async def test_the_character_complaint_states_the_rule() -> None:
    result = await run_command("pub", "a\tb", "x", "--broker", "127.0.0.1:1")
    assert result.returncode == 2
    assert result.stderr.decode().rstrip("\n").endswith(TOPIC_NAME_RULE)
