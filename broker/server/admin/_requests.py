"""Topic administration: the ``Admin`` requests (Kafka's admin client).

``topics``, ``cursors`` and ``groups`` list (see ``_admin_lists``).
``delete-topic`` ends every
subscription of the topic (a connected client gets a ``FreeHandle``; a
pattern subscription a ``Matched`` that unbinds the topic), forgets its
durable cursors and consumer groups and removes its log; a topic with
publishers bound goes on with a new, empty log (offsets from 1), which
patterns then match again. ``purge-topic`` deletes the records before an
offset (Kafka's delete-records): readers behind it get a ``Gap`` (a
``MatchedGap``) as they read on. ``cursors`` and ``delete-cursor`` list
and forget durable cursors; ``groups`` and ``delete-group`` consumer
groups (one with members is not deleted: Kafka's rule).

Allowed to principals with ``admin = true`` in the auth file, and to
everyone on a broker without authentication. A request that names a
topic another worker serves is answered ``ELSEWHERE`` with that worker.
Answers longer than a frame come in pages (``next``: ask again with
``"after"``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping

from broker.log import LogError, StoredTopic
from broker.protocol import (
    Admin,
    AdminStatus,
    AdminValue,
    Connection,
    TopicPattern,
    topic_name_problem,
    topic_pattern_error,
)

from .._services import BrokerServices
from ..connection._delivery import Deliveries
from ..storage._topic_logs import TopicLogs, TopicUnavailable
from ..topics._log_subscription import cursor_key
from ..topics._topic import Subscription
from ._lists import (
    AdminError,
    Listing,
    Row,
    answer_rows,
    cursor_parts,
    cursor_rows,
    group_rows,
    list_topics,
)

log = logging.getLogger("broker.server")

#: What each command takes (its arguments, besides ``after`` for lists).
COMMANDS: Mapping[str, frozenset[str]] = {
    "topics": frozenset({"pattern", "after"}),
    "delete-topic": frozenset({"topic"}),
    "purge-topic": frozenset({"topic", "before"}),
    "cursors": frozenset({"pattern", "after"}),
    "delete-cursor": frozenset({"topic", "cursor", "principal"}),
    "groups": frozenset({"pattern", "after"}),
    "delete-group": frozenset({"topic", "group", "principal"}),
}


def administer(
    services: BrokerServices,
    protocol: Connection,
    request: Admin,
    principal: str | None,
    kept: dict[str, Listing],
) -> Callable[[], Awaitable[None]] | None:
    """Answer ``request`` now, or return the job that answers it once the
    disk is listed (run it in a task: it answers nothing if the connection
    closed meanwhile). ``kept``: the connection's last topic listing (see
    :class:`Listing`)."""
    try:
        arguments = _arguments(request)
        command = request.command
        if command == "topics":
            pattern = _pattern(arguments)
            return lambda: list_topics(
                services, protocol, request.request, pattern, arguments, kept
            )
        if command == "cursors":
            rows = cursor_rows(services, _pattern(arguments))
            keys = [key for key, _ in rows]
            answer_rows(protocol, request.request, keys, lambda i: rows[i][1], arguments)
        elif command == "groups":
            rows = group_rows(services, _pattern(arguments))
            keys = [key for key, _ in rows]
            answer_rows(protocol, request.request, keys, lambda i: rows[i][1], arguments)
        elif command == "delete-group":
            _answer(protocol, request.request, [_delete_group(services, arguments, principal)])
        elif command == "delete-topic":
            _answer(protocol, request.request, [_delete_topic(services, _topic(arguments))])
        elif command == "purge-topic":
            before = arguments.get("before")
            if type(before) is not int or before < 1:
                raise AdminError(AdminStatus.REFUSED, '"before" must be an offset (>= 1)')
            _answer(protocol, request.request, [_purge_topic(services, _topic(arguments), before)])
        else:  # delete-cursor
            _answer(protocol, request.request, [_delete_cursor(services, arguments, principal)])
    except AdminError as error:
        protocol.admin_answer(request.request, error.status, [], None, error.reason)
    return None


def refuse(protocol: Connection, request: Admin, status: AdminStatus, reason: str) -> None:
    """Answer ``request`` with ``status`` and ``reason``: nothing done."""
    protocol.admin_answer(request.request, status, [], None, reason)


# ---------------------------------------------------------------- arguments


def _arguments(request: Admin) -> dict[str, AdminValue]:
    known = COMMANDS.get(request.command)
    if known is None:
        raise AdminError(
            AdminStatus.REFUSED,
            f"unknown admin command {request.command[:40]!r} (known: {', '.join(COMMANDS)})",
        )
    unknown = sorted(set(request.arguments) - known)
    if unknown:
        raise AdminError(
            AdminStatus.REFUSED,
            f"{request.command} takes {sorted(known)}, not {[u[:40] for u in unknown[:3]]}",
        )
    return request.arguments


def _pattern(arguments: Mapping[str, AdminValue]) -> TopicPattern | None:
    pattern = arguments.get("pattern")
    if pattern is None:
        return None
    problem = topic_pattern_error(pattern)
    if problem is not None:
        raise AdminError(AdminStatus.REFUSED, f'"pattern": {problem}')
    assert isinstance(pattern, str)
    return TopicPattern(pattern)


def _topic(arguments: Mapping[str, AdminValue]) -> str:
    topic = arguments.get("topic")
    problem = topic_name_problem(topic)
    if problem is not None:
        raise AdminError(AdminStatus.REFUSED, f'"topic": {problem}')
    assert isinstance(topic, str)
    return topic


def _named(
    arguments: Mapping[str, AdminValue], what: str, principal: str | None
) -> tuple[str, str, str | None]:
    """The topic, the name of a ``what`` (a cursor's or a group's: the
    topic-name rule) and whose it is (``"principal"``, default: the
    client's own) that ``arguments`` name."""
    topic = _topic(arguments)
    name = arguments.get(what)
    if not isinstance(name, str) or topic_name_problem(name) is not None:
        raise AdminError(AdminStatus.REFUSED, f'"{what}" must be a {what}\'s name')
    owner = arguments.get("principal", principal)
    if owner is not None and not isinstance(owner, str):
        raise AdminError(AdminStatus.REFUSED, '"principal" must be text')
    return topic, name, owner


def _owned(services: BrokerServices, topic: str) -> None:
    elsewhere = services.topics.not_owned(topic)
    if elsewhere is not None:
        raise AdminError(AdminStatus.ELSEWHERE, elsewhere)


# ---------------------------------------------------------------- answers


def _answer(protocol: Connection, request: int, rows: list[Row]) -> None:
    protocol.admin_answer(request, AdminStatus.OK, rows)


def _delete_group(
    services: BrokerServices, arguments: Mapping[str, AdminValue], principal: str | None
) -> Row:
    """Forget a consumer group without members (Kafka's delete-groups: a
    group with members is refused)."""
    topic, name, owner = _named(arguments, "group", principal)
    _owned(services, topic)
    if services.storage.groups is None:
        raise AdminError(AdminStatus.REFUSED, "this broker keeps no topic log: it has no groups")
    try:
        members = services.storage.groups.forget(owner or "", topic, name)
    except KeyError:
        whose = f" of principal {owner!r}" if owner else ""
        raise AdminError(
            AdminStatus.REFUSED, f"no group {name[:64]!r} on topic {topic[:64]!r}{whose}"
        ) from None
    if members is not None:
        raise AdminError(
            AdminStatus.REFUSED,
            f"group {name[:64]!r} of {topic[:64]!r} has {members} member(s): "
            "stop them first (a group is deleted without members)",
        )
    return {"topic": topic, "group": name, "deleted": True}


# ---------------------------------------------------------------- changing


def _delete_topic(services: BrokerServices, name: str) -> Row:
    """Delete topic ``name``: its subscriptions end, its cursors and groups
    are forgotten, its log removed (see the module)."""
    _owned(services, name)
    logs = services.storage.logs
    topic = services.topics.topics.get(name)
    stored = _stored(logs, name)
    set_aside = logs is not None and logs.set_aside(name) is not None
    if topic is None and stored is None and not set_aside:
        raise AdminError(AdminStatus.REFUSED, f"no topic {name[:64]!r}")
    records = size = 0
    if stored is not None:
        records, size = stored.end - stored.first, stored.bytes
    if topic is not None and topic.log is not None and not topic.log.closed:
        records = topic.log.next_offset - topic.log.first_offset
    services.topics.patterns.topic_deleted(name)  # (pattern members: a Matched that unbinds it)
    ended = 0
    if topic is not None:
        for subscription in list(topic.subscriptions):
            _end(services, subscription)
            ended += 1
    groups = (
        services.storage.groups.forget_topic(name) if services.storage.groups is not None else 0
    )
    cursors = 0
    book = services.storage.cursors
    if book is not None:
        for key, _ in book.items():
            parts = cursor_parts(key)
            if parts is not None and parts[1] == name:
                book.delete(key)
                cursors += 1
    if topic is not None:
        topic.route_unsynced()  # (flush="always" batches: deleted with the rest)
    if logs is not None:
        try:
            logs.delete(name)
        except TopicUnavailable as error:
            if topic is not None:  # (its log was closed first: open it again)
                with contextlib.suppress(TopicUnavailable):
                    topic.log = logs.open(name)
                topic.release_if_unused()
            raise AdminError(AdminStatus.REFUSED, str(error)) from None
        if topic is not None and (topic.publishers or topic.held):
            # Its publishers go on, into a new log; patterns match it again.
            topic.log = logs.open(name)
            topic.log_error = None
            services.topics.patterns.topic_made(name)
    if topic is not None:
        topic.release_if_unused()
    log.info("topic %r deleted: %d records, %d subscriptions ended", name[:64], records, ended)
    return {
        "topic": name,
        "deleted": True,
        "records": records,
        "bytes": size,
        "cursors": cursors,
        "groups": groups,
        "subscribers": ended,
    }


def _stored(logs: TopicLogs | None, name: str) -> StoredTopic | None:
    """What the disk holds of topic ``name`` (its own directory read)."""
    if logs is None:
        return None
    try:
        return logs.store.stored_topic(name)
    except OSError as error:
        raise AdminError(
            AdminStatus.REFUSED, f"topic {name[:64]!r} cannot be read now: {error.strerror}"
        ) from None


def _end(services: BrokerServices, subscription: Subscription) -> None:
    """End ``subscription`` of a deleted topic: its client is told (a
    FreeHandle now, or, for a session whose connection is down, the
    subscription missing from the ``Welcome`` of its resume), and its
    session forgets it (its record too: a restart does not bring it back)."""
    for session in services.sessions.sessions.values():
        if session.subscriptions.get(subscription.handle) is subscription:
            if session.connection is None:
                session.subscriptions.pop(subscription.handle, None)
                if session.state is not None:
                    session.state.subscriptions.pop(subscription.handle, None)
                    if services.storage.session_records is not None:
                        services.storage.session_records.save(
                            session, session.state, session.subscriptions
                        )
            break
    connection = subscription.connection
    if isinstance(connection, Deliveries) and (
        connection.subscriptions.get(subscription.handle) is subscription
    ):
        connection.end(subscription.handle)
    else:
        subscription.close()


def _purge_topic(services: BrokerServices, name: str, before: int) -> Row:
    """Delete the records of ``name`` before offset ``before``; readers
    behind it are told with a Gap as they read on."""
    _owned(services, name)
    if services.storage.logs is None:
        raise AdminError(AdminStatus.REFUSED, "this broker keeps no topic log: nothing to purge")
    known = name in services.topics.topics or _stored(services.storage.logs, name) is not None
    if not known:
        raise AdminError(AdminStatus.REFUSED, f"no topic {name[:64]!r}")
    topic = services.topics.topic(name)
    topic_log = topic.log
    try:
        if topic_log is None:  # pragma: no cover - a broker with logs gives every topic one
            raise AdminError(AdminStatus.REFUSED, f"topic {name[:64]!r} has no log")
        topic_log.write()  # (so that what is appended may be purged too)
        deleted = topic_log.purge_before(before)
    except LogError as error:
        raise AdminError(AdminStatus.REFUSED, f"purging {name[:64]!r} failed: {error}") from None
    finally:
        for subscription in list(topic.subscriptions):
            if subscription.reads_log:
                subscription.pump()
        topic.reader_moved()
        topic.release_if_unused()
    log.info("topic %r purged before offset %d: %d records deleted", name[:64], before, deleted)
    return {"topic": name, "first": topic_log.first_offset, "records": deleted}


def _delete_cursor(
    services: BrokerServices, arguments: Mapping[str, AdminValue], principal: str | None
) -> Row:
    """Forget a durable cursor (its subscription, if one is live, stores
    it again at its next Ack)."""
    topic, cursor, owner = _named(arguments, "cursor", principal)
    book = services.storage.cursors
    if book is None or not book.delete(cursor_key(owner, topic, cursor)):
        whose = f" of principal {owner!r}" if owner else ""
        raise AdminError(
            AdminStatus.REFUSED, f"no cursor {cursor[:64]!r} of topic {topic[:64]!r}{whose}"
        )
    return {"topic": topic, "cursor": cursor, "deleted": True}
