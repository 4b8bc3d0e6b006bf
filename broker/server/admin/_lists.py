"""What topic administration lists: the answers of ``topics``,
``cursors`` and ``groups`` (rows made per page, paged by ``"after"``),
read of the broker's services (its topic directory, storage and
sessions), and the :class:`AdminError` that ``_requests`` (the requests
that change things) shares.

``topics`` lists every topic the broker keeps, opened or only on disk: the
data directory is listed in a thread, reading each topic's directory and
marks, never opening a log (see ``broker.log.list_stored_topics``), and
the logs open here give their exact figures; the listing of a first page
is kept for the pages after it (:class:`Listing`).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence

import cbor2
import trio

from broker.log import LogConfig, StoredTopic
from broker.protocol import AdminStatus, AdminValue, Connection, TopicPattern

from .._services import BrokerServices
from ..storage._topic_logs import TopicLogs
from ..topics._log_subscription import CursorBook
from ..topics._topic import Topic

#: Bytes of a frame an answer's head and ``next`` may take (the rest: rows).
ANSWER_SLACK = 512
#: How long (seconds) a connection's topic listing serves the pages after it.
LISTING_KEPT = 10.0

Row = dict[str, AdminValue]


class AdminError(Exception):
    """The request is answered with ``status`` and this one line, nothing done."""

    def __init__(self, status: AdminStatus, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def answer_rows(
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


async def list_topics(
    services: BrokerServices,
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
        logs = services.storage.logs
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
        names.update(name for name in services.topics.topics if match is None or match(name))
        listing = Listing(
            text or None,
            stored,
            sorted(names),
            _count_cursors(services.storage.cursors),
            services.storage.groups.count_by_topic() if services.storage.groups is not None else {},
            now,
        )
        kept.clear()  # (one listing kept per connection: the latest)
        kept[text] = listing
    if protocol.closed:
        return
    done = listing

    def row_of(index: int) -> Row:
        name = done.names[index]
        row = _topic_row(
            name, done.stored.get(name), services.topics.topics.get(name), services.storage.logs
        )
        row["cursors"] = done.cursors.get(name, 0)
        row["groups"] = done.groups.get(name, 0)
        return row

    answer_rows(protocol, request, listing.names, row_of, arguments)


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


def cursor_parts(key: str) -> tuple[str, str, str] | None:
    parts = key.split("\x00")
    return (parts[0], parts[1], parts[2]) if len(parts) == 3 else None


def _count_cursors(cursors: CursorBook | None) -> dict[str, int]:
    counts: dict[str, int] = {}
    for key, _ in cursors.items() if cursors is not None else ():
        parts = cursor_parts(key)
        if parts is not None:
            counts[parts[1]] = counts.get(parts[1], 0) + 1
    return counts


def cursor_rows(services: BrokerServices, pattern: TopicPattern | None) -> list[tuple[str, Row]]:
    """The durable cursors (of topics ``pattern`` matches), sorted by topic,
    cursor and principal."""
    rows: list[tuple[str, Row]] = []
    for key, position in (
        services.storage.cursors.items() if services.storage.cursors is not None else ()
    ):
        parts = cursor_parts(key)
        if parts is None:
            continue
        principal, topic, cursor = parts
        if pattern is not None and not pattern.matches(topic):
            continue
        lag: int | None = None
        open_topic = services.topics.topics.get(topic)
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


def group_rows(services: BrokerServices, pattern: TopicPattern | None) -> list[tuple[str, Row]]:
    """The consumer groups (of topics ``pattern`` matches), sorted by topic,
    group and principal: kept in the journal, with a live group's figures."""
    groups = services.storage.groups
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
