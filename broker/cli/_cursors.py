"""``broker cursors``: list and delete the durable cursors a broker keeps."""

from __future__ import annotations

from . import _kept
from ._common import Subparsers

CURSORS = _kept.Kept(
    command="cursors",
    thing="cursor",
    things="durable cursors",
    list_command="cursors",
    delete_command="delete-cursor",
    headers=("TOPIC", "CURSOR", "PRINCIPAL", "POSITION", "LAG"),
    fields=("topic", "cursor", "principal", "position", "lag"),
    examples=r"""
  broker cursors ls                             # every durable cursor, with its lag
  broker cursors ls 'orders.*' --json           # those of matching topics, as JSON lines
  broker cursors delete orders.eu billing       # forget the cursor "billing" of orders.eu
""",
    description="""
A durable cursor (`broker sub TOPIC --cursor NAME`) is kept per principal
and topic. ls lists them, sorted by topic: POSITION is the next offset it
reads, LAG how many records it is behind the topic's end. delete forgets
one: the next `broker sub --cursor NAME` starts where --from says (the
latest, by default). --principal names another principal's cursor
(default: the one the credentials give).
""",
    delete_help="forget a durable cursor",
)


def add_parser(subparsers: Subparsers) -> None:
    _kept.add_parser(subparsers, CURSORS)
