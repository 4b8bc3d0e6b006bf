"""What ``broker topics``, ``broker cursors`` and ``broker groups`` share: asking the broker's
topic administration (``Client.admin``) over the protocol port, merging the
answers of several brokers (or workers), and showing rows as a table, one
field a line, or JSON lines."""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ._common import (
    Interrupt,
    add_client_flags,
    client_options,
    common_parent,
    refuse_brokers,
    run_interruptibly,
)

if TYPE_CHECKING:  # (only for its type: ``broker --help`` need not import the client)
    from broker.client import ClusterClient

#: A row of an admin answer.
Row = dict[str, Any]

CONNECTING = """
Connecting: --broker (default: $BROKER_URL, or 127.0.0.1:7400; --broker
wins), --token (or $BROKER_TOKEN) and the TLS flags, as `broker sub`. The
broker allows topic administration to principals with the `admin`
permission in its auth file (everyone on a broker without authentication).
Exit status: 0 when done, 1 when the broker refused or failed (one line
saying why), 2 for a usage error (nothing sent).
"""


def add_action(actions: Any, examples: str, name: str, help: str) -> argparse.ArgumentParser:
    """The parser of one action of ``topics`` or ``cursors`` (``ls``,
    ``delete``, ...), with the connection flags."""
    parser: argparse.ArgumentParser = actions.add_parser(
        name,
        help=help,
        description=help[0].upper() + help[1:] + ".",
        epilog="examples:\n" + examples.strip("\n"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[common_parent()],
    )
    add_client_flags(parser, reconnect=False)
    return parser


def refuse_pattern(command: str, pattern: str | None) -> int | None:
    """2 after saying in one line which rule ``pattern`` breaks (nothing is
    sent), or None to go on (None: no pattern)."""
    from broker.protocol import topic_pattern_error

    if pattern is None:
        return None
    problem = topic_pattern_error(pattern)
    if problem is None:
        return None
    print(f"broker {command}: {problem}", file=sys.stderr)
    return 2


def refuse_topic(command: str, topic: str) -> int | None:
    """2 after saying in one line which rule ``topic`` (a name) breaks, or None."""
    from broker.protocol import topic_name_problem

    problem = topic_name_problem(topic)
    if problem is None:
        return None
    print(f"broker {command}: {problem}", file=sys.stderr)
    return 2


def ask(
    command: str,
    args: argparse.Namespace,
    work: Callable[[ClusterClient], Any],
) -> tuple[Any, int | None]:
    """Connect as ``args`` say (one client per broker or worker) and return
    ``(await work(cluster), None)``; or ``(None, status)`` once a failure
    was said in one line: 1 for a refusal (the broker's reason) or a broker
    or OS error, 130 for Ctrl-C."""
    from broker.client import AdminRefused, open_cluster_client, parse_servers

    refused = refuse_brokers(command, args)
    if refused is not None:
        return None, refused
    result: list[Any] = []
    said: list[str] = []

    async def body(interrupt: Interrupt) -> None:
        options = client_options(args)
        servers = parse_servers(args.broker)
        async with open_cluster_client(servers, name=f"broker-{command}", **options) as cluster:
            try:
                with interrupt.working():
                    result.append(await work(cluster))
            except AdminRefused as refusal:
                said.append(refusal.reason)

    interrupt, status = run_interruptibly(command, body)
    if status is not None:
        return None, status
    if said:
        print(f"broker {command}: {said[0]}", file=sys.stderr)
        return None, 1
    if interrupt.interrupted or not result:
        print(f"broker {command}: interrupted", file=sys.stderr)
        return None, 130
    return result[0], None


async def listed(
    cluster: ClusterClient, command: str, key: Callable[[Row], Any], **arguments: Any
) -> list[Row]:
    """The rows of ``command`` from every broker (or worker) of ``cluster``,
    one per ``key``: where several list the same thing, the row of the
    topic's owner wins (a worker may list a topic another serves)."""
    rows: dict[Any, Row] = {}
    for client in cluster.clients.values():
        for row in await client.admin(command, **arguments):
            name = row.get("topic")
            owner = isinstance(name, str) and cluster.client_for(name) is client
            if key(row) not in rows or owner:
                rows[key(row)] = row
    return sorted(rows.values(), key=key)


async def on_owner(cluster: ClusterClient, command: str, topic: str, **arguments: Any) -> Row:
    """The one row ``command`` answers, asked of ``topic``'s owner."""
    rows = await cluster.client_for(topic).admin(command, topic=topic, **arguments)
    return rows[0] if rows else {}


# ---------------------------------------------------------------- showing


def size(value: Any) -> str:
    """Bytes as a person reads them (``1.5 MiB``); ``-`` when not known."""
    if not isinstance(value, int) or isinstance(value, bool):
        return "-"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value} B"


def when(ms: Any) -> str:
    """Milliseconds since the epoch as local time (``2026-11-25 10:00:00``); ``-`` if none."""
    if not isinstance(ms, int) or isinstance(ms, bool):
        return "-"
    moment = datetime.datetime.fromtimestamp(ms / 1000).astimezone()
    return moment.strftime("%Y-%m-%d %H:%M:%S")


def cell(value: Any) -> str:
    """A value in a table: ``-`` for none, as the JSON says for booleans."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def table(headers: Sequence[str], lines: Sequence[Sequence[str]]) -> str:
    """A table: the first column left-aligned, the others right-aligned."""
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(headers)]

    def row(cells: Sequence[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = "".join(f"  {c:>{w}}" for c, w in zip(cells[1:], widths[1:], strict=True))
        return (first + rest).rstrip()

    return "\n".join([row(headers), *(row(line) for line in lines)]) + "\n"


def json_lines(rows: Sequence[Mapping[str, Any]]) -> str:
    """One JSON object a line."""
    return "".join(json.dumps(dict(row), ensure_ascii=False) + "\n" for row in rows)


def fields(row: Mapping[str, Any], shown: Mapping[str, Callable[[Any], str]]) -> str:
    """``row``, one ``name: value`` a line, in its own order (``shown`` says
    how some values are written beside their raw value)."""
    width = max(len(name) for name in row)
    lines = []
    for name, value in row.items():
        text = cell(value)
        if name in shown and value is not None:
            text = f"{text} ({shown[name](value)})"
        lines.append(f"{name.ljust(width)}  {text}")
    return "\n".join(lines) + "\n"
