"""What ``broker cursors`` and ``broker groups`` share: a command that
lists (``ls [PATTERN]``) and deletes (``delete TOPIC NAME``) things the
broker keeps per principal and topic, through its topic administration."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._admin import (
    CONNECTING,
    Row,
    add_action,
    ask,
    cell,
    json_lines,
    listed,
    on_owner,
    refuse_pattern,
    refuse_topic,
    table,
)
from ._common import Subparsers, add_command

if TYPE_CHECKING:
    from broker.client import ClusterClient


@dataclass(frozen=True)
class Kept:
    """One such command: its name, what it keeps and how rows are shown."""

    #: The command (``cursors``), and what one of them is called (``cursor``).
    command: str
    thing: str
    #: How the help names them ("durable cursors").
    things: str
    #: The Admin commands that list and delete them.
    list_command: str
    delete_command: str
    #: The table's headings and the row fields under them.
    headers: tuple[str, ...]
    fields: tuple[str, ...]
    examples: str
    description: str
    #: The help of ``delete``.
    delete_help: str


def add_parser(subparsers: Subparsers, kept: Kept) -> None:
    """The command ``kept`` describes, with its ``ls`` and ``delete``."""
    parser = add_command(
        subparsers,
        kept.command,
        help=f"list or delete the {kept.things} a broker keeps",
        description=f"List or delete the {kept.things} the broker keeps (its topic "
        "administration, over the protocol port).",
        examples=kept.examples + kept.description + CONNECTING,
    )
    actions = parser.add_subparsers(
        dest="action", metavar="ACTION", required=True, help="ls or delete"
    )
    ls = add_action(
        actions, kept.examples, "ls", f"list the {kept.things} (of the topics PATTERN matches)"
    )
    ls.add_argument(
        "pattern",
        nargs="?",
        metavar="PATTERN",
        help=f"only the {kept.thing}s of topics it matches: orders.* (one token), "
        "orders.> (one or more)",
    )
    ls.add_argument("--json", action="store_true", help="one JSON object a line, every field")
    delete = add_action(actions, kept.examples, "delete", kept.delete_help)
    delete.add_argument("topic", metavar="TOPIC", help=f"the {kept.thing}'s topic")
    delete.add_argument("name", metavar=kept.thing.upper(), help=f"the {kept.thing}'s name")
    delete.add_argument(
        "--principal",
        metavar="NAME",
        help=f"whose {kept.thing} (default: the principal of these credentials)",
    )
    parser.set_defaults(func=lambda args: run(args, kept), parser=parser)


def run(args: argparse.Namespace, kept: Kept) -> int:
    if args.action == "ls":
        return _ls(args, kept)
    return _delete(args, kept)


def _ls(args: argparse.Namespace, kept: Kept) -> int:
    refused = refuse_pattern(kept.command, args.pattern)
    if refused is not None:
        return refused
    arguments = {} if args.pattern is None else {"pattern": args.pattern}

    def key(row: Row) -> tuple[str, str, str]:
        principal = str(row.get("principal") or "")
        return (str(row.get("topic", "")), str(row.get(kept.thing, "")), principal)

    async def work(cluster: ClusterClient) -> list[Row]:
        return await listed(cluster, kept.list_command, key, **arguments)

    rows, status = ask(kept.command, args, work)
    if status is not None:
        return status
    if args.json:
        sys.stdout.write(json_lines(rows))
    elif rows:
        lines = [[cell(row.get(field)) for field in kept.fields] for row in rows]
        sys.stdout.write(table(kept.headers, lines))
    else:
        what = "" if args.pattern is None else f" on topics matching {args.pattern!r}"
        print(f"broker {kept.command}: no {kept.things[:-1]}{what}", file=sys.stderr)
    return 0


def _delete(args: argparse.Namespace, kept: Kept) -> int:
    refused = refuse_topic(kept.command, args.topic)
    if refused is not None:
        return refused
    topic, name = args.topic, args.name
    arguments: dict[str, Any] = {kept.thing: name}
    if args.principal is not None:
        arguments["principal"] = args.principal

    async def work(cluster: ClusterClient) -> Row:
        return await on_owner(cluster, kept.delete_command, topic, **arguments)

    _row, status = ask(kept.command, args, work)
    if status is not None:
        return status
    print(f"deleted {kept.thing} {name!r} of {topic!r}")
    return 0
