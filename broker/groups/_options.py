"""The ``Subscribe`` options of a consumer group's member, checked.

A reliable subscription with ``"group": NAME`` joins that group (per
principal and topic). :func:`group_request` reads the group's options and
leaves the start options (``"from"``, ``"from_time"``) to the caller.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from broker.protocol import TopicNameError, check_topic_name

from ._state import GroupConfig

__all__ = [
    "DEFAULT_ACK_WAIT_MS",
    "DEFAULT_MAX_DELIVERIES",
    "DEFAULT_MAX_OUTSTANDING",
    "GROUP_OPTIONS",
    "GroupOptionError",
    "GroupRequest",
    "dead_letters_default",
    "group_request",
]

#: A member holds at most this many unsettled records unless it asks otherwise
#: (RabbitMQ's prefetch, JetStream's ``max_ack_pending``).
DEFAULT_MAX_OUTSTANDING = 1000
#: The most a member may ask for.
MAX_OUTSTANDING_LIMIT = 65_536
#: How long a record may stay out unsettled (JetStream's ``AckWait``).
DEFAULT_ACK_WAIT_MS = 30_000
#: Deliveries after which a record goes to the dead letters (Kafka share
#: groups' ``delivery.count.limit``).
DEFAULT_MAX_DELIVERIES = 5
#: The options a member's Subscribe may carry besides the start options.
GROUP_OPTIONS = frozenset(
    {"group", "max_outstanding", "ack_wait", "max_deliveries", "dead_letters", "ordering"}
)
#: Options that make no sense for a member (a group keeps its own position).
_EXCLUDED = ("cursor", "until", "timestamps")


class GroupOptionError(ValueError):
    """A group option is malformed (its text names the option)."""


@dataclass(frozen=True, slots=True)
class GroupRequest:
    """What a member's Subscribe asks for."""

    name: str
    max_outstanding: int
    #: The group-wide options it named (None: it left them to the group).
    ack_wait_ms: int | None
    max_deliveries: int | None
    dead_letters: str | None
    ordering_by_key: bool | None

    def config(self, current: GroupConfig | None = None) -> GroupConfig:
        """The group's configuration with what this member named."""
        base = current or GroupConfig(DEFAULT_ACK_WAIT_MS, DEFAULT_MAX_DELIVERIES)
        return GroupConfig(
            self.ack_wait_ms if self.ack_wait_ms is not None else base.ack_wait_ms,
            self.max_deliveries if self.max_deliveries is not None else base.max_deliveries,
            self.ordering_by_key if self.ordering_by_key is not None else base.ordering_by_key,
            base.window,
        )


def dead_letters_default(topic: str) -> str:
    """The dead-letter topic of a group on ``topic`` unless it names one."""
    return f"{topic}.dead-letters"


def _int(options: Mapping[str, object], name: str, low: int, high: int) -> int | None:
    value = options.get(name)
    if name not in options:
        return None
    if type(value) is not int or not low <= value <= high:
        raise GroupOptionError(f'"{name}" must be an integer from {low} to {high}')
    return value


def group_request(options: Mapping[str, object]) -> tuple[GroupRequest, dict[str, object]]:
    """The group a Subscribe's ``options`` name, and the options left (the
    start options). Raises :class:`GroupOptionError` naming the option."""
    name = options.get("group")
    if type(name) is not str:
        raise GroupOptionError('"group" must be text: the consumer group\'s name')
    try:
        check_topic_name(name)
    except TopicNameError as error:
        raise GroupOptionError(f'"group": {error}') from None
    for excluded in _EXCLUDED:
        if excluded in options:
            raise GroupOptionError(
                f'"group" and "{excluded}" exclude each other: a group keeps its own position'
            )
    outstanding = _int(options, "max_outstanding", 1, MAX_OUTSTANDING_LIMIT)
    ack_wait = _int(options, "ack_wait", 1, 2**31 - 1)
    deliveries = _int(options, "max_deliveries", 1, 1000)
    dead_letters = options.get("dead_letters")
    if "dead_letters" in options:
        if type(dead_letters) is not str:
            raise GroupOptionError('"dead_letters" must be text: a topic name')
        try:
            check_topic_name(dead_letters)
        except TopicNameError as error:
            raise GroupOptionError(f'"dead_letters": {error}') from None
    ordering = options.get("ordering")
    by_key: bool | None = None
    if "ordering" in options:
        if ordering not in ("key", "none"):
            raise GroupOptionError('"ordering" must be "key" (in order per key) or "none"')
        by_key = ordering == "key"
    request = GroupRequest(
        name,
        outstanding if outstanding is not None else DEFAULT_MAX_OUTSTANDING,
        ack_wait,
        deliveries,
        dead_letters if type(dead_letters) is str else None,
        by_key,
    )
    rest = {k: v for k, v in options.items() if k not in GROUP_OPTIONS}
    return request, rest
