"""Answering ``ListOffsets``: the first and next offsets of topic logs, read
from the data directory without making a topic (what a reader such as
Spark's source plans its reads with, as Kafka's ``ListOffsets``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from broker.protocol import Connection, ListOffsets, Offsets, TopicOffsets
from broker.protocol.frames import encode

from ._store import TopicStore
from ._topic_logs import TopicLogs

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


def _offsets(topic_log: TopicStore) -> tuple[int, int]:
    """``(first, end)`` of an open log: the first record kept, and one past
    the last record written (what a reader can read now; both equal for an
    empty log)."""
    end = topic_log.written_offset + 1
    return min(topic_log.first_offset, end), end


def _reply(
    protocol: Connection, request: int, names: list[str], known: dict[str, tuple[int, int]]
) -> None:
    """Send the ``Offsets`` of ``names`` (sorted), or, if they would not fit
    in one frame, nothing and the line that says to ask for fewer."""
    entries: list[TopicOffsets] = [(name, *known[name]) for name in names]
    if len(encode(Offsets(request, entries))) > protocol.peer_max_frame:
        protocol.offsets(
            request,
            [],
            f"the offsets of {len(entries)} topics do not fit in one frame: ask for fewer topics",
        )
    else:
        protocol.offsets(request, entries)


class Survey:
    """An answer that waits for logs not opened since the start: their files
    are read in a thread, one log at a time (a log of large terms takes a
    fraction of a second to scan; the event loop goes on meanwhile), without
    opening them. A log that opens meanwhile is answered from memory."""

    def __init__(
        self,
        logs: TopicLogs,
        protocol: Connection,
        request: int,
        names: list[str],
        known: dict[str, tuple[int, int]],
    ) -> None:
        self._logs = logs
        self._protocol = protocol
        self._request = request
        self._names = names
        self._known = known

    async def answer(self) -> None:
        """Read what is missing, then send the answer (nothing if the
        connection closed meanwhile). Raises :class:`TopicUnavailable` if
        a log cannot be read."""
        logs = self._logs
        for name in self._names:
            if name in self._known or self._protocol.closed:
                continue
            topic_log = logs.opened(name)
            if topic_log is None:
                first, end = await logs.survey(name)
                # Opened while its files were read: the open log is newer.
                topic_log = logs.opened(name)
                self._known[name] = (min(first, end), end)
            if topic_log is not None:
                self._known[name] = _offsets(topic_log)
        if not self._protocol.closed:
            _reply(self._protocol, self._request, self._names, self._known)


def answer_list_offsets(
    host: OffsetsHost, protocol: Connection, may_read: Callable[[str], bool], event: ListOffsets
) -> str | Survey | None:
    """Send the ``Offsets`` answering ``event`` (entries sorted by name: the
    named topics that have a log, or, none named, every topic with a log
    that ``may_read`` allows); returns why the client may not ask instead
    (a named topic it may not subscribe to: Goodbye 6), sending nothing,
    or the :class:`Survey` to await when logs not yet open must be read
    first. An answer that would not fit in one frame lists nothing and says
    so (name fewer topics). On a worker of several, a named topic another
    worker owns is answered with nothing and the line that says where to
    ask; unnamed, only the topics this worker owns are listed. Raises
    :class:`TopicUnavailable` if the data directory cannot be listed."""
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
    stored = set(logs.stored_topics())
    names = sorted(stored if event.topics is None else stored.intersection(event.topics))
    if event.topics is None:
        names = [name for name in names if may_read(name) and not host.not_owned(name)]
    known: dict[str, tuple[int, int]] = {}
    for name in names:
        topic_log = logs.opened(name)
        if topic_log is not None:
            known[name] = _offsets(topic_log)
    if len(known) < len(names):
        return Survey(logs, protocol, event.request, names, known)
    _reply(protocol, event.request, names, known)
    return None
