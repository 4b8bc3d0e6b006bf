"""Every argument of every command has a help line, and each command's help
ends with examples."""

from __future__ import annotations

import argparse

import pytest

from broker.cli import build_parser

from .helpers import run

COMMANDS = ["serve", "pub", "sub", "stat", "health", "token", "bench"]


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
