"""Durable cursors kept in the cluster (cluster mode): a topic's new owner,
on another disk, continues each cursor where its subscriber acknowledged.

:class:`ClusterCursors` is the :class:`~..topics._log_subscription.CursorBook`
of a front end: the positions of the cursors of the topics it owns, read
from the KV bucket :data:`BUCKET` when it starts (before it serves them:
:meth:`ClusterCursors.load`), kept in memory, and written back late
(:class:`~._kv_state.LateWrites`: within ``LAZY_DELAY``, coalesced) as
subscribers acknowledge. A position is written *after* the Ack is acted
on (retention and the live subscription move at once): a front end killed
before the write delivers those records again to the cursor's next
subscriber, at least once, as a consumer that commits its offsets after
processing sees; a front end that stops (or serves afresh) writes them
first (:meth:`ClusterCursors.flush`).

A key is ``<topic>.<digest>``: the topic as its stream names it (bytes
other than ``[A-Za-z0-9-]`` as ``_XX``, a long name shortened with a hash)
and a digest of the principal and the cursor's name; its value, JSON,
names all three, the next offset the cursor wants (``next``) and the front
end that wrote it (``writer``, new at each start). Positions only grow, so
a write refused because another front end wrote the key (a previous
owner's late write) needs no claim: the larger position is kept. A
deletion is a compare-and-set at this front end's own last revision: one
refused because another front end wrote the key since leaves that value
(logged), and is written again only on a value of this front end's own
(a write whose answer was lost).
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
from collections.abc import Callable

from ..topics._log_subscription import cursor_key
from ._jetstream import topic_token
from ._kv_state import KeyedBucket, LateWrites, Verdict

__all__ = ["BUCKET", "ClusterCursors", "bucket_key"]

log = logging.getLogger("broker.server")

#: The bucket's name.
BUCKET = "broker-cursors"


def bucket_key(key: str) -> str:
    """The bucket key of the cursor of :func:`~..topics._log_subscription.cursor_key` ``key``."""
    principal, topic, name = key.split("\x00")
    digest = hashlib.sha256(f"{principal}\x00{name}".encode()).hexdigest()[:32]
    return f"{topic_token(topic)}.{digest}"


def _value(key: str, position: int, writer: str) -> bytes:
    principal, topic, name = key.split("\x00")
    value = {
        "topic": topic,
        "principal": principal,
        "cursor": name,
        "next": position,
        "writer": writer,
    }
    return json.dumps(value, ensure_ascii=False).encode()


def _writer(value: bytes) -> object:
    """The front end that wrote ``value`` (None: not named)."""
    try:
        fields = json.loads(value)
    except ValueError:
        return None
    return fields.get("writer") if isinstance(fields, dict) else None


def _decoded(value: bytes) -> tuple[str, int] | None:
    """A value's cursor key and position (None: not a cursor's)."""
    try:
        fields = json.loads(value)
        key = cursor_key(fields["principal"] or None, fields["topic"], fields["cursor"])
        position = fields["next"]
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    return (key, position) if type(position) is int and position >= 1 else None


class ClusterCursors:
    """The durable cursors of the topics a front end owns, kept in a bucket
    (see the module)."""

    def __init__(self, bucket: KeyedBucket) -> None:
        #: Names this front end's writes (new at each start).
        self.writer = secrets.token_hex(8)
        self._positions: dict[str, int] = {}
        self.writes = LateWrites(bucket, self._resolve, "cursors")

    async def load(self, owns: Callable[[str], bool] | None = None) -> int:
        """Read the positions of the cursors of the topics this front end
        ``owns`` (None: all) from the bucket; how many. Raises
        ``RecordsUnavailable`` if it does not answer."""
        found = await self.writes.bucket.scan("")
        loaded = 0
        for where, (value, revision) in found.items():
            decoded = _decoded(value)
            if decoded is None or bucket_key(decoded[0]) != where:
                log.error("cluster cursors: key %s does not hold a cursor: left alone", where[:80])
                continue
            key, position = decoded
            if owns is not None and not owns(key.split("\x00")[1]):
                continue
            self._positions[key] = max(position, self._positions.get(key, 0))
            self.writes.known(where, revision)
            loaded += 1
        return loaded

    async def flush(self) -> None:
        """Return once the bucket holds every position stored so far."""
        await self.writes.flush()

    async def run(self) -> None:
        """Write the positions as they are stored, until cancelled."""
        await self.writes.run()

    # ------------------------------------------------------------ CursorBook

    def position(self, key: str) -> int | None:
        return self._positions.get(key)

    def store(self, key: str, position: int) -> None:
        self._positions[key] = position
        self.writes.put(bucket_key(key), _value(key, position, self.writer))

    def put(self, key: str, position: int) -> None:
        self.store(key, position)  # (written late in any case)

    def write(self) -> None:
        pass  # (the late writer sends what was stored)

    def items(self) -> list[tuple[str, int]]:
        return sorted(self._positions.items())

    def delete(self, key: str) -> bool:
        if self._positions.pop(key, None) is None:
            return False
        self.writes.put(bucket_key(key), None)
        return True

    def _resolve(
        self, where: str, theirs: bytes | None, mine: bytes | None
    ) -> bytes | Verdict | None:
        """Another front end wrote cursor ``where``: the larger position is
        kept (and taken here); a deletion removes only this front end's own
        value (its answer lost), not another's."""
        if theirs is None:
            return mine
        if mine is None:
            if _writer(theirs) == self.writer:
                return None
            log.warning(
                "cursor %s: deleted here, but another front end wrote it since: left as it is",
                where[:80],
            )
            return theirs
        held, ours = _decoded(theirs), _decoded(mine)
        if held is None or ours is None or held[0] != ours[0] or held[1] < ours[1]:
            return mine
        key = ours[0]
        if key in self._positions:
            self._positions[key] = max(self._positions[key], held[1])
        return theirs
