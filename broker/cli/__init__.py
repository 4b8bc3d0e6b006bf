"""The ``broker`` command line.

``broker serve`` runs the broker; ``broker pub`` / ``broker sub`` publish and
print messages; ``broker topics`` / ``broker cursors`` / ``broker groups``
list and manage the topics, durable cursors and consumer groups it keeps;
``broker stat`` shows a running broker's budgets, topics, connections,
accounts and channels; ``broker health`` answers container
health checks; ``broker token`` makes client credentials; ``broker bench``
runs the project's own benchmarks. One module per command; :func:`main` is
the console script, :func:`build_parser` its argument parser.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence

import broker

from ._codes import EXIT_INTERRUPTED, LOG_LEVELS

__all__ = ["build_parser", "main"]

EXAMPLES = """
  broker serve                                  # a broker on 127.0.0.1:7400
  broker sub news                               # print the messages of 'news'
  broker pub news hello                         # publish one
  broker topics ls                              # the topics it keeps
  broker stat --watch                           # watch it work
  broker COMMAND --help                         # each command's options and examples
"""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``broker`` command."""
    # The commands (and trio, cbor2, ... with them) are imported here, not
    # when the module is: a Ctrl-C while they load (a second or so on a busy
    # machine) is then main's to answer, in one line, not a traceback.
    from . import _bench, _cursors, _groups, _health, _pub, _serve, _stat, _sub, _token, _topics

    parser = argparse.ArgumentParser(
        prog="broker",
        description="A flow-controlled pub/sub broker of actors on trio.",
        epilog="examples:\n" + EXAMPLES.strip("\n"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"%(prog)s {broker.__version__}",
        help="print the version",
    )
    parser.add_argument(
        "--log-level",
        type=str.upper,
        default=None,
        choices=LOG_LEVELS,
        help="logging level, before or after the command (default: $BROKER_LOG_LEVEL, or INFO)",
    )
    subparsers = parser.add_subparsers(
        dest="command", metavar="COMMAND", required=True, help="(broker COMMAND --help for more)"
    )
    for command in (_serve, _pub, _sub, _topics, _cursors, _groups, _stat, _health, _token, _bench):
        command.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``broker`` command; returns the process exit status."""
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        level = args.log_level or os.environ.get("BROKER_LOG_LEVEL", "").upper() or "INFO"
        if level not in LOG_LEVELS:
            parser.error(
                f"BROKER_LOG_LEVEL: {level!r} is not a logging level "
                f"(choose from {', '.join(LOG_LEVELS)})"
            )
        logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        func: Callable[[argparse.Namespace], int] = args.func
        return func(args)
    except KeyboardInterrupt:  # Ctrl-C outside a command's own handling (start-up)
        return _interrupted_status(sys.argv[1:] if argv is None else argv)


def _interrupted_status(argv: Sequence[str]) -> int:
    """The status of a Ctrl-C before the command took it over (while the
    commands load: a second or more on a busy machine): 0 for the commands
    that Ctrl-C ends normally (``serve``, ``stat --watch``), else 130."""
    words = [word for word in argv if not word.startswith("-")]
    if list(argv[:1]) == ["--log-level"]:  # (its value is no command)
        words = words[1:]
    command = words[0] if words else ""
    watching = any(word in ("-w", "--watch") or word.startswith("--watch=") for word in argv)
    if command == "serve" or (command == "stat" and watching):
        return 0
    return EXIT_INTERRUPTED
