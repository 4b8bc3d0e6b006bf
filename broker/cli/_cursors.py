"""``broker cursors``: list and delete the durable cursors a broker keeps."""

from __future__ import annotations

import argparse
import sys
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
    from ..client import ClusterClient

EXAMPLES = r"""
  broker cursors ls                             # every durable cursor, with its lag
  broker cursors ls 'orders.*' --json           # those of matching topics, as JSON lines
  broker cursors delete orders.eu billing       # forget the cursor "billing" of orders.eu
"""

DESCRIPTION = """
A durable cursor (`broker sub TOPIC --cursor NAME`) is kept per principal
and topic. ls lists them, sorted by topic: POSITION is the next offset it
reads, LAG how many records it is behind the topic's end. delete forgets
one: the next `broker sub --cursor NAME` starts where --from says (the
latest, by default). --principal names another principal's cursor
(default: the one the credentials give).
"""


def add_parser(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "cursors",
        help="list or delete the durable cursors a broker keeps",
        description="List or delete the durable cursors the broker keeps (its topic "
        "administration, over the protocol port).",
        examples=EXAMPLES + DESCRIPTION + CONNECTING,
    )
    actions = parser.add_subparsers(
        dest="action", metavar="ACTION", required=True, help="ls or delete"
    )
    ls = add_action(
        actions, EXAMPLES, "ls", "list the durable cursors (of the topics PATTERN matches)"
    )
    ls.add_argument(
        "pattern",
        nargs="?",
        metavar="PATTERN",
        help="only the cursors of topics it matches: orders.* (one token), orders.> (one or more)",
    )
    ls.add_argument("--json", action="store_true", help="one JSON object a line, every field")
    delete = add_action(actions, EXAMPLES, "delete", "forget a durable cursor")
    delete.add_argument("topic", metavar="TOPIC", help="the cursor's topic")
    delete.add_argument("cursor", metavar="CURSOR", help="the cursor's name")
    delete.add_argument(
        "--principal",
        metavar="NAME",
        help="whose cursor (default: the principal of these credentials)",
    )
    parser.set_defaults(func=run, parser=parser)


def _key(row: Row) -> tuple[str, str, str]:
    return (str(row.get("topic", "")), str(row.get("cursor", "")), str(row.get("principal") or ""))


def run(args: argparse.Namespace) -> int:
    if args.action == "ls":
        return _ls(args)
    return _delete(args)


def _ls(args: argparse.Namespace) -> int:
    refused = refuse_pattern("cursors", args.pattern)
    if refused is not None:
        return refused
    arguments = {} if args.pattern is None else {"pattern": args.pattern}

    async def work(cluster: ClusterClient) -> list[Row]:
        return await listed(cluster, "cursors", _key, **arguments)

    rows, status = ask("cursors", args, work)
    if status is not None:
        return status
    if args.json:
        sys.stdout.write(json_lines(rows))
    elif rows:
        headers = ("TOPIC", "CURSOR", "PRINCIPAL", "POSITION", "LAG")
        names = ("topic", "cursor", "principal", "position", "lag")
        sys.stdout.write(table(headers, [[cell(row.get(n)) for n in names] for row in rows]))
    else:
        what = "" if args.pattern is None else f" on topics matching {args.pattern!r}"
        print(f"broker cursors: no durable cursor{what}", file=sys.stderr)
    return 0


def _delete(args: argparse.Namespace) -> int:
    refused = refuse_topic("cursors", args.topic)
    if refused is not None:
        return refused
    topic, cursor = args.topic, args.cursor
    arguments: dict[str, Any] = {"cursor": cursor}
    if args.principal is not None:
        arguments["principal"] = args.principal

    async def work(cluster: ClusterClient) -> Row:
        return await on_owner(cluster, "delete-cursor", topic, **arguments)

    row, status = ask("cursors", args, work)
    if status is not None:
        return status
    if row.get("deleted") is False:
        print(f"broker cursors: no cursor {cursor!r} on {topic!r}", file=sys.stderr)
        return 1
    print(f"deleted cursor {cursor!r} of {topic!r}")
    return 0
