"""Session records kept in the cluster (cluster mode): any front end
resumes a session another one served.

In cluster mode each session's record (its handles, reliable
subscriptions and stages: see ``_records``) is written to a KV bucket of
the JetStream cluster (not to the front end's journal, which a resume
never reads), and nothing that relies on it reaches the client before
the bucket holds it: the connection's output waits until
:meth:`ClusterRecords.stored` says so (a Bind's answer waits for the
record that has its handle; a staged channel's Confirm for the count
that includes it, since no stream holds staged publishes yet). Each
connection waits for its own session's keys only.

Its publish counts (``routed``) and the positions its client processed
(``acked``) follow lazily, at most :data:`LAZY_DELAY` seconds behind.
A Confirm does not wait for the counts: a front end that resumes the
session raises them to what the topics' streams hold of its publishes
(their runs name their origins; see ``cluster._stored_counts``), which
is at least what its client saw confirmed. A front end killed before a
position is written delivers those records again (at least once, as a
consumer whose position is committed after processing sees).

A front end that is asked to resume a session it does not hold reads the
session's keys (:meth:`ClusterRecords.claim`) and writes each again at the
revision it read: a claim. Every write is a compare-and-set on the key's
last revision, so the front end that held the session before finds its
next write refused: it has lost the session, ends it there (``on_taken``)
and never writes its keys again. Each value names its writer (a front end
run's nonce): a write refused after a try whose answer was lost is known
for its own if the bucket holds exactly what it wrote.

Keys (``<id>``: the session id in hex): ``S.<id>`` (the record),
``P.<id>`` (per topic handle, the publishes routed), ``A.<id>`` (per
subscription handle, the last offset processed); the last two are maps.
"""

from __future__ import annotations

import logging
import math
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import cbor2
import trio

from broker.backoff import Backoff

__all__ = [
    "LAZY_DELAY",
    "ClaimedSession",
    "ClusterRecords",
    "RecordBucket",
    "RecordConflict",
    "RecordsUnavailable",
]

log = logging.getLogger("broker.server")

#: Seconds a lazy write (a subscription's position) waits, to be coalesced.
LAZY_DELAY = 0.2
#: Reads of a session's keys a claim makes while they change under it.
CLAIM_TRIES = 5
#: Writes to the bucket in flight at once.
MAX_IN_FLIGHT = 64
#: Waits between tries of a write the bucket did not take (seconds).
RETRY_FIRST = 0.05
RETRY_MOST = 2.0

#: Key prefixes in the bucket: a session's record, its publish counts, its
#: subscriptions' positions.
_RECORD = "S"
_ROUTED = "P"
_ACKED = "A"


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

    async def session(self, session: str) -> dict[str, tuple[bytes, int]]:
        """Every key of session ``session`` (hex id) that has a value: its
        value and revision, as the bucket's leader has them. Raises
        :class:`RecordsUnavailable`."""
        ...

    async def read(self, key: str) -> tuple[bytes, int] | None:
        """``key``'s value and revision as the bucket's leader has them (None:
        it has none). Raises :class:`RecordsUnavailable`."""
        ...


@dataclass(slots=True)
class _Write:
    """The latest value of a key not written yet (None: a deletion)."""

    value: bytes | None
    #: Whether what relies on it waits for it (False: a lazy position).
    strict: bool
    #: When to send it (trio time; lazy writes wait to be coalesced).
    due: float
    #: A lazy write's map, encoded into :attr:`value` when it is sent (so
    #: that what is sent is its newest state).
    payload: dict[int, int] | None = None


@dataclass(slots=True)
class ClaimedSession:
    """A session's keys as read (and its record claimed) by :meth:`ClusterRecords.claim`."""

    #: The record (see ``_records.SessionRecords.save``).
    record: object
    #: Per topic handle: publishes routed.
    routed: dict[int, int]
    #: Per subscription handle: the last offset its client processed.
    acked: dict[int, int]


def record_key(session: str) -> str:
    """The bucket key of session ``session``'s record (its id in hex)."""
    return f"{_RECORD}.{session}"


def routed_key(session: str) -> str:
    """The bucket key of a session's publish counts."""
    return f"{_ROUTED}.{session}"


def acked_key(session: str) -> str:
    """The bucket key of a session's subscriptions' positions."""
    return f"{_ACKED}.{session}"


def _session_of(key: str) -> str:
    return key.split(".", 1)[1]


class ClusterRecords:
    """The sessions' records in a :class:`RecordBucket` (see the module).

    ``on_taken(session_id)`` is called (synchronously) when another front
    end has taken a session over."""

    def __init__(self, bucket: RecordBucket, on_taken: Callable[[bytes], None]) -> None:
        self.bucket = bucket
        self.on_taken = on_taken
        #: Names this front end's writes (new at each start).
        self.writer = secrets.token_hex(8)
        #: Strict writes asked so far (a connection notes a change by it).
        self.generation = 0
        #: Per key: its last revision (written by us, or read by a claim).
        self._revisions: dict[str, int] = {}
        #: Per session (hex id): its keys we wrote or read.
        self._keys: dict[str, set[str]] = {}
        #: Writes waiting to be sent, by key (oldest first).
        self._pending: dict[str, _Write] = {}
        #: Keys with a write in flight (one at a time per key: in order).
        self._in_flight: set[str] = set()
        #: Keys with a strict write not stored yet.
        self._outstanding: set[str] = set()
        #: Per session: how many of its keys are outstanding.
        self._unstored: dict[str, int] = {}
        #: Sessions another front end took: never written again.
        self._taken: set[str] = set()
        #: Per session: its publish counts and positions, by handle (the
        #: values of its ``P`` and ``A`` keys).
        self._routed: dict[str, dict[int, int]] = {}
        self._acked: dict[str, dict[int, int]] = {}
        #: Per key of a strict write: the value last asked for.
        self._values: dict[str, bytes] = {}
        #: Per session: who waits for its keys to be stored (each once).
        self._waiters: dict[str, dict[Callable[[], None], None]] = {}
        self._wake = trio.Event()
        #: Counters: writes stored, tries not answered, sessions taken
        #: over by another front end, sessions claimed from the bucket.
        self.writes = 0
        self.retries = 0
        self.taken = 0
        self.claimed = 0

    # ------------------------------------------------------------ the journal's side

    def save(self, session: str, record: object) -> None:
        """Session ``session``'s record changed (what relies on it waits)."""
        self._strict(session, record_key(session), self._value(record))

    def routed(self, session: str, handle: int, count: int, *, strict: bool = False) -> None:
        """``count`` publishes of topic handle ``handle`` are routed (written
        within :data:`LAZY_DELAY`, nothing waits for it; ``strict``: what
        relies on it waits, as for the record: a staged channel's, whose
        publishes no stream holds for a resume to count)."""
        if session in self._taken:
            return
        counts = self._routed.setdefault(session, {})
        if counts.get(handle) != count:
            counts[handle] = count
            if strict:
                self._strict(session, routed_key(session), self._value(counts))
            else:
                self._lazy(session, routed_key(session), counts)

    def acked(self, session: str, handle: int, offset: int) -> None:
        """A subscription's position moved (written within :data:`LAZY_DELAY`)."""
        if session in self._taken:
            return
        positions = self._acked.setdefault(session, {})
        positions[handle] = offset
        self._lazy(session, acked_key(session), positions)

    def _lazy(self, session: str, key: str, payload: dict[int, int]) -> None:
        """A write of ``key`` that nothing waits for (coalesced for
        :data:`LAZY_DELAY`); none once another front end took ``session``."""
        if session in self._taken:
            return
        pending = self._pending.get(key)
        if pending is not None and pending.payload is not None:
            pending.payload = payload  # (due already: sent with the newest)
            return
        self._keys.setdefault(session, set()).add(key)
        due = trio.current_time() + LAZY_DELAY
        self._put(key, _Write(None, False, due, payload))

    def forget(self, session: str) -> None:
        """Session ``session`` ended: its keys are deleted (those we wrote)."""
        self._taken.discard(session)
        self._routed.pop(session, None)
        self._acked.pop(session, None)
        for key in self._keys.pop(session, ()):
            self._values.pop(key, None)
            if key in self._revisions or key in self._in_flight:
                self._put(key, _Write(None, False, trio.current_time()))
            else:
                self._pending.pop(key, None)
            self._stored(key)

    def let_go(self, session: str) -> None:
        """This front end stops holding ``session`` (its keys stay in the
        bucket for whoever resumes it): nothing more is written of it."""
        self._routed.pop(session, None)
        self._acked.pop(session, None)
        for key in self._keys.pop(session, ()):
            self._values.pop(key, None)
            self._pending.pop(key, None)
            self._revisions.pop(key, None)
            self._stored(key)

    def _value(self, payload: object) -> bytes:
        """A value to write: ``payload``, named as this front end's."""
        return cbor2.dumps([self.writer, payload])

    def _strict(self, session: str, key: str, value: bytes) -> None:
        """A write that what relies on it waits for (none if ``key`` has
        that value already: an unchanged record is asked again and again)."""
        if session in self._taken or self._values.get(key) == value:
            return
        self._values[key] = value
        self.generation += 1
        self._keys.setdefault(session, set()).add(key)
        self._put(key, _Write(value, True, trio.current_time()))
        if key not in self._outstanding:
            self._outstanding.add(key)
            self._unstored[session] = self._unstored.get(session, 0) + 1

    def _put(self, key: str, write: _Write) -> None:
        old = self._pending.pop(key, None)
        if old is not None:
            write.strict = write.strict or old.strict
            write.due = min(write.due, old.due)
        self._pending[key] = write
        self._wake.set()

    # ------------------------------------------------------------ waiting

    def stored(self, session: str) -> bool:
        """Whether every strict write of session ``session`` (hex id) is in
        the bucket (or another front end took it: nothing waits then)."""
        return session not in self._unstored

    def when_stored(self, session: str, wake: Callable[[], None]) -> None:
        """Call ``wake()`` once the next of ``session``'s strict writes is
        stored (at once if none waits): the caller looks again then."""
        if self.stored(session):
            wake()
        else:
            self._waiters.setdefault(session, {})[wake] = None

    def _stored(self, key: str) -> None:
        """``key``'s strict writes are stored (or given up): wake who waits
        for its session, if that was its last."""
        if key not in self._outstanding:
            return
        self._outstanding.discard(key)
        session = _session_of(key)
        left = self._unstored[session] - 1
        if left:
            self._unstored[session] = left
        else:
            del self._unstored[session]
        self._progress(session)

    def _progress(self, session: str) -> None:
        """A write of ``session`` was stored: who waits for it looks again."""
        for wake in self._waiters.pop(session, ()):
            wake()

    # ------------------------------------------------------------ claiming

    async def claim(
        self,
        session: str,
        before: Callable[[ClaimedSession], Awaitable[None]] | None = None,
    ) -> ClaimedSession | None:
        """Read session ``session``'s keys and claim them (each written
        again at the revision read: the front end that held it loses it);
        None if the bucket has no record of it. ``before(claimed)`` runs
        between the read and the claim: what it raises leaves the session
        unclaimed. A key written between the read and the claim (the
        holder's late count) makes the claim read again. Raises
        :class:`RecordsUnavailable` (also if the keys kept changing under
        :data:`CLAIM_TRIES` claims: another front end writes them as fast)."""
        for _ in range(CLAIM_TRIES):
            keys = await self.bucket.session(session)
            if record_key(session) not in keys:
                return None
            decoded: dict[str, object] = {}
            for key, (value, _) in keys.items():
                try:
                    _writer, decoded[key] = cbor2.loads(value)
                except Exception:  # a damaged value: not resumed, reported
                    log.error("cluster session key %s cannot be read", key[:40])
                    return None
            claimed = ClaimedSession(
                decoded[record_key(session)],
                _handles(decoded.get(routed_key(session))),
                _handles(decoded.get(acked_key(session))),
            )
            if before is not None:
                await before(claimed)
            revisions: dict[str, int] = {}
            values: dict[str, bytes] = {}
            try:
                for key, (_, revision) in keys.items():
                    values[key] = self._value(decoded[key])
                    revisions[key] = await self.bucket.write(key, values[key], revision)
            except RecordConflict:
                continue
            break
        else:
            raise RecordsUnavailable(f"session {session[:16]}'s keys kept changing under a claim")
        self._revisions.update(revisions)
        self._keys.setdefault(session, set()).update(revisions)
        for key in (record_key(session), routed_key(session)):
            if key in values:
                self._values[key] = values[key]
        self._routed[session] = dict(claimed.routed)
        self._acked[session] = dict(claimed.acked)
        self._taken.discard(session)
        self.claimed += 1
        return claimed

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
                    if write.payload is not None:
                        write.value = self._value(write.payload)
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
                    current = await self._current(key)
                    if current is None and write.value is None:
                        revision = 0  # (an earlier try deleted it, its answer lost)
                    elif current is None or not self._mine(current[0]):
                        self._taken_over(session)
                        return
                    elif current[0] == write.value:
                        revision = current[1]  # (an earlier try stored it)
                    else:  # (ours, an earlier value's: write this one on top)
                        self._revisions[key] = current[1]
                        continue
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
                        newer.strict = newer.strict or write.strict
                        newer.due = trio.current_time()
                        return
                    continue
                self.writes += 1
                if write.value is None:  # (ids are never reused: nothing follows)
                    self._revisions.pop(key, None)
                else:
                    self._revisions[key] = revision
                if key not in self._pending:
                    self._stored(key)
                else:
                    self._progress(session)
                return
        finally:
            self._in_flight.discard(key)
            self._wake.set()

    async def _current(self, key: str) -> tuple[bytes, int] | None:
        """``key``'s value and revision in the bucket (asked until it answers)."""
        backoff = Backoff(RETRY_FIRST, RETRY_MOST)
        while True:
            try:
                return await self.bucket.read(key)
            except RecordsUnavailable:
                self.retries += 1
                await trio.sleep(backoff.next())

    def _mine(self, value: bytes) -> bool:
        """Whether ``value`` was written by this front end (since its start)."""
        try:
            decoded = cbor2.loads(value)
        except Exception:
            return False
        return isinstance(decoded, list) and len(decoded) == 2 and decoded[0] == self.writer

    def _taken_over(self, session: str) -> None:
        """Another front end wrote ``session``'s keys: it has the session."""
        self.taken += 1
        self._taken.add(session)
        self.let_go(session)
        log.warning(
            "session %s was taken over by another front end: its connection here ends",
            session[:16],
        )
        self.on_taken(bytes.fromhex(session))

    def statistics(self) -> dict[str, int]:
        """Writes stored, tries not answered, sessions taken over and
        claimed, writes waiting."""
        return {
            "writes": self.writes,
            "retries": self.retries,
            "taken": self.taken,
            "claimed": self.claimed,
            "pending": len(self._pending) + len(self._in_flight),
        }


def _handles(value: object) -> dict[int, int]:
    """A ``P`` or ``A`` key's map (malformed entries left out)."""
    if not isinstance(value, dict):
        return {}
    return {h: n for h, n in value.items() if type(h) is int and type(n) is int}
