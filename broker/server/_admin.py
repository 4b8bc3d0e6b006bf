"""Topic administration: the ``Admin`` requests (Kafka's admin client).

``topics`` lists every topic the broker keeps, opened or only on disk (the
data directory is listed in a thread, reading each topic's directory and
marks, never opening a log: see ``broker.log.list_stored_topics``), with
the exact figures of the logs open here. ``delete-topic`` ends every
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

import bisect
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Protocol

import cbor2
import trio

from broker.log import LogConfig, LogError, StoredTopic
from broker.protocol import (
    Admin,
    AdminStatus,
    AdminValue,
    Connection,
    TopicPattern,
    topic_name_problem,
    topic_pattern_error,
)

from ._delivery import Deliveries
from ._groups import Groups
from ._log_subscription import CursorBook, cursor_key
from ._logs import TopicLogs, TopicUnavailable
from ._patterns import PatternRegistry
from ._session import SessionTable
from ._session_records import SessionRecords
from ._topic import Subscription, Topic

log = logging.getLogger("broker.server")

#: Bytes of a frame an answer's head and ``next`` may take (the rest: rows).
ANSWER_SLACK = 512
#: How long (seconds) a connection's topic listing serves the pages after it.
LISTING_KEPT = 10.0
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

Row = dict[str, AdminValue]


class AdminError(Exception):
    """The request is answered with ``status`` and this one line, nothing done."""

    def __init__(self, status: AdminStatus, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class AdminHost(Protocol):
    """What administration needs of the broker."""

    @property
    def logs(self) -> TopicLogs | None: ...

    @property
    def topics(self) -> dict[str, Topic]: ...

    @property
    def cursors(self) -> CursorBook | None: ...

    @property
    def groups(self) -> Groups | None: ...

    @property
    def patterns(self) -> PatternRegistry: ...

    @property
    def sessions(self) -> SessionTable: ...

    @property
    def session_records(self) -> SessionRecords | None: ...

    def topic(self, name: str) -> Topic: ...

    def not_owned(self, topic: str) -> str | None: ...


def administer(
    host: AdminHost,
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
            return lambda: _list_topics(host, protocol, request.request, pattern, arguments, kept)
        if command == "cursors":
            rows = _cursor_rows(host, _pattern(arguments))
            keys = [key for key, _ in rows]
            _answer_rows(protocol, request.request, keys, lambda i: rows[i][1], arguments)
        elif command == "groups":
            rows = _group_rows(host, _pattern(arguments))
            keys = [key for key, _ in rows]
            _answer_rows(protocol, request.request, keys, lambda i: rows[i][1], arguments)
        elif command == "delete-group":
            _answer(protocol, request.request, [_delete_group(host, arguments, principal)])
        elif command == "delete-topic":
            _answer(protocol, request.request, [_delete_topic(host, _topic(arguments))])
        elif command == "purge-topic":
            before = arguments.get("before")
            if type(before) is not int or before < 1:
                raise AdminError(AdminStatus.REFUSED, '"before" must be an offset (>= 1)')
            _answer(protocol, request.request, [_purge_topic(host, _topic(arguments), before)])
        else:  # delete-cursor
            _answer(protocol, request.request, [_delete_cursor(host, arguments, principal)])
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


def _owned(host: AdminHost, topic: str) -> None:
    elsewhere = host.not_owned(topic)
    if elsewhere is not None:
        raise AdminError(AdminStatus.ELSEWHERE, elsewhere)


# ---------------------------------------------------------------- answers


def _answer(protocol: Connection, request: int, rows: list[Row]) -> None:
    protocol.admin_answer(request, AdminStatus.OK, rows)


def _answer_rows(
    protocol: Connection,
    request: int,
    keys: Sequence[str],
    row_of: Callable[[int], Row],
    arguments: Mapping[str, object],
) -> None:
    """Send the rows after ``arguments["after"]`` (``keys`` sorted; row
    ``i`` made by ``row_of(i)`` only when it is sent), as many as one frame
    holds; ``next`` names the last sent if more follow."""
    after = arguments.get("after")
    index = bisect.bisect_right(keys, after) if isinstance(after, str) else 0
    budget = protocol.peer_max_frame - ANSWER_SLACK
    page: list[Row] = []
    size = 0
    while index < len(keys):
        row = row_of(index)
        cost = len(cbor2.dumps(row))
        if page and size + cost > budget:
            protocol.admin_answer(request, AdminStatus.OK, page, keys[index - 1])
            return
        page.append(row)
        size += cost
        index += 1
    protocol.admin_answer(request, AdminStatus.OK, page)


# ---------------------------------------------------------------- listing


class Listing:
    """What one ``topics`` request read of the disk, kept for the pages
    that follow it (asked with ``"after"``) for :data:`LISTING_KEPT`
    seconds: the data directory is read once per listing, not per page."""

    __slots__ = ("at", "cursors", "groups", "names", "pattern", "stored")

    def __init__(
        self,
        pattern: str | None,
        stored: list[StoredTopic],
        names: list[str],
        cursors: dict[str, int],
        groups: dict[str, int],
        at: float,
    ) -> None:
        self.pattern = pattern
        self.stored = {topic.name: topic for topic in stored}
        self.names = names
        self.cursors = cursors
        self.groups = groups
        self.at = at


async def _list_topics(
    host: AdminHost,
    protocol: Connection,
    request: int,
    pattern: TopicPattern | None,
    arguments: Mapping[str, object],
    kept: dict[str, Listing],
) -> None:
    """Answer ``topics``: the data directory listed in a thread (or the
    listing a first page read, for the pages after it), overlaid with
    what the broker has open; rows are made only for the page sent."""
    text = pattern.text if pattern is not None else ""
    now = trio.current_time()
    listing = kept.get(text)
    if listing is None or "after" not in arguments or now - listing.at > LISTING_KEPT:
        match = pattern.matches if pattern is not None else None
        logs = host.logs
        stored: list[StoredTopic] = []
        if logs is not None:
            try:
                stored = await trio.to_thread.run_sync(logs.store.list_topics, match)
            except OSError as error:
                if not protocol.closed:
                    line = f"the data directory cannot be listed now: {error.strerror}"
                    protocol.admin_answer(request, AdminStatus.REFUSED, [], None, line)
                return
        names = {topic.name for topic in stored}
        names.update(name for name in host.topics if match is None or match(name))
        listing = Listing(
            text or None,
            stored,
            sorted(names),
            _count_cursors(host.cursors),
            host.groups.count_by_topic() if host.groups is not None else {},
            now,
        )
        kept.clear()  # (one listing kept per connection: the latest)
        kept[text] = listing
    if protocol.closed:
        return
    done = listing

    def row_of(index: int) -> Row:
        name = done.names[index]
        row = _topic_row(name, done.stored.get(name), host.topics.get(name), host.logs)
        row["cursors"] = done.cursors.get(name, 0)
        row["groups"] = done.groups.get(name, 0)
        return row

    _answer_rows(protocol, request, listing.names, row_of, arguments)


def _topic_row(
    name: str, stored: StoredTopic | None, topic: Topic | None, logs: TopicLogs | None
) -> Row:
    """One ``topics`` row: exact from an open log, else as the files say."""
    first = end = size = terms = appended = None
    is_open = False
    topic_log = topic.log if topic is not None and not topic.forwarded else None
    if topic_log is None and logs is not None:
        topic_log = logs.opened(name)  # (open with no actor: its checkpoint may lag)
    if topic_log is not None and not topic_log.closed:
        is_open = True
        end = topic_log.written_offset + 1
        first = min(topic_log.first_offset, end)
    elif stored is not None:
        first, end = stored.first, stored.end
    if stored is not None:
        size, terms, appended = stored.bytes, stored.terms, stored.last_append_ms
    config: LogConfig | None = logs.config_of(name) if logs is not None else None
    return {
        "topic": name,
        "first": first,
        "end": end,
        "records": None if first is None or end is None else end - first,
        "bytes": size,
        "terms": terms,
        "last_append_ms": appended,
        "open": is_open,
        "subscribers": 0 if topic is None else len(topic.subscriptions),
        "retention_bytes": None if config is None else config.retain_bytes,
        "retention_ms": (
            None
            if config is None or config.retain_seconds is None
            else int(config.retain_seconds * 1000)
        ),
        "when_full": None if config is None else config.when_full,
        "flush": None if config is None else config.flush,
    }


def _cursor_parts(key: str) -> tuple[str, str, str] | None:
    parts = key.split("\x00")
    return (parts[0], parts[1], parts[2]) if len(parts) == 3 else None


def _count_cursors(cursors: CursorBook | None) -> dict[str, int]:
    counts: dict[str, int] = {}
    for key, _ in cursors.items() if cursors is not None else ():
        parts = _cursor_parts(key)
        if parts is not None:
            counts[parts[1]] = counts.get(parts[1], 0) + 1
    return counts


def _cursor_rows(host: AdminHost, pattern: TopicPattern | None) -> list[tuple[str, Row]]:
    """The durable cursors (of topics ``pattern`` matches), sorted by topic,
    cursor and principal."""
    rows: list[tuple[str, Row]] = []
    for key, position in host.cursors.items() if host.cursors is not None else ():
        parts = _cursor_parts(key)
        if parts is None:
            continue
        principal, topic, cursor = parts
        if pattern is not None and not pattern.matches(topic):
            continue
        lag: int | None = None
        open_topic = host.topics.get(topic)
        if open_topic is not None and open_topic.log is not None and not open_topic.log.closed:
            lag = max(0, open_topic.log.written_offset + 1 - position)
        row: Row = {
            "topic": topic,
            "cursor": cursor,
            "principal": principal or None,
            "position": position,
            "lag": lag,
        }
        rows.append(("\x00".join((topic, cursor, principal)), row))
    rows.sort(key=lambda item: item[0])
    return rows


def _group_rows(host: AdminHost, pattern: TopicPattern | None) -> list[tuple[str, Row]]:
    """The consumer groups (of topics ``pattern`` matches), sorted by topic,
    group and principal: kept in the journal, with a live group's figures."""
    groups = host.groups
    rows: list[tuple[str, Row]] = []
    for principal, topic, name, floor in groups.stored() if groups is not None else ():
        if pattern is not None and not pattern.matches(topic):
            continue
        row: Row = {
            "topic": topic,
            "group": name,
            "principal": principal or None,
            "members": 0,
            "floor": floor,
            "lag": None,
            "outstanding": None,
        }
        assert groups is not None
        live = groups.groups.get("\x00".join((principal, topic, name)))
        if live is not None:
            figures = live.statistics()
            row.update(
                members=figures["members"],
                floor=figures["floor"],
                lag=figures["lag"],
                outstanding=figures["outstanding"],
            )
        rows.append(("\x00".join((topic, name, principal)), row))
    rows.sort(key=lambda item: item[0])
    return rows


def _delete_group(
    host: AdminHost, arguments: Mapping[str, AdminValue], principal: str | None
) -> Row:
    """Forget a consumer group without members (Kafka's delete-groups: a
    group with members is refused)."""
    topic = _topic(arguments)
    _owned(host, topic)
    name = arguments.get("group")
    if not isinstance(name, str) or topic_name_problem(name) is not None:
        raise AdminError(AdminStatus.REFUSED, '"group" must be a group\'s name')
    owner = arguments.get("principal", principal)
    if owner is not None and not isinstance(owner, str):
        raise AdminError(AdminStatus.REFUSED, '"principal" must be text')
    if host.groups is None:
        raise AdminError(AdminStatus.REFUSED, "this broker keeps no topic log: it has no groups")
    try:
        members = host.groups.forget(owner or "", topic, name)
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


def _delete_topic(host: AdminHost, name: str) -> Row:
    """Delete topic ``name``: its subscriptions end, its cursors and groups
    are forgotten, its log removed (see the module)."""
    _owned(host, name)
    logs = host.logs
    topic = host.topics.get(name)
    stored = _stored(logs, name)
    if topic is None and stored is None:
        raise AdminError(AdminStatus.REFUSED, f"no topic {name[:64]!r}")
    records = size = 0
    if stored is not None:
        records, size = stored.end - stored.first, stored.bytes
    if topic is not None and topic.log is not None and not topic.log.closed:
        records = topic.log.next_offset - topic.log.first_offset
    host.patterns.topic_deleted(name)  # (pattern members: a Matched that unbinds it)
    ended = 0
    if topic is not None:
        for subscription in list(topic.subscriptions):
            _end(host, subscription)
            ended += 1
    groups = host.groups.forget_topic(name) if host.groups is not None else 0
    cursors = 0
    book = host.cursors
    if book is not None:
        for key, _ in book.items():
            parts = _cursor_parts(key)
            if parts is not None and parts[1] == name:
                book.delete(key)
                cursors += 1
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
            host.patterns.topic_made(name)
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


def _end(host: AdminHost, subscription: Subscription) -> None:
    """End ``subscription`` of a deleted topic: its client is told (a
    FreeHandle now, or, for a session whose connection is down, the
    subscription missing from the ``Welcome`` of its resume), and its
    session forgets it (its record too: a restart does not bring it back)."""
    for session in host.sessions.sessions.values():
        if session.subscriptions.get(subscription.handle) is subscription:
            if session.connection is None:
                session.subscriptions.pop(subscription.handle, None)
                if session.state is not None:
                    session.state.subscriptions.pop(subscription.handle, None)
                    if host.session_records is not None:
                        host.session_records.save(session, session.state, session.subscriptions)
            break
    connection = subscription.connection
    if isinstance(connection, Deliveries) and (
        connection.subscriptions.get(subscription.handle) is subscription
    ):
        connection.end(subscription.handle)
    else:
        subscription.close()


def _purge_topic(host: AdminHost, name: str, before: int) -> Row:
    """Delete the records of ``name`` before offset ``before``; readers
    behind it are told with a Gap as they read on."""
    _owned(host, name)
    if host.logs is None:
        raise AdminError(AdminStatus.REFUSED, "this broker keeps no topic log: nothing to purge")
    known = name in host.topics or _stored(host.logs, name) is not None
    if not known:
        raise AdminError(AdminStatus.REFUSED, f"no topic {name[:64]!r}")
    topic = host.topic(name)
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
    host: AdminHost, arguments: Mapping[str, AdminValue], principal: str | None
) -> Row:
    """Forget a durable cursor (its subscription, if one is live, stores
    it again at its next Ack)."""
    topic = _topic(arguments)
    cursor = arguments.get("cursor")
    if not isinstance(cursor, str) or topic_name_problem(cursor) is not None:
        raise AdminError(AdminStatus.REFUSED, '"cursor" must be a cursor\'s name')
    owner = arguments.get("principal", principal)
    if owner is not None and not isinstance(owner, str):
        raise AdminError(AdminStatus.REFUSED, '"principal" must be text')
    book = host.cursors
    if book is None or not book.delete(cursor_key(owner, topic, cursor)):
        whose = f" of principal {owner!r}" if owner else ""
        raise AdminError(
            AdminStatus.REFUSED, f"no cursor {cursor[:64]!r} of topic {topic[:64]!r}{whose}"
        )
    return {"topic": topic, "cursor": cursor, "deleted": True}
