"""The commit registry in the cluster (cluster mode): a batch committed
through one front end is known as committed to every front end, whatever
its disk.

A standalone broker remembers its committed batches in its state journal
(``_area``). A front end keeps them in a KV bucket of the JetStream
cluster as well (:data:`BUCKET`, one key per batch: ``c.`` and the hex of
:func:`~._records.commit_origin`), so that one replaced on a new data
directory answers a retried commit "duplicate" instead of routing it
again. A batch's value holds one entry per *share*: the topics a front
end's commit routes to (with several front ends each commits the share
of the topics it owns), as ``[state, members]``: ``committing`` (written
before the first publish is routed) or ``committed`` (written before the
Outcome says so), and a digest of the members listed with their counts.
Every write is a compare-and-set at the revision read (a conflict: read
again and merge), so front ends committing their shares at once keep
each other's entries.

A Commit is decided (:meth:`CommitRegistry.decide`) from the registry
first when the front end does not know the batch: a share committed is a
duplicate (its local staged publishes, if any, are dropped). One a front
end was committing when it stopped is completed from the batch's
publishes staged here (the batch run again): only what the topics'
streams do not hold of it is routed (their runs name the batch as their
origin); with nothing staged here (the rows were on a disk that is lost)
its commit is refused, saying so, and the batch must be run again.

The bucket keeps at most ``staging_remember`` values (the oldest go
first), as a standalone broker remembers that many batches.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable

import cbor2
import trio

from broker.backoff import Backoff

from .._peer_logging import shown
from ..sessions._cluster_records import RecordConflict, RecordsUnavailable
from ..storage._kv_state import KeyedBucket
from ..storage._topic_logs import patiently
from ._area import CommitDecision, StagingArea
from ._records import BatchKey, Members, commit_origin
from ._stream import StagingStore, StagingUnavailable

__all__ = ["BUCKET", "COMMITTED", "COMMITTING", "CommitRegistry", "registry_key"]

log = logging.getLogger("broker.server")

#: The bucket's name.
BUCKET = "broker-commits"
#: A share's states.
COMMITTING = "committing"
COMMITTED = "committed"

#: One entry per share (its topics' digest): ``(state, members' digest)``.
Shares = dict[str, tuple[str, str]]


def registry_key(batch: BatchKey) -> str:
    """The bucket key of ``batch`` (the hex of its commit origin)."""
    return "c." + commit_origin(batch).hex()


def share_of(topics: set[str]) -> str:
    """The entry of a share: a digest of its topics."""
    return hashlib.sha256("\0".join(sorted(topics)).encode()).hexdigest()[:16]


def members_digest(members: Members) -> str:
    """A digest of a commit's members with their counts, in order."""
    return hashlib.sha256(cbor2.dumps([[m, n] for m, n in members])).hexdigest()[:16]


def _shares(value: bytes | None) -> Shares:
    """A batch's value, checked (malformed entries left out)."""
    if value is None:
        return {}
    try:
        decoded = cbor2.loads(value)
    except Exception:
        log.error("commit registry: a value cannot be read (taken as empty)")
        return {}
    if not isinstance(decoded, dict):
        return {}
    return {
        share: (entry[0], entry[1])
        for share, entry in decoded.items()
        if isinstance(share, str)
        and isinstance(entry, list)
        and len(entry) == 2
        and entry[0] in (COMMITTING, COMMITTED)
        and isinstance(entry[1], str)
    }


class CommitRegistry:
    """The committed batches in a :class:`KeyedBucket` (see the module)."""

    def __init__(self, bucket: KeyedBucket, staged: StagingStore | None = None) -> None:
        self.bucket = bucket
        #: The cluster's staged publishes (``_stream``; None: only those here).
        self.staged = staged
        #: Counters: registry writes stored, tries not answered.
        self.writes = 0
        self.retries = 0

    async def shares(self, batch: BatchKey) -> Shares:
        """``batch``'s shares as the bucket's leader has them. Raises
        :class:`RecordsUnavailable` once asked long enough (see ``patiently``)."""
        stored = await patiently(
            "reading the commit registry",
            lambda: self.bucket.read(registry_key(batch)),
            RecordsUnavailable,
        )
        return _shares(None if stored is None else stored[0])

    async def begin(self, batch: BatchKey, topics: set[str], members: Members) -> str | None:
        """Note the share of ``topics`` as being committed, unless the
        registry has it already: then its state (another front end, or this
        one before a stop, committed it). Asked until the bucket answers."""
        share, digest = share_of(topics), members_digest(members)
        found: list[str] = []

        def change(shares: Shares) -> Shares | None:
            if share in shares:
                found.append(shares[share][0])
                return None
            return {**shares, share: (COMMITTING, digest)}

        await self._change(batch, change)
        return found[0] if found else None

    async def finish(self, batch: BatchKey, topics: set[str], members: Members | None) -> None:
        """Note the share of ``topics`` as committed (its routing is done):
        from now on a commit of it anywhere is a duplicate. Asked until the
        bucket answers."""
        share = share_of(topics)

        def change(shares: Shares) -> Shares | None:
            old = shares.get(share)
            digest = members_digest(members) if members is not None else (old or ("", ""))[1]
            if old == (COMMITTED, digest):
                return None
            return {**shares, share: (COMMITTED, digest)}

        await self._change(batch, change)

    async def decide(
        self,
        staging: StagingArea,
        batch: BatchKey,
        members: Members,
        elsewhere: Callable[[str], str | None] | None = None,
        owned: Callable[[str], bool] | None = None,
    ) -> CommitDecision:
        """Decide a Commit of ``batch`` (see :meth:`StagingArea.commit`),
        asking the registry first if this front end does not know the batch
        as committed (see the module); with a staging stream, the batch's
        publishes to the topics ``owned`` here are read from it first if
        the members listed are not all here in full."""
        if self.staged is not None and not staging.holds(batch, members):
            refusal = await self._load(staging, batch, owned)
            if refusal is not None:
                return refusal
        if not staging.decided(batch):
            try:
                shares = await self.shares(batch)
            except RecordsUnavailable as error:
                return staging.refuse(
                    f"the cluster's commit registry does not answer ({error}): "
                    "nothing was committed, commit again"
                )
            refusal = self._from_registry(staging, batch, members, shares)
            if refusal is not None:
                return refusal
        return staging.commit(*batch, members, elsewhere)

    async def _load(
        self, staging: StagingArea, batch: BatchKey, owned: Callable[[str], bool] | None
    ) -> CommitDecision | None:
        """Replace what ``staging`` holds of ``batch`` by its runs to the
        topics ``owned`` here in the staging stream; the refusal if the
        stream does not answer."""
        store = self.staged
        assert store is not None
        try:
            runs = await patiently(
                "reading the staging stream", lambda: store.load(batch), StagingUnavailable
            )
        except StagingUnavailable as error:
            return staging.refuse(
                f"the cluster's staging stream does not answer ({error}): "
                "nothing was committed, commit again"
            )
        if staging.decided(batch):
            return None  # (decided meanwhile: answered from here)
        mine = [run for run in runs if owned is None or owned(run.topic)]
        held = staging.adopt(batch, mine, trio.current_time())
        store.counters.batches_read += 1
        log.info(
            "staged batch %s: %d messages read from the staging stream (%d runs)",
            shown(batch[1]),
            held,
            len(mine),
        )
        return None

    def _from_registry(
        self, staging: StagingArea, batch: BatchKey, members: Members, shares: Shares
    ) -> CommitDecision | None:
        """The decision ``shares`` make (None: decide here, as usual)."""
        if staging.decided(batch):
            return None  # (decided meanwhile: answered from here)
        topics = staging.topics_of(batch, [member for member, _ in members])
        if topics:
            entry = shares.get(share_of(topics))
            if entry is not None and entry[0] == COMMITTED:
                return staging.committed_elsewhere(batch)
            # (Committing: a front end stopped while it committed the
            # batch, staged again here since: its commit routes only what
            # the topics' streams do not hold of it, see ``_commit``.)
            return None
        # Nothing staged here: the rows were staged on a disk that is lost.
        digest = members_digest(members)
        states = [state for state, listed in shares.values() if listed == digest]
        if COMMITTED in states:
            return staging.committed_elsewhere(batch)
        if COMMITTING in states:
            return staging.refuse(
                "a front end was committing this batch when it stopped, and its staged "
                "messages are neither here nor in the cluster's staging stream: run "
                "the batch again"
            )
        return None

    async def _change(self, batch: BatchKey, change: Callable[[Shares], Shares | None]) -> None:
        """Read ``batch``'s value, and write ``change(shares)`` at the
        revision read (None: nothing to write), until it is written."""
        key = registry_key(batch)
        backoff = Backoff()
        while True:
            try:
                stored = await self.bucket.read(key)
                value, revision = (None, 0) if stored is None else stored
                changed = change(_shares(value))
                if changed is None:
                    return
                body = cbor2.dumps({share: list(entry) for share, entry in changed.items()})
                await self.bucket.write(key, body, revision)
                self.writes += 1
                return
            except RecordConflict:
                continue  # (another front end wrote it meanwhile: read again and merge)
            except RecordsUnavailable as error:
                self.retries += 1
                delay = backoff.next()
                log.warning(
                    "commit registry: a write was not answered (%s): tried again in %.2f s",
                    error,
                    delay,
                )
                await trio.sleep(delay)
