"""``broker sub --group``: members on the command line share a topic's
messages, each printed once, and the group goes on where it stopped."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from .helpers import TIMEOUT, broker_command, run, serving


def test_two_members_print_each_message_once_and_the_group_goes_on(tmp_path: Path) -> None:
    lines = "".join(f"m{n}\n" for n in range(200))
    with serving("--data-dir", str(tmp_path / "data")) as served:
        published = run("pub", "jobs", "--broker", served.address, stdin=lines)
        assert published.returncode == 0, published.stderr
        members = [
            subprocess.Popen(
                broker_command(
                    "sub",
                    "jobs",
                    "--group",
                    "g",
                    "--from",
                    "earliest",
                    "--timeout",
                    "2",
                    "--max-outstanding",
                    "10",
                    "--broker",
                    served.address,
                ),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(2)
        ]
        outputs = [member.communicate(timeout=TIMEOUT)[0].split() for member in members]
        assert all(member.returncode == 0 for member in members)
        printed = [line for output in outputs for line in output]
        assert sorted(printed) == sorted(f"m{n}" for n in range(200))  # each once
        more = run("pub", "jobs", "--broker", served.address, stdin="late\n")
        assert more.returncode == 0, more.stderr
        again = run("sub", "jobs", "--group", "g", "--count", "1", "--broker", served.address)
        assert again.stdout == "late\n"  # (after where the group stopped)
        text = run("stat", "--metrics", served.metrics).stdout
        assert "consumer groups" in text


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--group", "g", "--mode", "lossy"], "--group needs --mode reliable"),
        (["--group", "g", "--cursor", "c"], "--group needs --mode reliable, without --cursor"),
        (["--max-outstanding", "5"], "--max-outstanding needs --group"),
        (["--group", "bad name"], "a group name"),
    ],
)
def test_group_flags_are_checked(args: list[str], said: str) -> None:
    result = run("sub", "t", *args)
    assert result.returncode == 2
    assert said in result.stderr
