"""Answering ``ListOffsets``: the first and next offsets of topic logs, read
from the data directory without making a topic (what a reader such as
Spark's source plans its reads with, as Kafka's ``ListOffsets``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from broker.protocol import Connection, ListOffsets, Offsets, TopicOffsets, encode

from ._logs import TopicLogs

#: The reason of an Offsets that lists nothing because the broker keeps no log.
NO_LOGS = "this broker keeps no topic log (it has no data directory): there are no offsets"


class OffsetsHost(Protocol):
    """What answering needs of the broker: its topic logs."""

    @property
    def logs(self) -> TopicLogs | None:
        """The topic logs (None: a memory-only broker)."""
        ...

    def not_owned(self, topic: str) -> str | None:
        """Why another worker answers for ``topic`` (None: this one does)."""
        ...


def topic_offsets(
    logs: TopicLogs, names: list[str] | None, may_read: Callable[[str], bool]
) -> list[TopicOffsets]:
    """``(name, first, end)`` of the named topics that have a log (None: of
    every topic with a log that ``may_read`` allows), sorted by name.
    ``first`` is the first record kept, ``end`` one past the last record
    written (what a reader can read now; both equal for an empty log).
    Raises :class:`~._logs.TopicUnavailable` if a log cannot be opened, or
    the data directory listed."""
    stored = set(logs.stored_topics())
    wanted = sorted(stored if names is None else stored.intersection(names))
    entries: list[TopicOffsets] = []
    for name in wanted:
        if names is None and not may_read(name):
            continue
        topic_log = logs.open(name)
        end = topic_log.written_offset + 1
        entries.append((name, min(topic_log.first_offset, end), end))
    return entries


def answer_list_offsets(
    host: OffsetsHost, protocol: Connection, may_read: Callable[[str], bool], event: ListOffsets
) -> str | None:
    """Send the ``Offsets`` answering ``event``; returns why the client may not
    ask instead (a named topic it may not subscribe to: Goodbye 6), sending
    nothing. An answer that would not fit in one frame lists nothing and
    says so (name fewer topics). On a worker of several, a named topic
    another worker owns is answered with nothing and the line that says
    where to ask; unnamed, only the topics this worker owns are listed."""
    if event.topics is not None:
        for name in event.topics:
            if not may_read(name):
                return f"may not read the offsets of {name[:64]!r}"
    if protocol.closed:
        return None
    logs = host.logs
    if logs is None:
        protocol.offsets(event.request, [], NO_LOGS)
        return None
    if event.topics is not None:
        for name in event.topics:
            if (elsewhere := host.not_owned(name)) is not None:
                protocol.offsets(event.request, [], elsewhere)  # (its log is the owner's)
                return None
    entries = topic_offsets(
        logs, event.topics, lambda name: may_read(name) and not host.not_owned(name)
    )
    reply = Offsets(event.request, entries)
    if len(encode(reply)) > protocol.peer_max_frame:
        protocol.offsets(
            event.request,
            [],
            f"the offsets of {len(entries)} topics do not fit in one frame: ask for fewer topics",
        )
    else:
        protocol.offsets(event.request, entries)
    return None
