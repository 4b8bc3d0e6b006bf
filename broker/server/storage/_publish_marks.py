"""Where each publisher's publishes went in the topic logs: the marks that
let a broker restarted after a crash know every publish its logs hold, so
that a client's resend of them is confirmed and not stored again.

Every publish of a session is known by its origin: the session id, its
topic handle and its index on that handle (from 1, counted over the
session's life: what ``Welcome.received`` counts; see
``broker.protocol._origins``). Before a topic appends a run of publishes to
its log, it puts the run's mark in the state journal and writes the journal:
space ``publish.marks``, key ``<session hex>/<handle>``, value ``[topic,
first index, first offset, count]`` (the run's publishes go to the log from
``first offset`` on). Only the latest run of each (session, handle) is
kept, as the log is appended in order.

The journal is written before the log's own write, so a ``kill -9`` that
leaves a run's records in the log leaves its mark too. After a restart,
a mark says the highest index of its origin that the log holds: ``first -
1 + min(count, end - offset)``, where ``end`` is the log's next offset
after recovery (resolved when the log is first opened: a restart opens no
log for this). A log that ends before the run's offset
(a power cut took more than the last run) tells nothing of it: the
session record's count (written before each Confirm) stands.

Marks are deleted with their session (:meth:`forget`), or, for publishes
another worker forwarded, when the owner's table of them forgets the origin
(``SeenOrigins``): the journal holds at most one mark per live session
handle plus that table's bound.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from broker.log import StateJournal
from broker.protocol import OriginRun
from broker.protocol.connection import BrokerSessionState

__all__ = ["MARKS", "Held", "PublishMarks", "held_publishes"]

#: The journal space of the marks.
MARKS = "publish.marks"


@dataclass(frozen=True, slots=True)
class Held:
    """What a topic's log holds of one origin (session, handle)."""

    topic: str
    #: The index of the last of its publishes in the log.
    index: int


def _key(session: bytes, handle: int) -> str:
    return f"{session.hex()}/{handle}"


def _parse(key: str, value: object) -> tuple[bytes, int, str, int, int, int] | None:
    """A mark's (session, handle, topic, first, offset, count); None if malformed."""
    session_hex, _, handle_text = key.partition("/")
    try:
        session = bytes.fromhex(session_hex)
        handle = int(handle_text)
    except ValueError:
        return None
    if not isinstance(value, list) or len(value) != 4 or not session:
        return None
    topic, first, offset, count = value
    if type(topic) is not str:
        return None
    numbers = (first, offset, count)
    if any(type(n) is not int or n < 1 for n in numbers):
        return None
    return session, handle, topic, first, offset, count


class PublishMarks:
    """The marks of the runs appended to the topic logs (see the module).

    After :meth:`load`, a mark is resolved when its topic's log is first
    opened (:meth:`opened`: its end then is what recovery left, before
    anything new is appended), and taken once by whoever needs it: the
    session resuming (:meth:`held`), or the table of forwarded origins."""

    def __init__(self, journal: StateJournal) -> None:
        self.journal = journal
        #: Per session id: its handles with a mark (deleted with the session).
        self._handles: dict[bytes, set[int]] = {}
        self._count = 0
        #: Marks loaded whose log was not opened yet: per topic, per
        #: (session, handle), ``(first, offset, count)``.
        self._pending: dict[str, dict[tuple[bytes, int], tuple[int, int, int]]] = {}
        #: The topic of each of those.
        self._where: dict[tuple[bytes, int], str] = {}
        #: Marks resolved and not taken yet.
        self._held: dict[tuple[bytes, int], Held] = {}

    def __len__(self) -> int:
        """Marks in the journal."""
        return self._count

    def note(self, topic: str, runs: list[OriginRun], offset: int) -> None:
        """Put the marks of ``runs``, whose publishes go to ``topic``'s log
        one after the other from ``offset`` (a run without a session has
        none); the caller writes the journal before it writes the log."""
        put = self.journal.put
        for session, handle, first, count in runs:
            if session:
                put(MARKS, _key(session, handle), [topic, first, offset, count])
                self._add(session, handle)
            offset += count

    def _add(self, session: bytes, handle: int) -> None:
        handles = self._handles.get(session)
        if handles is None:
            self._handles[session] = {handle}
            self._count += 1
        elif handle not in handles:
            handles.add(handle)
            self._count += 1

    def forget(self, session: bytes) -> None:
        """``session`` ended: delete its marks (written with the next write)."""
        for handle in list(self._handles.get(session, ())):
            self.forget_origin(session, handle)

    def forget_origin(self, session: bytes, handle: int) -> None:
        """Delete the mark of one origin (its table entry was forgotten)."""
        handles = self._handles.get(session)
        if handles is not None and handle in handles:
            handles.discard(handle)
            self._count -= 1
            if not handles:
                del self._handles[session]
        self._held.pop((session, handle), None)
        topic = self._where.pop((session, handle), None)
        if topic is not None:
            self._pending[topic].pop((session, handle), None)
        self.journal.delete(MARKS, _key(session, handle))

    # ---------------------------------------------------------------- start-up

    def load(self) -> list[tuple[str, bytes, int]]:
        """Read the marks the journal holds (a malformed one is deleted,
        never a crash); returns their (topic, session, handle)."""
        loaded = []
        for key, value in self.journal.items(MARKS):
            mark = _parse(key, value)
            if mark is None:
                self.journal.delete(MARKS, key)
                continue
            session, handle, topic, first, offset, count = mark
            self._pending.setdefault(topic, {})[(session, handle)] = (first, offset, count)
            self._where[(session, handle)] = topic
            self._add(session, handle)
            loaded.append((topic, session, handle))
        return loaded

    def opened(self, topic: str, end: int) -> None:
        """``topic``'s log was opened for the first time since :meth:`load`,
        its next offset ``end``: resolve its marks. A run the log does not
        reach says nothing (nothing of it, nor maybe of the runs before it,
        is there): its mark is deleted, and the session record's count stands."""
        pending = self._pending.pop(topic, None)
        if not pending:
            return
        for (session, handle), (first, offset, count) in pending.items():
            del self._where[(session, handle)]
            if end < offset:
                self.forget_origin(session, handle)
            else:
                self._held[(session, handle)] = Held(topic, first - 1 + min(count, end - offset))

    def restored(self, topic: str, held: dict[tuple[bytes, int], int]) -> None:
        """Cluster mode: ``topic``'s stream, as restored, holds the
        publishes of each origin in ``held`` up to that index (its runs say
        whose publishes they are). That is exact where a mark may not be
        (a front end appends to its cache before the stream stores the run,
        so its latest mark can be ahead of the stream, and the mark before
        it is gone): it resolves the marks of those origins the journal
        knows, before :meth:`opened` resolves the others. Call it first."""
        pending = self._pending.get(topic, {})
        for key, index in held.items():
            if key[1] not in self._handles.get(key[0], ()):
                continue  # (its session is gone: nothing will resume it)
            pending.pop(key, None)
            self._where.pop(key, None)
            self._held[key] = Held(topic, index)

    def pending(self, session: bytes, handle: int) -> bool:
        """Whether a mark of (``session``, ``handle``) waits to be resolved or taken."""
        return (session, handle) in self._held or (session, handle) in self._where

    def held(self, session: bytes, handle: int) -> Held | None:
        """What the log held of (``session``, ``handle``) at the start, once
        (resolved: its log was opened); None if nothing is known."""
        return self._held.pop((session, handle), None)


def held_publishes(
    marks: PublishMarks,
    session: bytes,
    state: BrokerSessionState,
    log_end: Callable[[str], int | None],
) -> None:
    """A session restored after a stop resumes: raise its publish counts in
    ``state`` to what the logs held of its publishes at the start (its
    publish marks: a publish appended but not confirmed before a crash), so
    its client sends again only what no log has. ``log_end`` opens a topic's
    log (which resolves its marks)."""
    for handle, (name, _) in state.topics.items():
        if marks.pending(session, handle):
            log_end(name)
            held = marks.held(session, handle)
            if held is not None and held.topic == name:
                state.received[handle] = max(state.received.get(handle, 0), held.index)
