"""Session records kept in the cluster (cluster mode): a front end on any
disk resumes the sessions another one served.

In cluster mode each session's record (its handles, reliable
subscriptions and stages: see ``_records``) is written to a KV bucket of
the JetStream cluster as well as to the front end's own journal, and
nothing that relies on it reaches the client before the bucket holds it:
the connection's output waits until :meth:`ClusterRecords.stored` says
so (a Bind's answer, for instance, waits for the record that has its
handle). Each connection waits for its own session's record only.

The positions a session's client processed (``acked``) follow lazily, at
most :data:`LAZY_DELAY` seconds behind: a front end killed in between
delivers those records again (at least once, as a consumer whose position
is committed after processing sees). What a session published is not kept
here: every run in a topic's stream names its publishes' origins, and a
restore raises the session's counts to them (``storage._publish_marks``),
so a resend is never stored twice.

Every write is a compare-and-set on the key's last revision: a front end
whose write is refused has lost the session to another that loaded it since
(a front end paused, and replaced meanwhile); it ends the session there
(``on_taken``) and never writes its keys again.

At start-up :meth:`ClusterRecords.load` reads the bucket into the journal,
in place of the sessions the journal had: the bucket is what clients were
told.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import cbor2
import trio

from broker.backoff import Backoff
from broker.log import StateJournal

from ._records import COUNTS, SESSIONS

__all__ = [
    "LAZY_DELAY",
    "ClusterRecords",
    "RecordBucket",
    "RecordConflict",
    "RecordsUnavailable",
]

log = logging.getLogger("broker.server")

#: Seconds a lazy write (a subscription's position) waits, to be coalesced.
LAZY_DELAY = 0.2
#: Writes to the bucket in flight at once.
MAX_IN_FLIGHT = 64
#: Waits between tries of a write the bucket did not take (seconds).
RETRY_FIRST = 0.05
RETRY_MOST = 2.0

#: Key prefixes in the bucket: a session's record, a subscription's position.
_RECORD = "S."
_ACKED = "A."


class RecordConflict(Exception):
    """A compare-and-set was refused: the key was written by someone else."""


class RecordsUnavailable(Exception):
    """The bucket did not answer (no leader, no connection): try again."""


class RecordBucket(Protocol):
    """Where the records are kept: a key-value bucket with revisions."""

    async def write(self, key: str, value: bytes | None, last_revision: int) -> int:
        """Write ``value`` (None: delete the key) if ``last_revision`` is the
        key's last (0: it has none); the new revision. Raises
        :class:`RecordConflict` if it is not, :class:`RecordsUnavailable` if
        the bucket does not answer."""
        ...

    async def entries(self) -> dict[str, tuple[bytes, int]]:
        """Every key that has a value: its value and revision. Raises
        :class:`RecordsUnavailable`."""
        ...


@dataclass(slots=True)
class _Write:
    """The latest value of a key not written yet (None: a deletion)."""

    value: bytes | None
    #: The generation of the last record write folded in (0: only lazy ones).
    generation: int
    #: When to send it (trio time; lazy writes wait to be coalesced).
    due: float


def record_key(session: str) -> str:
    """The bucket key of session ``session``'s record (its id in hex)."""
    return _RECORD + session


def acked_key(session: str, handle: int) -> str:
    """The bucket key of a subscription's position."""
    return f"{_ACKED}{session}.{handle}"


def _session_of(key: str) -> str:
    return key[len(_RECORD) :].split(".", 1)[0]


class ClusterRecords:
    """The sessions' records in a :class:`RecordBucket` (see the module).

    ``on_taken(session_id)`` is called (synchronously) when another front
    end has taken a session over."""

    def __init__(self, bucket: RecordBucket, on_taken: Callable[[bytes], None]) -> None:
        self.bucket = bucket
        self.on_taken = on_taken
        #: The last generation handed out (one per record write).
        self.generation = 0
        #: Per key: its last revision (written by us, or loaded).
        self._revisions: dict[str, int] = {}
        #: Per session (hex id): the keys of it we wrote or loaded.
        self._keys: dict[str, set[str]] = {}
        #: Writes waiting to be sent, by key (oldest first).
        self._pending: dict[str, _Write] = {}
        #: Keys with a write in flight (one at a time per key: in order).
        self._in_flight: set[str] = set()
        #: Per key: the newest record generation not stored yet.
        self._outstanding: dict[str, int] = {}
        #: Sessions another front end took: never written again.
        self._taken: set[str] = set()
        #: Per record key: who waits for it to be stored.
        self._waiters: dict[str, list[Callable[[], None]]] = {}
        self._wake = trio.Event()
        #: Counters: writes stored, tries the bucket did not answer, sessions taken.
        self.writes = 0
        self.retries = 0
        self.taken = 0

    # ------------------------------------------------------------ the journal's side

    def save(self, session: str, record: object) -> None:
        """Session ``session``'s record changed (a new :attr:`generation`):
        what relies on it waits until :meth:`stored` says so."""
        if session in self._taken:
            return
        self.generation += 1
        key = record_key(session)
        self._keys.setdefault(session, set()).add(key)
        self._put(key, cbor2.dumps(record), self.generation, 0.0)
        self._outstanding[key] = self.generation

    def acked(self, session: str, handle: int, offset: int) -> None:
        """A subscription's position moved (written within :data:`LAZY_DELAY`)."""
        if session in self._taken:
            return
        key = acked_key(session, handle)
        self._keys.setdefault(session, set()).add(key)
        self._put(key, cbor2.dumps(offset), 0, LAZY_DELAY)

    def forget(self, session: str) -> None:
        """Session ``session`` ended: its keys are deleted (those we wrote)."""
        self._taken.discard(session)
        for key in self._keys.pop(session, ()):
            if key in self._revisions or key in self._in_flight:
                self._put(key, None, 0, 0.0)
            else:
                self._pending.pop(key, None)
            self._release(key)

    def _put(self, key: str, value: bytes | None, generation: int, delay: float) -> None:
        old = self._pending.pop(key, None)
        due = trio.current_time() + delay
        if old is not None:
            generation = max(generation, old.generation)
            due = min(due, old.due)
        self._pending[key] = _Write(value, generation, due)
        self._wake.set()

    # ------------------------------------------------------------ waiting

    def stored(self, session: str) -> bool:
        """Whether session ``session``'s record is in the bucket as last
        saved (or another front end took it: nothing waits for it then)."""
        return record_key(session) not in self._outstanding

    def when_stored(self, session: str, wake: Callable[[], None]) -> None:
        """Call ``wake()`` once :meth:`stored` says so."""
        if self.stored(session):
            wake()
        else:
            self._waiters.setdefault(record_key(session), []).append(wake)

    def _release(self, key: str) -> None:
        """``key`` is stored (or given up): wake who waits for it."""
        self._outstanding.pop(key, None)
        for wake in self._waiters.pop(key, ()):
            wake()

    # ------------------------------------------------------------ start-up

    async def load(self, journal: StateJournal) -> int:
        """Replace the journal's session records with the bucket's (and its
        subscriptions' positions: the larger of the two); how many sessions.
        Raises :class:`RecordsUnavailable`."""
        entries = await self.bucket.entries()
        for sid, _ in journal.items(SESSIONS):
            journal.delete(SESSIONS, sid)
        sessions = 0
        for key, (value, revision) in entries.items():
            session = _session_of(key)
            try:
                decoded = cbor2.loads(value)
            except Exception:  # a damaged value: left out, reported
                log.error("cluster session record %s cannot be read: left out", key[:80])
                continue
            self._revisions[key] = revision
            self._keys.setdefault(session, set()).add(key)
            if key.startswith(_RECORD):
                journal.put(SESSIONS, session, decoded)
                sessions += 1
            elif key.startswith(_ACKED) and type(decoded) is int:
                handle = key.rsplit(".", 1)[1]
                count_key = f"{session}/s/{handle}"
                known = journal.get(COUNTS, count_key)
                journal.put(COUNTS, count_key, max(decoded, known if type(known) is int else 0))
        return sessions

    # ------------------------------------------------------------ writing

    async def run(self) -> None:
        """Send the writes, in order per key, up to :data:`MAX_IN_FLIGHT` at
        once, each tried again until the bucket answers; until cancelled."""
        async with trio.open_nursery() as nursery:
            while True:
                now = trio.current_time()
                next_due = math.inf
                for key, write in list(self._pending.items()):
                    if len(self._in_flight) >= MAX_IN_FLIGHT:
                        break
                    if key in self._in_flight:
                        continue
                    if write.due > now:
                        next_due = min(next_due, write.due)
                        continue
                    del self._pending[key]
                    self._in_flight.add(key)
                    nursery.start_soon(self._send, key, write)
                self._wake = trio.Event()
                with trio.move_on_at(next_due):
                    await self._wake.wait()

    async def _send(self, key: str, write: _Write) -> None:
        backoff = Backoff(RETRY_FIRST, RETRY_MOST)
        session = _session_of(key)
        try:
            while session not in self._taken:
                try:
                    revision = await self.bucket.write(
                        key, write.value, self._revisions.get(key, 0)
                    )
                except RecordConflict:
                    self._taken_over(session)
                    return
                except RecordsUnavailable as error:
                    self.retries += 1
                    delay = backoff.next()
                    log.warning(
                        "cluster session records: a write was not answered (%s): "
                        "tried again in %.2f s",
                        error,
                        delay,
                    )
                    await trio.sleep(delay)
                    newer = self._pending.get(key)
                    if newer is not None:  # (folded into the newer one: sent next)
                        newer.generation = max(newer.generation, write.generation)
                        newer.due = trio.current_time()
                        return
                    continue
                self.writes += 1
                if write.value is None:  # (ids are never reused: nothing follows)
                    self._revisions.pop(key, None)
                else:
                    self._revisions[key] = revision
                if self._outstanding.get(key) == write.generation and key not in self._pending:
                    self._release(key)
                return
        finally:
            self._in_flight.discard(key)
            self._wake.set()

    def _taken_over(self, session: str) -> None:
        """Another front end wrote ``session``'s keys: it has the session."""
        self.taken += 1
        self._taken.add(session)
        for key in self._keys.pop(session, ()):
            self._pending.pop(key, None)
            self._revisions.pop(key, None)
            self._release(key)
        log.warning(
            "session %s was taken over by another front end: its connection here ends",
            session[:16],
        )
        self.on_taken(bytes.fromhex(session))

    def statistics(self) -> dict[str, int]:
        """Writes stored, tries not answered, sessions taken over, writes waiting."""
        return {
            "writes": self.writes,
            "retries": self.retries,
            "taken": self.taken,
            "pending": len(self._pending) + len(self._in_flight),
        }
