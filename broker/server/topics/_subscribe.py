"""Which subscription a ``Subscribe`` makes: its mode, its options, the broker's log."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol, cast

from broker.groups import GroupOptionError, group_request
from broker.protocol import DeliveryMode, TopicPattern

from ..cluster._forward import ForwardTopic, forwarded_subscription
from ..cluster._forward_dropping import forwarded_dropping_subscription
from ..cluster._forward_group import ForwardedGroupMember
from ..patterns._outlet import Outlet, PatternConnection
from ..patterns._subscription import PatternHost, PatternSubscription, pattern_options
from ._groups import GroupMemberConnection, Groups
from ._log_subscription import (
    CURSOR_PRINCIPAL,
    CursorBook,
    LogSubscriber,
    make_log_subscription,
    start_request,
)
from ._lossy import DroppingSubscriber, DroppingSubscription, OptionError, QueueLimits
from ._topic import Subscription, Topic

__all__ = [
    "OptionError",
    "SubscribingConnection",
    "make_pattern_subscription",
    "make_subscription",
]


class SubscribingConnection(DroppingSubscriber, LogSubscriber, GroupMemberConnection, Protocol):
    """What every kind of subscription needs of its subscriber's connection."""


def make_subscription(
    connection: SubscribingConnection,
    handle: int,
    topic: Topic,
    mode: str,
    options: Mapping[str, object],
    *,
    cursors: CursorBook | None = None,
    principal: str | None = None,
    trusted: bool = False,
    groups: Groups | None = None,
) -> Subscription:
    """The subscription a Subscribe asks for (raises :class:`OptionError`,
    naming the option): ``lossy`` and ``latest`` keep their own bounded
    queues; ``reliable`` reads the topic's log where there is one, and is
    charged to its publishers (today's memory-only behaviour) where not.
    A topic another worker owns gets a forwarded subscription, made at the
    owner over the link (``_forward``); a lossy or latest one keeps its
    dropping queue here all the same, fed by the link (``_forward_dropping``).

    A ``trusted`` connection (another worker's link) may name the principal
    whose durable cursor it forwards (``CURSOR_PRINCIPAL``), so that a
    cursor is the same one whichever worker its client reached; from any
    other connection that option is unknown, and refused as such.

    A reliable Subscribe with ``"group"`` joins that consumer group
    (``_groups``), on a broker with topic logs, at the topic's owner."""
    if trusted and CURSOR_PRINCIPAL in options:
        options = dict(options)
        named = options.pop(CURSOR_PRINCIPAL)
        if type(named) is not str:
            raise OptionError(f'"{CURSOR_PRINCIPAL}" must be text: a principal\'s name')
        principal = named
    if "group" in options and mode == DeliveryMode.RELIABLE:
        return _join_group(connection, handle, topic, options, groups, principal, trusted)
    if isinstance(topic, ForwardTopic):
        if mode != DeliveryMode.RELIABLE:
            return forwarded_dropping_subscription(connection, handle, topic, mode, options)
        return forwarded_subscription(connection, handle, topic, mode, options, principal)
    if mode == DeliveryMode.RELIABLE:
        request = start_request(options)
        log = topic.log
        if log is None:
            if not request.plain:
                raise OptionError(
                    f"{sorted(options)[:3]} need a broker with a data directory: "
                    "this one is memory-only and keeps no topic log"
                )
            return Subscription(connection, handle, topic, mode)
        return make_log_subscription(
            connection, handle, topic, mode, request, log=log, cursors=cursors, principal=principal
        )
    return DroppingSubscription(connection, handle, topic, mode, QueueLimits.from_options(options))


def _join_group(
    connection: SubscribingConnection,
    handle: int,
    topic: Topic,
    options: Mapping[str, object],
    groups: Groups | None,
    principal: str | None,
    trusted: bool,
) -> Subscription:
    """The member a Subscribe with ``"group"`` makes (raises :class:`OptionError`):
    at the topic's owner, a member of its group; at another worker, a
    member there over the link (``_forward_group``). From a link, options
    other than the group's are not refused (that would end the link): the
    member joins with the group's."""
    try:
        request, rest = group_request(options)
        start = start_request(rest).start
    except GroupOptionError as error:
        raise OptionError(str(error)) from None
    if isinstance(topic, ForwardTopic):
        if not topic.link.offsets:
            raise OptionError(
                '"group" needs a broker with a data directory: this one is memory-only '
                "and keeps no topic log"
            )
        return ForwardedGroupMember(connection, handle, topic, options, principal)
    if groups is None or topic.log is None:
        raise OptionError(
            '"group" needs a broker with a data directory: this one is memory-only '
            "and keeps no topic log"
        )
    return groups.join(connection, handle, topic, request, start, principal, lenient=trusted)


class _DeferredCursors:
    """A pattern's members' cursor book: positions stored at an Ack are put,
    and written together once the pattern's Ack is applied (one journal
    write per Ack, not one per topic)."""

    __slots__ = ("_book",)

    def __init__(self, book: CursorBook) -> None:
        self._book = book

    def position(self, key: str) -> int | None:
        return self._book.position(key)

    def store(self, key: str, position: int) -> None:
        self._book.put(key, position)

    def items(self) -> list[tuple[str, int]]:
        return self._book.items()

    def put(self, key: str, position: int) -> None:
        self._book.put(key, position)

    def write(self) -> None:
        self._book.write()

    def delete(self, key: str) -> bool:
        return self._book.delete(key)


def make_pattern_subscription(
    connection: PatternConnection,
    handle: int,
    pattern: TopicPattern,
    mode: str,
    options: Mapping[str, object],
    *,
    host: PatternHost,
    cursors: CursorBook | None,
    principal: str | None,
    may_read: Callable[[str], bool],
) -> PatternSubscription:
    """The subscription a Subscribe of a pattern asks for (raises
    :class:`OptionError`, naming the option): its members are what
    :func:`make_subscription` makes for each matched topic, with the same
    mode and options (checked once here, on no topic, so that a bad one is
    refused at once and not per topic)."""
    given = pattern_options(options)
    if mode == DeliveryMode.RELIABLE:
        request = start_request(given)
        if cursors is None and not request.plain:
            raise OptionError(
                f"{sorted(given)[:3]} need a broker with a data directory: "
                "this one is memory-only and keeps no topic log"
            )
    else:
        QueueLimits.from_options(given)
    members = None if cursors is None else _DeferredCursors(cursors)

    def member(
        outlet: Outlet, match: int, topic: Topic, mode: str, options: Mapping[str, object]
    ) -> Subscription:
        return make_subscription(
            cast(SubscribingConnection, outlet),
            match,
            topic,
            mode,
            options,
            cursors=members,
            principal=principal,
        )

    durable = mode == DeliveryMode.RELIABLE and cursors is not None and "cursor" in given
    return PatternSubscription(
        connection,
        handle,
        pattern,
        mode,
        given,
        host=host,
        factory=member,
        may_read=may_read,
        durable=durable,
    )
