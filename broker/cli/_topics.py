"""``broker topics``: list, show, delete and purge the topics a broker keeps."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from ._admin import (
    CONNECTING,
    Row,
    add_action,
    ask,
    cell,
    fields,
    json_lines,
    listed,
    on_owner,
    refuse_pattern,
    refuse_topic,
    size,
    table,
    when,
)
from ._common import Subparsers, add_command

if TYPE_CHECKING:
    from broker.client import ClusterClient

EXAMPLES = r"""
  broker topics ls                              # every topic the broker keeps
  broker topics ls 'orders.>' --json            # those under orders., one JSON object a line
  broker topics show orders.eu                  # every figure of one topic
  broker topics purge orders.eu --before 1000   # delete its records below offset 1000
  broker topics delete orders.old --yes         # delete it: log, cursors, groups
"""

DESCRIPTION = """
ls lists every topic the broker keeps, whether opened since it started or
only on disk, sorted by name; PATTERN (NATS-style: '*' is one token, a last
'>' one or more: orders.*, orders.>) keeps those it matches. Its columns:
FIRST and END (the first offset kept and the next one to be written),
RECORDS, BYTES, LAST-APPEND (local time), SUBS (live subscribers) and
CURSORS (durable cursors). A topic whose log is not open shows its figures
as of the log's last flush; '-' is a figure the broker does not know (a
memory-only broker keeps no offsets). show prints every field of one topic.
delete removes a topic's log, durable cursors and consumer groups for good
and ends its live subscriptions; it needs --yes. purge deletes the records
below an offset (Kafka's delete-records): subscribers reading there are
told of the gap.
"""

#: Columns of ``topics ls``: heading, field, how it is shown.
COLUMNS = (
    ("TOPIC", "topic", cell),
    ("FIRST", "first", cell),
    ("END", "end", cell),
    ("RECORDS", "records", cell),
    ("BYTES", "bytes", size),
    ("LAST-APPEND", "last_append_ms", when),
    ("SUBS", "subscribers", cell),
    ("CURSORS", "cursors", cell),
)


def add_parser(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "topics",
        help="list, show, delete or purge the topics a broker keeps",
        description="List, show, delete or purge the topics the broker keeps (its topic "
        "administration, over the protocol port).",
        examples=EXAMPLES + DESCRIPTION + CONNECTING,
    )
    actions = parser.add_subparsers(
        dest="action", metavar="ACTION", required=True, help="ls, show, delete or purge"
    )
    ls = add_action(actions, EXAMPLES, "ls", "list the topics (all, or those PATTERN matches)")
    ls.add_argument(
        "pattern",
        nargs="?",
        metavar="PATTERN",
        help="only the topics it matches: orders.* (one token), orders.> (one or more)",
    )
    ls.add_argument("--json", action="store_true", help="one JSON object a line, every field")
    show = add_action(actions, EXAMPLES, "show", "every field of one topic, one a line")
    show.add_argument("topic", metavar="TOPIC", help="the topic")
    show.add_argument("--json", action="store_true", help="one JSON object")
    delete = add_action(
        actions, EXAMPLES, "delete", "delete a topic: its log, cursors and groups, for good"
    )
    delete.add_argument("topic", metavar="TOPIC", help="the topic to delete")
    delete.add_argument(
        "--yes", action="store_true", help="yes, delete it (without: nothing is done)"
    )
    purge = add_action(actions, EXAMPLES, "purge", "delete a topic's records below an offset")
    purge.add_argument("topic", metavar="TOPIC", help="the topic to purge")
    purge.add_argument(
        "--before",
        type=_offset,
        required=True,
        metavar="OFFSET",
        help="delete the records below this offset (its end offset: all of them)",
    )
    parser.set_defaults(func=run, parser=parser)


def _offset(text: str) -> int:
    """An argparse type: an offset, 0 or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an offset (0 or more), got {text!r}") from None
    if not 0 <= value < 2**63:
        raise argparse.ArgumentTypeError(f"an offset is 0 to 2**63 - 1, got {value}")
    return value


def run(args: argparse.Namespace) -> int:
    action = args.action
    if action == "ls":
        return _ls(args)
    refused = refuse_topic("topics", args.topic)
    if refused is not None:
        return refused
    if action == "show":
        return _show(args)
    if action == "delete":
        return _delete(args)
    return _purge(args)


def _ls(args: argparse.Namespace) -> int:
    refused = refuse_pattern("topics", args.pattern)
    if refused is not None:
        return refused
    arguments = {} if args.pattern is None else {"pattern": args.pattern}

    async def work(cluster: ClusterClient) -> list[Row]:
        return await listed(cluster, "topics", lambda row: row.get("topic", ""), **arguments)

    rows, status = ask("topics", args, work)
    if status is not None:
        return status
    if args.json:
        sys.stdout.write(json_lines(rows))
    elif rows:
        lines = [[shown(row.get(name)) for _, name, shown in COLUMNS] for row in rows]
        sys.stdout.write(table([heading for heading, _, _ in COLUMNS], lines))
    else:
        what = "no topic" if args.pattern is None else f"no topic matches {args.pattern!r}"
        print(f"broker topics: {what}", file=sys.stderr)
    return 0


def _show(args: argparse.Namespace) -> int:
    from broker.protocol import topic_pattern_error

    topic = args.topic

    # (A name is a pattern that matches itself alone, if it is one.)
    arguments = {} if topic_pattern_error(topic) else {"pattern": topic}

    async def work(cluster: ClusterClient) -> list[Row]:
        return await listed(cluster, "topics", lambda row: row.get("topic", ""), **arguments)

    rows, status = ask("topics", args, work)
    if status is not None:
        return status
    rows = [row for row in rows if row.get("topic") == topic]
    if not rows:
        print(f"broker topics: no topic {topic!r}", file=sys.stderr)
        return 1
    if args.json:
        sys.stdout.write(json_lines(rows))
    else:
        sys.stdout.write(fields(rows[0], {"bytes": size, "last_append_ms": when}))
    return 0


def _delete(args: argparse.Namespace) -> int:
    if not args.yes:
        print(
            f"broker topics: deleting {args.topic!r} removes its log, durable cursors and "
            "consumer groups for good: add --yes to delete it",
            file=sys.stderr,
        )
        return 2
    topic = args.topic

    async def work(cluster: ClusterClient) -> Row:
        return await on_owner(cluster, "delete-topic", topic)

    row, status = ask("topics", args, work)
    if status is not None:
        return status
    print(
        f"deleted {topic!r}: {row.get('records', 0)} record(s), {size(row.get('bytes'))}, "
        f"{row.get('cursors', 0)} cursor(s), {row.get('groups', 0)} group(s); "
        f"{row.get('subscribers', 0)} subscriber(s) ended"
    )
    return 0


def _purge(args: argparse.Namespace) -> int:
    topic, before = args.topic, args.before

    async def work(cluster: ClusterClient) -> Row:
        return await on_owner(cluster, "purge-topic", topic, before=before)

    row, status = ask("topics", args, work)
    if status is not None:
        return status
    print(
        f"purged {topic!r}: {row.get('records', 0)} record(s) deleted; "
        f"its first offset is {cell(row.get('first'))}"
    )
    return 0
