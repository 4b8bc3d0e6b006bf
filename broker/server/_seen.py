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

The table lives in the owner's memory and is bounded (least recently
used origins are forgotten first): it covers a forwarding worker's death,
not the owner's own (after which a publish routed and not yet confirmed
may be stored twice, as for a single broker).
"""

from __future__ import annotations

from itertools import islice

from broker.protocol import OriginRun

__all__ = ["ORIGINS_KEPT", "SeenOrigins"]

#: Origins a worker remembers, over all its topics.
ORIGINS_KEPT = 1 << 16


class SeenOrigins:
    """Per (topic, session, handle): the highest publish index taken."""

    def __init__(self, limit: int = ORIGINS_KEPT) -> None:
        self.limit = limit
        #: In least recently used order (each use moves an origin to the end).
        self._high: dict[tuple[str, bytes, int], int] = {}
        #: Publishes not passed on because they had been taken already.
        self.duplicates = 0

    def __len__(self) -> int:
        return len(self._high)

    def take(
        self, topic: str, origins: list[OriginRun], tails: list[bytes], keys: list[bytes | None]
    ) -> tuple[list[bytes], list[bytes | None], int] | None:
        """Note the publishes of ``origins`` (runs of ``tails`` and
        ``keys``) as taken for ``topic``. None if none was taken before;
        else the tails and keys not taken before, in order, and how many
        were left out."""
        high = self._high
        skip: list[tuple[int, int]] = []
        pos = 0
        for session, handle, first, count in origins:
            if session:
                key = (topic, session, handle)
                seen = high.pop(key, 0)  # (put back at the end: the most recent)
                last = first + count - 1
                if seen >= first:
                    skip.append((pos, pos + min(seen, last) - first + 1))
                high[key] = max(seen, last)
            pos += count
        if len(high) > self.limit:
            for key in list(islice(high, len(high) - self.limit)):
                del high[key]
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
        return fresh_tails, fresh_keys, skipped
