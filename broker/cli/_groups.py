"""``broker groups``: list and delete the consumer groups a broker keeps."""

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
  broker groups ls                              # every consumer group, its members and lag
  broker groups ls 'orders.*' --json            # those of matching topics, as JSON lines
  broker groups delete orders workers           # forget the group "workers" of orders
"""

DESCRIPTION = """
A consumer group (`broker sub TOPIC --group NAME`) is kept per principal
and topic. ls lists them, sorted by topic: FLOOR is the first offset not
settled, LAG how many records are not settled, OUTSTANDING how many its
members hold (the last three known while the group is in use). delete
forgets one that has no members (Kafka's rule: stop its members first):
the next member starts where --from says. --principal names another
principal's group (default: the one the credentials give).
"""


def add_parser(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "groups",
        help="list or delete the consumer groups a broker keeps",
        description="List or delete the consumer groups the broker keeps (its topic "
        "administration, over the protocol port).",
        examples=EXAMPLES + DESCRIPTION + CONNECTING,
    )
    actions = parser.add_subparsers(
        dest="action", metavar="ACTION", required=True, help="ls or delete"
    )
    ls = add_action(
        actions, EXAMPLES, "ls", "list the consumer groups (of the topics PATTERN matches)"
    )
    ls.add_argument(
        "pattern",
        nargs="?",
        metavar="PATTERN",
        help="only the groups of topics it matches: orders.* (one token), orders.> (one or more)",
    )
    ls.add_argument("--json", action="store_true", help="one JSON object a line, every field")
    delete = add_action(actions, EXAMPLES, "delete", "forget a consumer group without members")
    delete.add_argument("topic", metavar="TOPIC", help="the group's topic")
    delete.add_argument("group", metavar="GROUP", help="the group's name")
    delete.add_argument(
        "--principal",
        metavar="NAME",
        help="whose group (default: the principal of these credentials)",
    )
    parser.set_defaults(func=run, parser=parser)


def _key(row: Row) -> tuple[str, str, str]:
    return (str(row.get("topic", "")), str(row.get("group", "")), str(row.get("principal") or ""))


def run(args: argparse.Namespace) -> int:
    if args.action == "ls":
        return _ls(args)
    return _delete(args)


def _ls(args: argparse.Namespace) -> int:
    refused = refuse_pattern("groups", args.pattern)
    if refused is not None:
        return refused
    arguments = {} if args.pattern is None else {"pattern": args.pattern}

    async def work(cluster: ClusterClient) -> list[Row]:
        return await listed(cluster, "groups", _key, **arguments)

    rows, status = ask("groups", args, work)
    if status is not None:
        return status
    if args.json:
        sys.stdout.write(json_lines(rows))
    elif rows:
        headers = ("TOPIC", "GROUP", "PRINCIPAL", "MEMBERS", "FLOOR", "LAG", "OUTSTANDING")
        names = ("topic", "group", "principal", "members", "floor", "lag", "outstanding")
        sys.stdout.write(table(headers, [[cell(row.get(n)) for n in names] for row in rows]))
    else:
        what = "" if args.pattern is None else f" on topics matching {args.pattern!r}"
        print(f"broker groups: no consumer group{what}", file=sys.stderr)
    return 0


def _delete(args: argparse.Namespace) -> int:
    refused = refuse_topic("groups", args.topic)
    if refused is not None:
        return refused
    topic, group = args.topic, args.group
    arguments: dict[str, Any] = {"group": group}
    if args.principal is not None:
        arguments["principal"] = args.principal

    async def work(cluster: ClusterClient) -> Row:
        return await on_owner(cluster, "delete-group", topic, **arguments)

    _row, status = ask("groups", args, work)
    if status is not None:
        return status
    print(f"deleted group {group!r} of {topic!r}")
    return 0
