"""State of the topics kept in a KV bucket of the cluster (cluster mode):
what a topic's owner writes late, coalesced, and a new owner reads back.

A :class:`LateWrites` sends the newest value of each key to a
:class:`KeyedBucket` (a JetStream KV bucket, or the tests' in-memory one):
a value put is sent after :data:`~..sessions._cluster_records.LAZY_DELAY`
seconds, with whatever else was put meanwhile (a key put many times in that
time is written once, with its last value), at most one write in flight per
key and :data:`MAX_IN_FLIGHT` in all. Each write is a compare-and-set on
the key's last revision known here; a refusal (another front end wrote the
key: a previous owner's late write, or a new owner's) reads the key and
asks the owner of the values (``resolve``) what the key should hold then,
which is written on top unless it is what the bucket holds already, or
whether to give the key up (:data:`GIVE_UP`: another front end has it
now; what waits for it is dropped, its revision forgotten, and nothing is
written to it here again). A deletion refused is written again only if
``resolve`` says so (None: the key holds this writer's own value, whose
answer was lost); otherwise the key keeps what another front end wrote,
and its revision is forgotten: a deletion never removes what another
front end wrote since this one's last revision. A bucket that does not
answer is asked again after a backoff, with the newest value by then.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Final, Protocol

import trio

from broker.backoff import Backoff

from ..sessions._cluster_records import LAZY_DELAY, RecordConflict, RecordsUnavailable
from ..staging._stream import StagingStore

__all__ = ["GIVE_UP", "KeyedBucket", "LateWrites", "StateBuckets", "Verdict"]

log = logging.getLogger("broker.server")

#: Writes in flight at once.
MAX_IN_FLIGHT = 64
#: Waits between tries of a write or read the bucket did not answer (seconds).
RETRY_FIRST = 0.05
RETRY_MOST = 2.0


class Verdict(Enum):
    """What :data:`Resolve` answers besides a value."""

    GIVE_UP = "give up"


#: Another front end has the key now: never write it here again.
GIVE_UP: Final = Verdict.GIVE_UP

#: What a key should hold after a refused write: given the key, what the
#: bucket holds (None: nothing) and what was to be written (None: a
#: deletion); the value to keep (None: none), or :data:`GIVE_UP`.
Resolve = Callable[[str, bytes | None, bytes | None], bytes | Verdict | None]


class KeyedBucket(Protocol):
    """A key-value bucket with revisions (the sessions' ``RecordBucket``'s
    writes and reads, and a scan of its keys)."""

    async def write(self, key: str, value: bytes | None, last_revision: int) -> int:
        """Write ``value`` (None: delete) at ``last_revision`` (0: the key has
        no value); the new revision. Raises ``RecordConflict`` if that is not
        the key's last, ``RecordsUnavailable`` if the bucket does not answer."""
        ...

    async def read(self, key: str) -> tuple[bytes, int] | None:
        """``key``'s value and revision (None: it has none). Raises ``RecordsUnavailable``."""
        ...

    async def scan(self, prefix: str) -> dict[str, tuple[bytes, int]]:
        """Every key starting with ``prefix`` that has a value: its value and
        revision. Raises ``RecordsUnavailable``."""
        ...


@dataclass(frozen=True, slots=True)
class StateBuckets:
    """The buckets of what a topic's owner keeps in the cluster besides its
    stream: durable cursors' positions (``_cluster_cursors``) and consumer
    groups' states (``_cluster_groups``); the commit registry of staged
    batches (``staging._registry``; None: kept in the journal only) and
    the staging stream."""

    cursors: KeyedBucket
    groups: KeyedBucket
    commits: KeyedBucket | None = None
    #: The staged publishes (``staging._stream``; None: in the journal only).
    staged: StagingStore | None = None


class LateWrites:
    """The late writer of one bucket's keys (see the module); ``what`` names
    them in the log."""

    def __init__(
        self, bucket: KeyedBucket, resolve: Resolve, what: str, *, delay: float = LAZY_DELAY
    ) -> None:
        self.bucket = bucket
        self.resolve = resolve
        self.what = what
        self.delay = delay
        #: Per key: its last revision known (written, or read).
        self._revisions: dict[str, int] = {}
        #: Per key: the newest value not sent yet (None: a deletion).
        self._waiting: dict[str, bytes | None] = {}
        #: Keys with a write in flight.
        self._sending: set[str] = set()
        #: Keys given up (:data:`GIVE_UP`): never written here again.
        self._given_up: set[str] = set()
        self._put = trio.Event()
        #: Set while :meth:`flush` wants everything sent now (no delay).
        self._hurry = trio.Event()
        self._sent = trio.Event()
        #: Counters: writes stored, tries not answered, writes refused.
        self.writes = 0
        self.retries = 0
        self.refused = 0

    @property
    def pending(self) -> int:
        """Keys with a value not stored yet."""
        return len(self._waiting.keys() | self._sending)

    def known(self, key: str, revision: int) -> None:
        """``key`` was read (or claimed) at ``revision`` (the next write
        expects it; a key given up is written again)."""
        self._revisions[key] = revision
        self._given_up.discard(key)

    def given_up(self, key: str) -> bool:
        """Whether ``key`` was given up (its writes are dropped)."""
        return key in self._given_up

    def put(self, key: str, value: bytes | None) -> None:
        """Write ``value`` to ``key`` soon (None: delete it); nothing if
        the key was given up."""
        if key in self._given_up:
            return
        self._waiting[key] = value
        self._put.set()

    async def flush(self) -> None:
        """Send what waits at once, and return once the bucket has it all."""
        self._hurry.set()
        try:
            while self.pending:
                self._put.set()
                await self._sent.wait()
        finally:
            self._hurry = trio.Event()

    async def run(self) -> None:
        """Send what is put, until cancelled (see the module)."""
        limiter = trio.CapacityLimiter(MAX_IN_FLIGHT)
        async with trio.open_nursery() as nursery:
            while True:
                await self._put.wait()
                with trio.move_on_after(self.delay):
                    await self._hurry.wait()
                self._put = trio.Event()
                for key in [k for k in self._waiting if k not in self._sending]:
                    self._sending.add(key)
                    nursery.start_soon(self._send, key, limiter)

    async def _send(self, key: str, limiter: trio.CapacityLimiter) -> None:
        backoff = Backoff(RETRY_FIRST, RETRY_MOST)
        try:
            async with limiter:
                value = self._waiting.pop(key)
                while not await self._written(key, value):
                    self.retries += 1
                    await trio.sleep(backoff.next())
                    if key in self._waiting:  # (a newer value: that one is sent)
                        value = self._waiting.pop(key)
        finally:
            self._sending.discard(key)
            if key in self._waiting:
                self._put.set()
            self._sent.set()
            self._sent = trio.Event()

    async def _written(self, key: str, value: bytes | None) -> bool:
        """Write ``value`` to ``key`` (or what :attr:`resolve` says after a
        refusal); whether the bucket answered (False: try again later)."""
        deleting = value is None
        try:
            while True:
                try:
                    revision = await self.bucket.write(key, value, self._revisions.get(key, 0))
                    break
                except RecordConflict:
                    self.refused += 1
                    theirs = await self.bucket.read(key)
                    held = None if theirs is None else theirs[0]
                    verdict = self.resolve(key, held, value)
                    if verdict is GIVE_UP:
                        self._give_up(key)
                        return True
                    if deleting and theirs is not None and verdict is not None:
                        # (Another front end wrote it since: it stays, and
                        # its revision is not taken for a later write.)
                        self._revisions.pop(key, None)
                        return True
                    self._revisions[key] = 0 if theirs is None else theirs[1]
                    value = verdict
                    if value == held:
                        return True  # (the bucket holds what it should)
        except RecordsUnavailable as error:
            log.warning("cluster %s: the bucket did not answer (%s): asked again", self.what, error)
            return False
        self.writes += 1
        if value is None:
            self._revisions.pop(key, None)
        else:
            self._revisions[key] = revision
        return True

    def _give_up(self, key: str) -> None:
        """Never write ``key`` again (another front end has it)."""
        self._given_up.add(key)
        self._waiting.pop(key, None)
        self._revisions.pop(key, None)
