"""Consumer groups' progress kept in the cluster (cluster mode): a topic's
new owner, on another disk, goes on with each group where it was.

:class:`ClusterGroups` stands in for the state journal of
:class:`~..topics._groups.Groups` (its spaces ``groups`` and
``groups.settled``): each group's whole state (what the journal's
``groups`` space holds: the snapshot of what it settled, its options, its
dead-letter topic) is a value of the KV bucket :data:`BUCKET`, written
late (:class:`~._kv_state.LateWrites`: within ``LAZY_DELAY`` of the
group's write, which comes every ``FLUSH_SECONDS`` while it changes, and
when its last member leaves). What a group settled since its last state
(``groups.settled``) stays in memory: the state written late covers it.
So a front end killed delivers again what its groups settled in its last
fraction of a second (at least once); one that stops or serves afresh
writes them first (:meth:`ClusterGroups.flush`).

A front end reads the groups of the topics it owns when it starts
(:meth:`ClusterGroups.load`) and *claims* each: writes it again, at the
revision it read, named as its own. The previous owner's write still in
flight then either lands first (the claim is refused: the group is read
and claimed again, with that progress) or is refused (its writer gives the
group up: it never writes it again). A write of this front end refused
because another one wrote the group since is given up the same way: what
waits to be written for it is dropped, and neither a later state nor a
deletion of it is written (each would be a compare-and-set at the other
front end's revision, and land on its progress).

A key is ``<topic>.<digest>`` (as the durable cursors'; the digest of the
principal and the group's name); its value, CBOR: ``[writer, principal,
topic, name, state]``.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable

import cbor2

from ..sessions._cluster_records import RecordConflict
from ._cluster_cursors import bucket_key
from ._kv_state import GIVE_UP, KeyedBucket, LateWrites, Verdict

__all__ = ["BUCKET", "ClusterGroups"]

log = logging.getLogger("broker.server")

#: The bucket's name.
BUCKET = "broker-groups"
#: The journal spaces a :class:`ClusterGroups` keeps (``topics._groups``'s).
_GROUPS = "groups"
_SETTLED = "groups.settled"


def _decoded(value: bytes) -> tuple[str, str, object] | None:
    """A value's writer, group key (principal, topic, name) and state."""
    try:
        writer, principal, topic, name, state = cbor2.loads(value)
    except (ValueError, TypeError, cbor2.CBORDecodeError):
        return None
    if not all(isinstance(field, str) for field in (writer, principal, topic, name)):
        return None
    return writer, "\x00".join((principal, topic, name)), state


class ClusterGroups:
    """The groups of the topics a front end owns, kept in a bucket (see the
    module); a ``topics._groups.GroupJournal``."""

    def __init__(self, bucket: KeyedBucket) -> None:
        #: Names this front end's writes (new at each start).
        self.writer = secrets.token_hex(8)
        self._spaces: dict[str, dict[str, object]] = {_GROUPS: {}, _SETTLED: {}}
        #: Groups another front end claimed since: never written again.
        self._lost: set[str] = set()
        self.writes = LateWrites(bucket, self._resolve, "groups")

    async def load(self, owns: Callable[[str], bool] | None = None) -> int:
        """Read and claim the groups of the topics this front end ``owns``
        (None: all) from the bucket; how many. Raises ``RecordsUnavailable``
        if it does not answer."""
        bucket = self.writes.bucket
        found = await bucket.scan("")
        claimed = 0
        for where, first in found.items():
            held: tuple[bytes, int] | None = first
            while held is not None:
                decoded = _decoded(held[0])
                if decoded is None or bucket_key(decoded[1]) != where:
                    log.error("cluster groups: key %s holds no group: left alone", where[:80])
                    break
                _writer, key, state = decoded
                if owns is not None and not owns(key.split("\x00")[1]):
                    break
                try:
                    revision = await bucket.write(where, self._value(key, state), held[1])
                except RecordConflict:  # (its owner's last write, landing now)
                    held = await bucket.read(where)
                    continue
                self._spaces[_GROUPS][key] = state
                self._lost.discard(where)
                self.writes.known(where, revision)
                claimed += 1
                break
        return claimed

    async def flush(self) -> None:
        """Return once the bucket holds every group's state written so far."""
        await self.writes.flush()

    async def run(self) -> None:
        """Write the groups' states as they change, until cancelled."""
        await self.writes.run()

    def _value(self, key: str, state: object) -> bytes:
        return cbor2.dumps([self.writer, *key.split("\x00"), state])

    def _resolve(
        self, where: str, theirs: bytes | None, mine: bytes | None
    ) -> bytes | Verdict | None:
        """Another front end wrote group ``where`` since: it has claimed it
        (given up here), unless it is this one's own earlier write (its
        answer lost)."""
        decoded = None if theirs is None else _decoded(theirs)
        if decoded is None or decoded[0] == self.writer:
            return mine
        self._lost.add(where)
        log.warning(
            "group %r of %r was claimed by another front end: not written here again",
            decoded[1].split("\x00")[2][:64],
            decoded[1].split("\x00")[1][:64],
        )
        return GIVE_UP

    # ------------------------------------------------------------ the journal's

    def get(self, space: str, key: str) -> object | None:
        return self._spaces[space].get(key)

    def items(self, space: str) -> list[tuple[str, object]]:
        return sorted(self._spaces[space].items())

    def put(self, space: str, key: str, value: object) -> None:
        self._spaces[space][key] = value
        if space == _GROUPS and bucket_key(key) not in self._lost:
            self.writes.put(bucket_key(key), self._value(key, value))

    def delete(self, space: str, key: str) -> None:
        deleted = self._spaces[space].pop(key, None) is not None
        if deleted and space == _GROUPS and bucket_key(key) not in self._lost:
            self.writes.put(bucket_key(key), None)  # (not one given up: another has it)

    def write(self) -> None:
        pass  # (written late: see the module)
