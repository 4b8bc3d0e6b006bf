"""``broker groups``: list and delete the consumer groups a broker keeps."""

from __future__ import annotations

from . import _kept
from ._common import Subparsers

GROUPS = _kept.Kept(
    command="groups",
    thing="group",
    things="consumer groups",
    list_command="groups",
    delete_command="delete-group",
    headers=("TOPIC", "GROUP", "PRINCIPAL", "MEMBERS", "FLOOR", "LAG", "OUTSTANDING"),
    fields=("topic", "group", "principal", "members", "floor", "lag", "outstanding"),
    examples=r"""
  broker groups ls                              # every consumer group, its members and lag
  broker groups ls 'orders.*' --json            # those of matching topics, as JSON lines
  broker groups delete orders workers           # forget the group "workers" of orders
""",
    description="""
A consumer group (`broker sub TOPIC --group NAME`) is kept per principal
and topic. ls lists them, sorted by topic: FLOOR is the first offset not
settled, LAG how many records are not settled, OUTSTANDING how many its
members hold (the last three known while the group is in use). delete
forgets one that has no members (Kafka's rule: stop its members first):
the next member starts where --from says. --principal names another
principal's group (default: the one the credentials give).
""",
    delete_help="forget a consumer group without members",
)


def add_parser(subparsers: Subparsers) -> None:
    _kept.add_parser(subparsers, GROUPS)
