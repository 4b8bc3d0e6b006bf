"""Sessions that survive a broker restart: their records in the state journal.

A broker with a data directory writes, for each live session, what a
resume after a restart needs (space ``sessions``): its client name and
principal, its bound topic handles (and stages), its reliable
subscriptions, the next handles; and (space ``session.counts``), per topic
handle, the publishes routed into the topic logs, and per subscription, the
last offset the client processed. Everything is written before any Confirm
that relies on it is sent (``Broker.persist_state``), so a client never
hears "confirmed" of a publish whose session record a crash could take back.

At start-up :func:`load_sessions` reads them back; the broker restores each
as a detached session, which waits ``lease`` seconds for its client, as
after a broken connection. Its reliable subscriptions continue from the
topic log after their last acknowledged offset; lossy and latest ones (whose
queues lived in memory) do not survive, and the resume's Welcome says so.
After a restart a session's ``received`` counts are what reached the logs:
the counts written here, raised to what the publish marks say the logs hold
(``_publish_marks``: a publish appended and not yet confirmed when the
broker died) and what the staging area holds (``_staging``); the client
publishes only the rest again, so none is stored twice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from broker.log import StateJournal
from broker.protocol import DeliveryMode, Stage
from broker.protocol.connection import BrokerSessionState, SubscriptionInfo

from ..storage._publish_marks import PublishMarks

SESSIONS = "sessions"
COUNTS = "session.counts"


class RecordedSession(Protocol):
    """What a record names of a session."""

    @property
    def id(self) -> bytes: ...

    @property
    def client_name(self) -> str: ...

    @property
    def principal(self) -> str | None: ...


class Acked(Protocol):
    """A subscription, as its record sees it."""

    @property
    def acked(self) -> int:
        """The last sequence number (offset) its client processed."""
        ...

    @property
    def restorable(self) -> bool:
        """Whether the record keeps it (see ``Subscription.restorable``)."""
        ...

    def recorded_options(self, given: Mapping[str, object]) -> Mapping[str, object]:
        """The options to restore it with (its Subscribe's, ``given``, or more)."""
        ...


@dataclass(slots=True)
class SavedSession:
    """A session as the journal had it: enough to restore it detached."""

    id: bytes
    client_name: str
    principal: str | None
    state: BrokerSessionState
    #: Per reliable subscription handle: the last offset processed.
    acked: dict[int, int] = field(default_factory=dict)


class RecordCopies(Protocol):
    """Where cluster mode keeps a copy of the records (``_cluster_records``)."""

    @property
    def generation(self) -> int:
        """The last record write's generation."""
        ...

    def stored(self, session: str) -> bool:
        """Whether session ``session``'s writes that others wait for (its
        record; a staged channel's count) are kept as last asked."""
        ...

    def when_stored(self, session: str, wake: Callable[[], None]) -> None:
        """Call ``wake()`` once the next of its writes is kept."""
        ...

    def save(self, session: str, record: object) -> None: ...

    def routed(self, session: str, handle: int, count: int, *, strict: bool = False) -> None:
        """``count`` publishes of topic handle ``handle`` are routed (written
        lazily; ``strict``: what relies on it waits, as for the record)."""
        ...

    def acked(self, session: str, handle: int, offset: int) -> None: ...

    def forget(self, session: str) -> None: ...

    def let_go(self, session: str) -> None: ...


class SessionRecords:
    """Writes sessions' records into a :class:`~broker.log.StateJournal`
    (buffered there: ``Broker.persist_state`` writes them out); in cluster
    mode into the cluster's copies instead (:attr:`copies`: the journal's
    would never be read, a front end claims sessions from the cluster)."""

    def __init__(self, journal: StateJournal, marks: PublishMarks | None = None) -> None:
        self.journal = journal
        #: The marks of the sessions' publishes in the logs (deleted with them).
        self.marks = marks
        #: Cluster mode: the copies in the cluster (what a reply relying on a
        #: record waits for; None: the journal is all).
        self.copies: RecordCopies | None = None
        #: Per session id: the count keys written (deleted with the session).
        self._keys: dict[bytes, set[str]] = {}

    def save(
        self,
        session: RecordedSession,
        state: BrokerSessionState,
        subscriptions: Mapping[int, Acked],
    ) -> None:
        """Record ``session``'s handles (``state``) and its subscriptions' positions."""
        reliable = {
            handle: info
            for handle, (info, _) in state.subscriptions.items()
            if info.mode == DeliveryMode.RELIABLE
            and (sub := subscriptions.get(handle)) is not None
            and sub.restorable
        }
        record = {
            "client": session.client_name,
            "principal": session.principal,
            "topics": [[h, name, size] for h, (name, size) in state.topics.items()],
            "subscriptions": [
                [
                    h,
                    info.topic,
                    info.topic_name,
                    info.mode,
                    dict(subscriptions[h].recorded_options(info.options)),
                    size,
                ]
                for h, (info, size) in state.subscriptions.items()
                if h in reliable
            ],
            "next": [state.next_topic, state.next_subscription],
            "stages": [[h, s.batch, s.member] for h, s in state.stages.items()],
        }
        sid = session.id.hex()
        if self.copies is None:
            self.journal.put(SESSIONS, sid, record)
        else:  # (cluster mode: the cluster's copy is the one a resume reads)
            self.copies.save(sid, record)
        keys = self._keys.get(session.id, ())
        for handle in reliable:
            if f"{sid}/s/{handle}" not in keys:  # a new subscription: where it starts
                self.acked(session, handle, subscriptions[handle].acked)

    def routed(
        self, session: RecordedSession, handle: int, count: int, *, strict: bool = False
    ) -> None:
        """``count`` publishes on topic ``handle`` are in the logs (or staged;
        ``strict``: in cluster mode what relies on it waits for the
        cluster's copy, see ``RecordCopies.routed``)."""
        key = f"{session.id.hex()}/p/{handle}"
        self._keys.setdefault(session.id, set()).add(key)
        if self.copies is None:
            self.journal.put(COUNTS, key, count)
        else:
            self.copies.routed(session.id.hex(), handle, count, strict=strict)

    def acked(self, session: RecordedSession, handle: int, offset: int) -> None:
        """The client processed subscription ``handle`` up to ``offset``."""
        key = f"{session.id.hex()}/s/{handle}"
        self._keys.setdefault(session.id, set()).add(key)
        if self.copies is None:
            self.journal.put(COUNTS, key, offset)
        else:
            self.copies.acked(session.id.hex(), handle, offset)

    def forget(self, session: RecordedSession) -> None:
        """``session`` ended: delete its records."""
        self.journal.delete(SESSIONS, session.id.hex())
        if self.copies is not None:
            self.copies.forget(session.id.hex())
        if self.marks is not None:
            self.marks.forget(session.id)
        for key in self._keys.pop(session.id, ()):
            self.journal.delete(COUNTS, key)

    def let_go(self, session: RecordedSession) -> None:
        """This broker stops holding ``session``, which lives on elsewhere
        (cluster mode: another front end took it, or resumes it): its
        records here are deleted, its copies in the cluster stay."""
        sid = session.id.hex()
        self.journal.delete(SESSIONS, sid)
        if self.marks is not None:
            self.marks.forget(session.id)
        for key in self._keys.pop(session.id, ()):
            self.journal.delete(COUNTS, key)
        if self.copies is not None:
            self.copies.let_go(sid)

    def forget_all(self, sessions: Iterable[RecordedSession]) -> None:
        for session in sessions:
            self.forget(session)


def forget_sessions(journal: StateJournal) -> None:
    """Delete every session record and count of ``journal`` (cluster mode:
    the cluster's copies are the ones that count)."""
    for space in (SESSIONS, COUNTS):
        for key, _ in journal.items(space):
            journal.delete(space, key)


def load_sessions(records: SessionRecords) -> list[SavedSession]:
    """The sessions the journal holds (malformed records are skipped, and dropped)."""
    journal = records.journal
    counts: dict[str, dict[str, int]] = {}
    for key, value in journal.items(COUNTS):
        sid, _, rest = key.partition("/")
        if type(value) is int:
            counts.setdefault(sid, {})[rest] = value
    saved = []
    for sid, record in journal.items(SESSIONS):
        try:
            session = decode_session(sid, record, counts.get(sid, {}))
        except (TypeError, ValueError, KeyError, IndexError):
            journal.delete(SESSIONS, sid)
            continue
        records._keys[session.id] = {f"{sid}/{rest}" for rest in counts.get(sid, {})}
        saved.append(session)
    for sid in counts.keys() - {s.id.hex() for s in saved}:
        for rest in counts[sid]:
            journal.delete(COUNTS, f"{sid}/{rest}")
    return saved


def decode_session(sid: str, record: Any, counts: dict[str, int]) -> SavedSession:
    """The session of record ``record`` (``sid``: its id in hex) and its
    ``counts`` (``p/<handle>``, ``s/<handle>``); raises TypeError,
    ValueError, KeyError or IndexError if it is malformed."""
    topics = {int(h): (str(name), int(size)) for h, name, size in record["topics"]}
    subscriptions = {
        int(h): (
            SubscriptionInfo(
                None if topic is None else int(topic), str(name), str(mode), dict(options)
            ),
            int(size),
        )
        for h, topic, name, mode, options, size in record["subscriptions"]
    }
    received = {h: counts.get(f"p/{h}", 0) for h in topics}
    next_topic, next_subscription = (int(n) for n in record["next"])
    stages = {int(h): Stage(str(batch), str(member)) for h, batch, member in record["stages"]}
    state = BrokerSessionState(
        topics, subscriptions, next_topic, next_subscription, received, stages
    )
    acked = {h: counts[f"s/{h}"] for h in subscriptions if f"s/{h}" in counts}
    principal = record["principal"]
    return SavedSession(
        bytes.fromhex(sid),
        str(record["client"]),
        None if principal is None else str(principal),
        state,
        acked,
    )
