"""What the ``broker`` subcommands share: help formatting, argument types,
the client flags, one-line errors, and Ctrl-C handling."""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import sys
import textwrap
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import trio

from broker.errors import BrokerError, sole_exception
from broker.protocol import topic_name_problem

from ._codes import EXIT_INTERRUPTED as EXIT_INTERRUPTED
from ._codes import LOG_LEVELS

DEFAULT_BROKER = "127.0.0.1:7400"
#: The environment variable that gives ``--broker`` its default (as ``NATS_URL``).
BROKER_URL = "BROKER_URL"
DEFAULT_METRICS = "127.0.0.1:9400"

#: How long ``pub`` and ``sub`` try to connect again to a broker that went
#: away (``--reconnect``): a broker's restart, or a worker's.
RECONNECT = 60.0
#: Subparsers' type (argparse keeps the class private).
Subparsers = Any


def common_parent() -> argparse.ArgumentParser:
    """The flags every subcommand takes as well as ``broker`` itself:
    ``--log-level`` works before or after the subcommand."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument(
        "--log-level",
        type=str.upper,
        choices=LOG_LEVELS,
        default=argparse.SUPPRESS,  # keeps a value given before the subcommand
        help="logging level, before or after the command (default: INFO)",
    )
    return parent


def add_command(
    subparsers: Subparsers,
    name: str,
    *,
    help: str,
    description: str,
    examples: str,
) -> argparse.ArgumentParser:
    """A subcommand's parser: its one-line ``help``, a ``description`` and
    ``examples`` shown as written (each command's help ends with examples)."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        name,
        help=help,
        description=textwrap.fill(description, 78),
        epilog="examples:\n" + examples.strip("\n"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[common_parent()],
    )
    return parser


class _Habit(argparse.Action):
    """An option another tool has and this command takes otherwise (Mosquitto's
    ``-t TOPIC``): said in one line with the form to use, status 2."""

    def __init__(self, option_strings: Sequence[str], dest: str, hint: str) -> None:
        super().__init__(option_strings, dest, nargs="?", help=argparse.SUPPRESS)
        self.hint = hint

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        print(f"{parser.prog}: {option_string} is not an option: {self.hint}", file=sys.stderr)
        parser.exit(2)


def refuse_habits(parser: argparse.ArgumentParser, hints: dict[tuple[str, ...], str]) -> None:
    """Options users bring from other tools (``mosquitto_pub -t news -m hello``),
    left out of ``--help``: each is refused with its hint (what to write instead)."""
    for flags, hint in hints.items():
        parser.add_argument(*flags, action=_Habit, hint=hint, dest="_habit")


# ---------------------------------------------------------------- argument types


def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def non_negative_float(text: str) -> float:
    """An argparse type: a finite number, 0 or more."""
    value = _number(text)
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number, 0 or more, got {text}")
    return value


def positive_float(text: str) -> float:
    """An argparse type: a finite number above 0."""
    value = _number(text)
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number above 0, got {text}")
    return value


_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "0": "\0", "\\": "\\"}


def unescape(text: str) -> str:
    r"""``text`` with ``\t``, ``\n``, ``\r``, ``\0`` and ``\\`` made the
    characters they name (any other backslash stays as it is), so that
    ``--format '{key}\t{payload}'`` and ``-K '\t'`` mean a tab."""
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(0)), text)


# ---------------------------------------------------------------- client flags


def add_client_flags(parser: argparse.ArgumentParser, *, reconnect: bool = True) -> None:
    """``--broker``, ``--token`` and the TLS flags of the commands that
    connect to the broker's protocol port (``pub``, ``sub``, ``topics``,
    ``cursors``); ``--broker`` is resolved by :func:`refuse_brokers`.
    Without ``reconnect`` there is no ``--reconnect`` (``args.reconnect`` is 0:
    a command that asks once does not wait for a broker to come back)."""
    group = parser.add_argument_group("connection")
    group.add_argument(
        "--broker",
        default=None,
        metavar="ADDRESS",
        help="broker address: HOST:PORT, or tls://HOST:PORT for TLS; several, comma-separated, "
        "for brokers that share the topics (each topic goes to its owner) "
        f"(default: ${BROKER_URL}, or {DEFAULT_BROKER}; --broker wins over ${BROKER_URL})",
    )
    group.add_argument(
        "--token", help="credential for a broker that authenticates (default: $BROKER_TOKEN)"
    )
    group.add_argument("--tls", action="store_true", help="use TLS (system trust store)")
    group.add_argument(
        "--cafile", metavar="PEM", help="CA that signed the broker's certificate (implies --tls)"
    )
    group.add_argument(
        "--cert", metavar="PEM", help="client certificate for mutual TLS (implies --tls)"
    )
    group.add_argument(
        "--key-file",
        metavar="PEM",
        help="private key of --cert, if not in the same file (mosquitto's --key; "
        "here --key is the message key)",
    )
    if not reconnect:
        parser.set_defaults(reconnect=0.0)
        return
    group.add_argument(
        "--reconnect",
        type=non_negative_float,
        default=RECONNECT,
        metavar="SECONDS",
        help="when the connection breaks or the broker restarts, connect again for up to "
        "this long and go on where it was (nothing lost or repeated when the broker kept "
        "the session); 0: end at once (default: %(default)s)",
    )


def refuse_brokers(command: str, args: argparse.Namespace) -> int | None:
    """Settle ``args.broker``: ``--broker``, else ``$BROKER_URL`` (if set
    and not empty), else :data:`DEFAULT_BROKER`. One that names no broker
    (``host:abc``, ``http://...``, empty) is a usage error: 2 after saying
    so in one line (and where it came from), before anything is read or
    connected; None to go on."""
    from broker.client import ClientError, parse_servers

    source = ""
    if args.broker is None:
        args.broker = os.environ.get(BROKER_URL) or DEFAULT_BROKER
        if os.environ.get(BROKER_URL):
            source = f" (from ${BROKER_URL}; --broker overrides it)"
    try:
        parse_servers(args.broker)
    except ClientError as error:
        print(f"broker {command}: {error}{source}", file=sys.stderr)
        return 2
    return None


def client_options(args: argparse.Namespace) -> dict[str, Any]:
    """``open_client`` keyword arguments from the client flags (token, TLS files)."""
    from broker.tls import client_context

    token = args.token if args.token is not None else os.environ.get("BROKER_TOKEN")
    options: dict[str, Any] = {"token": token or None, "reconnect": args.reconnect}
    if args.tls or args.cafile or args.cert:
        options["ssl_context"] = client_context(args.cafile, args.cert, args.key_file)
    return options


def refuse_topics(command: str, topics: Sequence[str]) -> int | None:
    """Check ``pub``'s and ``sub``'s topic names before connecting (so a bad
    name never reaches the broker): 2 after saying in one line which rule
    the first bad one breaks, or None to go on."""
    for topic in topics:
        problem = topic_name_problem(topic)
        if problem is not None:
            print(f"broker {command}: {problem}", file=sys.stderr)
            return 2
    return None


# ---------------------------------------------------------------- running


def describe(error: BaseException) -> str:
    """``error`` as one line for a user."""
    cause = error.__cause__
    if isinstance(error, OSError) and isinstance(cause, BaseExceptionGroup):
        refused = [e for e in cause.exceptions if isinstance(e, ConnectionRefusedError)]
        if refused and len(refused) == len(cause.exceptions):
            where = str(error).removeprefix("all attempts to connect to ").removesuffix(" failed")
            return f"cannot connect to {where}: connection refused (is a broker running there?)"
    if isinstance(error, socket.gaierror):
        return f"cannot find the broker's host: {error.strerror} (check the host of --broker)"
    text = str(error)
    if text.endswith("credentials required"):
        return f"{text} (give --token, or set $BROKER_TOKEN)"
    if text.endswith("bad credentials"):
        return f"{text} (check --token, or $BROKER_TOKEN)"
    return text


class Interrupt:
    """Ctrl-C while a command runs (see :func:`run_interruptibly`): the first
    cancels :attr:`work` (what the command marked as the work to stop, so it
    can finish cleanly), a second one (or the first, before any work is
    marked) stops everything at once."""

    def __init__(self) -> None:
        self.count = 0
        self.work: trio.CancelScope | None = None
        #: Whether the command's clients are reconnecting (set by the
        #: command): Ctrl-C then ends it at once, as nothing can be finished
        #: cleanly without a broker (leaving would wait for one, up to
        #: ``--reconnect``).
        self.reconnecting: Callable[[], bool] = lambda: False

    @property
    def interrupted(self) -> bool:
        return self.count > 0

    @contextmanager
    def working(self) -> Iterator[None]:
        """Mark the block as the work the first Ctrl-C stops (it then ends quietly)."""
        with trio.CancelScope() as self.work:
            try:
                yield
            finally:
                self.work = None


def run_interruptibly(
    command: str, body: Callable[[Interrupt], Awaitable[None]]
) -> tuple[Interrupt, int | None]:
    """Run ``body(interrupt)`` in trio, Ctrl-C handled as :class:`Interrupt`
    says. Returns the interrupt and None, or 1 once a broker or OS error has
    been said in one line (``broker COMMAND: ...``)."""
    interrupt = Interrupt()

    async def main() -> None:
        with trio.open_signal_receiver(signal.SIGINT) as signals:
            async with trio.open_nursery() as nursery:

                async def run_body() -> None:
                    await body(interrupt)
                    nursery.cancel_scope.cancel()

                nursery.start_soon(run_body)
                async for _ in signals:
                    interrupt.count += 1
                    if interrupt.reconnecting():
                        sys.stdout.flush()
                        print(
                            f"broker {command}: interrupted while reconnecting to the broker",
                            file=sys.stderr,
                            flush=True,
                        )
                        os._exit(EXIT_INTERRUPTED)  # (leaving would wait for a broker)
                    if interrupt.count == 1 and interrupt.work is not None:
                        interrupt.work.cancel()
                    else:
                        nursery.cancel_scope.cancel()

    failure: BaseException | None = None
    try:
        trio.run(main)
    except BaseExceptionGroup as group:
        failure = group
        while isinstance(failure, BaseExceptionGroup):  # nurseries in nurseries
            if (inner := sole_exception(failure)) is failure:
                # Several tasks (one per topic of `broker sub a b c`) met the
                # same end (the connection lost): say the first, in one line.
                mine, other = failure.split((BrokerError, OSError))
                if other is not None or mine is None:
                    raise
                inner = mine.exceptions[0]
            failure = inner
    except (BrokerError, OSError) as error:
        failure = error
    if isinstance(failure, BrokerError | OSError):
        print(f"broker {command}: {describe(failure)}", file=sys.stderr)
        return interrupt, 1
    if failure is not None:
        raise failure
    return interrupt, None
