"""Every argument of every command has a help line, and each command's help
ends with examples."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from broker.cli import build_parser

from .helpers import run

COMMANDS = [
    "serve",
    "pub",
    "sub",
    "topics",
    "cursors",
    "groups",
    "stat",
    "health",
    "token",
    "bench",
]


def commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (subparsers,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(subparsers.choices)


def test_the_commands_are_all_there() -> None:
    assert sorted(commands()) == sorted(COMMANDS)


@pytest.mark.parametrize("name", COMMANDS)
def test_every_argument_has_help_and_the_command_has_examples(name: str) -> None:
    parser = commands()[name]
    for action in parser._actions:
        assert action.help, f"broker {name}: {action.option_strings or action.dest} has no help"
    assert isinstance(parser.epilog, str)
    assert parser.epilog.startswith("examples:\n  broker ")
    assert parser.formatter_class is argparse.RawDescriptionHelpFormatter


def test_the_top_level_help_has_examples_and_help_for_each_flag() -> None:
    parser = build_parser()
    for action in parser._actions:
        assert action.help, action.option_strings
    result = run("--help")
    assert result.returncode == 0
    assert "examples:\n  broker serve" in result.stdout


@pytest.mark.parametrize("name", COMMANDS)
def test_help_prints(name: str) -> None:
    result = run(name, "--help")
    assert result.returncode == 0, result.stderr
    assert "examples:" in result.stdout


ROOT = Path(__file__).resolve().parents[2]
REDIRECT = re.compile(r"^\d*(>>?|<)")


def broker_invocations(lines: list[str]) -> list[list[str]]:
    """The arguments of every ``broker ...`` in shell ``lines`` (comments,
    pipes and redirections taken off; ``&`` too)."""
    found = []
    for line in lines:
        tokens = shlex.split(line, comments=True)
        segment: list[str] = []
        for token in [*tokens, "|"]:
            if token in ("|", "&", "&&", ";"):
                if "broker" in segment:
                    args = segment[segment.index("broker") + 1 :]
                    while args and REDIRECT.match(args[-1]):
                        args = args[:-1]
                    found.append(args)
                segment = []
            elif REDIRECT.match(token):
                segment.append(token)  # its target follows: dropped with it
            elif segment and REDIRECT.match(segment[-1]) and segment[-1] in (">", ">>", "<"):
                segment.pop()
            else:
                segment.append(token)
    return found


def shell_lines(markdown: Path) -> list[str]:
    blocks = re.findall(r"```sh\n(.*?)```", markdown.read_text(encoding="utf-8"), flags=re.S)
    return [line for block in blocks for line in block.splitlines() if "broker " in line]


def example_lines() -> list[str]:
    lines = []
    for parser in [build_parser(), *commands().values()]:
        assert parser.epilog is not None
        lines += [line for line in parser.epilog.splitlines() if line.startswith("  ")]
    return lines


@pytest.mark.parametrize(
    "source",
    ["README.md", "docs/broker.md", "help examples"],
)
def test_every_documented_invocation_parses(source: str) -> None:
    """What the README, docs/broker.md and the commands' own examples show
    the user to type is accepted as written."""
    lines = example_lines() if source == "help examples" else shell_lines(ROOT / source)
    invocations = broker_invocations(lines)
    assert len(invocations) >= 4
    parser = build_parser()
    for args in invocations:
        if "COMMAND" in args:
            continue  # `broker COMMAND --help`
        try:
            parser.parse_args(args)
        except SystemExit:  # pragma: no cover - what failed is in the message
            pytest.fail(f"broker {shlex.join(args)} ({source}) is refused")
