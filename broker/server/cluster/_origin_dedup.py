"""What a topic's owner has taken of each forwarded origin: publishes a
worker's link forwards are never stored twice.

A worker forwards its clients' publishes to a topic's owner with their
origin runs (the client's session, topic handle and publish indices; see
``broker.protocol._origins``). The owner notes, per (topic, session,
handle), the highest index it has passed on to the topic. A forwarding
worker that is killed before it hears the owner's Confirm has not recorded
those publishes as routed: its client sends them again after its session
resumes, under the same indices, and the owner now passes on only what it
has not taken, and counts the rest as routed (so they are confirmed).

The table is bounded (least recently used origins are forgotten first,
and counted: a resend of a forgotten origin's publishes would be stored
again). On a broker with topic logs it survives the owner's own crash: the
topic marks each run it appends (``_publish_marks``), and the table is
filled from those marks at start-up (:meth:`SeenOrigins.restore`).
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import islice

from broker.protocol import OriginRun

from ..storage._publish_marks import Held, PublishMarks

__all__ = ["ORIGINS_KEPT", "SeenOrigins"]

#: Origins a worker remembers, over all its topics.
ORIGINS_KEPT = 1 << 16
#: The entry of an origin restored from its publish mark, not used yet.
_RESTORED = -1


class SeenOrigins:
    """Per (topic, session, handle): the highest publish index taken."""

    def __init__(
        self,
        limit: int = ORIGINS_KEPT,
        forgotten: Callable[[bytes, int], None] | None = None,
        restored: Callable[[bytes, int], Held | None] | None = None,
    ) -> None:
        self.limit = limit
        #: In least recently used order (each use moves an origin to the end).
        self._high: dict[tuple[str, bytes, int], int] = {}
        #: Publishes not passed on because they had been taken already.
        self.duplicates = 0
        #: Publishes of an origin not known beyond its first publish: its
        #: entry was forgotten (past :attr:`limit`), so a resend of what it
        #: sent before would not have been recognised.
        self.unknown = 0
        #: Called with (session, handle) of each origin forgotten.
        self._forgotten = forgotten
        #: What the log held of an origin restored, asked once when used.
        self._restored = restored
        #: Whether the broker's own clients' publishes are noted too (cluster
        #: mode: see ``OriginFilter.notes_local``).
        self.notes_local = False

    @classmethod
    def kept_in(cls, marks: PublishMarks | None) -> SeenOrigins:
        """A table whose origins' publish ``marks`` (a broker with topic logs)
        are deleted as it forgets them, and ask them what a log held."""
        if marks is None:
            return cls()
        return cls(forgotten=marks.forget_origin, restored=marks.held)

    def restore(self, topic: str, session: bytes, handle: int) -> None:
        """At start-up: ``topic``'s log holds publishes of (``session``,
        ``handle``); how many, ``restored`` says when they are used."""
        self._high[(topic, session, handle)] = _RESTORED
        self._trim()

    def seed(self, topic: str, held: dict[tuple[bytes, int], int]) -> None:
        """Cluster mode: ``topic``'s stream, restored, holds the publishes
        of each (session, handle) of ``held`` up to that index (its runs
        name them): a resend of those is recognised."""
        high = self._high
        for (session, handle), index in held.items():
            key = (topic, session, handle)
            known = high.pop(key, 0)
            high[key] = max(index, known)
        self._trim()

    def stored(self, topic: str, origins: list[OriginRun]) -> None:
        """Cluster mode, the table of what the streams hold: a run of
        ``topic`` with the publishes of ``origins`` is stored."""
        self.seed(topic, {(s, h): first + count - 1 for s, h, first, count in origins if s})

    def high(self, topic: str, session: bytes, handle: int) -> int:
        """The highest publish index of (``session``, ``handle``) known taken
        for ``topic`` (0: none known)."""
        seen = self._high.get((topic, session, handle), 0)
        if seen == _RESTORED:
            held = None if self._restored is None else self._restored(session, handle)
            seen = 0 if held is None else held.index
            self._high[(topic, session, handle)] = seen
        return seen

    def __len__(self) -> int:
        return len(self._high)

    def take(
        self, topic: str, origins: list[OriginRun], tails: list[bytes], keys: list[bytes | None]
    ) -> tuple[list[bytes], list[bytes | None], int, list[OriginRun]] | None:
        """Note the publishes of ``origins`` (runs of ``tails`` and
        ``keys``) as taken for ``topic``. None if none was taken before;
        else the tails and keys not taken before, in order, how many were
        left out, and the origin runs of those not taken before."""
        high = self._high
        skip: list[tuple[int, int]] = []
        fresh_runs: list[OriginRun] = []
        pos = 0
        for run in origins:
            session, handle, first, count = run
            if session:
                key = (topic, session, handle)
                seen = high.pop(key, None)  # (put back at the end: the most recent)
                if seen == _RESTORED:
                    held = None if self._restored is None else self._restored(session, handle)
                    seen = 0 if held is None else held.index
                elif seen is None:
                    seen = 0
                    if first > 1:
                        self.unknown += count
                last = first + count - 1
                if seen >= first:
                    taken = min(seen, last) - first + 1
                    skip.append((pos, pos + taken))
                    if taken < count:
                        fresh_runs.append((session, handle, first + taken, count - taken))
                else:
                    fresh_runs.append(run)
                high[key] = max(seen, last)
            else:
                fresh_runs.append(run)
            pos += count
        self._trim()
        if not skip:
            return None
        fresh_tails: list[bytes] = []
        fresh_keys: list[bytes | None] = []
        start = 0
        skipped = 0
        for lo, hi in skip:
            fresh_tails += tails[start:lo]
            fresh_keys += keys[start:lo]
            skipped += hi - lo
            start = hi
        fresh_tails += tails[start:]
        fresh_keys += keys[start:]
        self.duplicates += skipped
        return fresh_tails, fresh_keys, skipped, fresh_runs

    def _trim(self) -> None:
        """Forget the least recently used origins past :attr:`limit`."""
        high = self._high
        if len(high) > self.limit:
            forgotten = self._forgotten
            for key in list(islice(high, len(high) - self.limit)):
                del high[key]
                if forgotten is not None:
                    forgotten(key[1], key[2])
