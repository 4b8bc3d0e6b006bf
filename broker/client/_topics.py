"""The topic handles a client holds, and letting go of the ones it no longer uses.

A client binds a topic on first use and keeps its handle, but a connection
can hold only so many: the broker funds a limited number of publish
channels at once (``connection_budget`` over one frame each: 63 at the
defaults), bind frames of live handles fill ``[0, 0]`` (``bind_capacity``),
and the client keeps at most ``max_topics``. So the client *releases*
(``FreeHandle``) the handle it has used least recently, preferring one with
nothing unconfirmed:

- when it holds ``max_topics`` handles and binds another;
- when a bind finds no room on ``[0, 0]``;
- when the broker opens a channel without capacity (it says ``Throttled``
  at once) and a publish waits for it: the released channel's capacity
  funds it. Such a channel nobody publishes to (a topic bound only to
  subscribe to it) is released itself: it only holds a place in the
  broker's queue.
- when it holds as many handles as the broker funded when it last had to
  starve one (for ``LEARNED_FOR`` seconds after): then the FreeHandle goes
  out with the new bind, which the freed capacity funds at once, saving a
  round trip per new topic.

A topic being released takes no new publishes until every publish made on
it is confirmed (routed); then its ``FreeHandle`` goes out, and publishing to
it again binds it anew. Per-topic order is kept: the new handle's publishes
follow messages already routed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from broker.protocol import (
    Channel,
    ChannelKind,
    Connection,
    HandleType,
    LocalProtocolError,
    NoGuarantees,
    Stage,
)

#: Topic handles a client holds at once unless told otherwise.
DEFAULT_MAX_TOPICS = 1000
#: How long the number of channels the broker funded, learned when it
#: starved one, bounds the handles held (it may fund more later).
LEARNED_FOR = 1.0

log = logging.getLogger("broker.client")


class TopicCache:
    """Topic handles by key (a topic name; the blocking client keys a staged
    topic by ``(name, stage)``), least recently used first, and their release.

    ``published`` and ``confirmed`` (handle -> count) are the client's own
    tallies: a handle is released only once ``confirmed`` covers
    ``published``, and both entries go when the handle is deleted.
    ``clock()`` is the client's monotonic time in seconds.
    """

    def __init__(
        self,
        max_topics: int,
        published: dict[int, int],
        confirmed: dict[int, int],
        clock: Callable[[], float],
    ) -> None:
        if max_topics < 1:
            raise ValueError("max_topics must be at least 1")
        self.max_topics = max_topics
        #: Usable handles by key, in least recently used order (approximately:
        #: a handle used since the last sweep is moved to the end then).
        self.handles: dict[Hashable, int] = {}
        self._published = published
        self._confirmed = confirmed
        self._clock = clock
        #: Handles being released whose FreeHandle is not sent yet.
        self._releasing: dict[int, Hashable] = {}
        self._releasing_keys: set[Hashable] = set()
        #: Handles whose FreeHandle is sent (deleted once the broker answers).
        self._freeing: set[int] = set()
        #: Released or being released handles that had capacity to give back.
        self._funding: set[int] = set()
        #: Each handle's publish count at the last sweep (-1: bound since).
        self._seen: dict[int, int] = {}
        #: Handles that must stay bound for now (a Subscribe is being made on them).
        self._pins: dict[int, int] = {}
        #: Handles whose channel the broker opened without capacity (yet).
        self._starved: set[int] = set()
        #: Handles a publish waits on for guarantees (the session adds a
        #: handle when a publish finds none, and removes it once one succeeds).
        self.wanted: set[int] = set()
        #: Channels the broker funded when it last starved one, and until when
        #: that bounds the handles held.
        self._funded = max_topics
        self._funded_until = 0.0
        #: Handles released so far, and their publish and Confirm counts.
        self.released = 0
        self.released_published = 0
        self.released_confirmed = 0

    def bind(self, conn: Connection, key: Hashable, topic: str, stage: Stage | None = None) -> int:
        """The handle of ``key`` (``topic``, staged in ``stage`` if given),
        binding it on first use: :class:`NoGuarantees` if there is no room
        for the bind (a release is under way, then), or while the key's
        previous handle is being released (it is bound anew once it is)."""
        handle = self.handles.get(key)
        if handle is not None:
            return handle
        if key in self._releasing_keys:
            raise NoGuarantees(f"topic {topic!r} is being released")
        self.before_bind(conn)
        try:
            handle = conn.bind_topic(topic, stage)
        except NoGuarantees:
            self.bind_blocked(conn)
            raise
        self.handles[key] = handle
        self._published[handle] = self._confirmed[handle] = 0
        self._seen[handle] = -1
        return handle

    def clear(self) -> None:
        """The session is gone (and its handles with it)."""
        for items in (
            self.handles,
            self._releasing,
            self._releasing_keys,
            self._freeing,
            self._funding,
            self._seen,
            self._pins,
            self._starved,
            self.wanted,
        ):
            items.clear()

    def connection_replaced(self) -> None:
        """The session resumed on a new connection: the broker funds its
        channels anew (and says again which it cannot)."""
        self._starved.clear()
        self._funded_until = 0.0

    def pin(self, handle: int) -> None:
        """Keep ``handle`` bound until :meth:`unpin` (a Subscribe names it)."""
        self._pins[handle] = self._pins.get(handle, 0) + 1

    def unpin(self, handle: int) -> None:
        count = self._pins.pop(handle, 0) - 1
        if count > 0:
            self._pins[handle] = count

    # ---------------------------------------------------------------- asking for room

    def before_bind(self, conn: Connection) -> None:
        """A new topic is about to be bound: keep within ``max_topics`` (and
        what the broker funds, if known), releasing first."""
        limit = self.max_topics
        if self._clock() < self._funded_until:
            limit = min(limit, self._funded)
        if len(self.handles) >= limit and self._retire_one(conn):
            self.pump(conn)  # (its FreeHandle goes out before the bind)

    def bind_blocked(self, conn: Connection) -> bool:
        """A bind found no room on ``[0, 0]``: release a handle unless one
        is on its way out already. True if a FreeHandle was queued."""
        if not (self._releasing or self._freeing):
            self._retire_one(conn)
        return self.pump(conn)

    def topic_of(self, channel: Channel) -> str | None:
        """The topic whose publish channel ``channel`` is (None for other channels)."""
        if channel.kind == ChannelKind.PUBLISH:
            for key, bound in self.handles.items():
                if bound == channel.index:
                    return str(key[0]) if isinstance(key, tuple) else str(key)
        return None

    def on_throttled(self, conn: Connection, channel: Channel, throttled: bool, name: str) -> None:
        """The broker says it (no longer) withholds ``channel``'s guarantees
        (logged, as client ``name``). A publish channel it opened without
        capacity makes the cache learn to hold fewer handles (and release
        one it no longer uses to make some, see :meth:`pump`)."""
        topic = self.topic_of(channel)
        if self._starving(conn, channel, throttled):
            log.debug("%s: no capacity for topic %r yet", name, topic)
        elif throttled:
            log.info("%s: the broker withholds guarantees on topic %r", name, topic)
        else:
            log.info("%s: topic %r flows again", name, topic)

    def _starving(self, conn: Connection, channel: Channel, throttled: bool) -> bool:
        """True if ``channel`` is a publish channel it opened without capacity
        (and, for the end of it, that was funded since)."""
        if channel.kind != ChannelKind.PUBLISH:
            return False
        handle = channel.index
        if not throttled:
            if handle in self._starved:
                self._starved.discard(handle)
                return True
            return False
        try:
            never_funded = conn.sender(channel).statistics().received_bytes == 0
        except LocalProtocolError:
            return False  # freed meanwhile
        if never_funded and handle not in self._starved:
            self._starved.add(handle)
            held = sum(1 for h in self.handles.values() if h not in self._starved)
            self._funded = max(held, 1)
            self._funded_until = self._clock() + LEARNED_FOR
        return never_funded

    # ---------------------------------------------------------------- releasing

    def pump(self, conn: Connection) -> bool:
        """Release what starved channels need, and send the FreeHandles of
        released handles whose publishes are all confirmed; True if any
        FreeHandle was queued."""
        if not (self._releasing or self._starved) or conn.closed:
            return False
        for handle in list(self._starved):  # starved, and nobody publishes to it
            if not (
                handle in self.wanted
                or handle in self._pins
                or handle in self._releasing
                or handle in self._freeing
            ):
                self._retire(self._key_of(handle), handle)
        deficit = len(self.wanted & self._starved) - len(self._funding)
        while deficit > 0 and self._retire_one(conn):
            deficit -= 1
        queued = False
        for handle, key in list(self._releasing.items()):
            if self._pins.get(handle) or self._confirmed.get(handle, 0) < self._published.get(
                handle, 0
            ):
                continue
            try:
                conn.free_handle(HandleType.TOPIC, handle)
            except LocalProtocolError:
                continue  # not confirmed yet, or a Subscribe naming it is not: later
            del self._releasing[handle]
            self._releasing_keys.discard(key)
            self._freeing.add(handle)
            queued = True
        return queued

    def _key_of(self, handle: int) -> Hashable | None:
        for key, bound in self.handles.items():
            if bound == handle:
                return key
        return None

    def _retire(self, key: Hashable | None, handle: int) -> None:
        """Mark ``handle`` (bound to ``key``) for release: publishes to the
        key wait until its FreeHandle is sent."""
        if key is None:
            return  # being released already
        del self.handles[key]
        self._seen.pop(handle, None)
        self._releasing[handle] = key
        self._releasing_keys.add(key)
        if handle not in self._starved:
            self._funding.add(handle)

    def _retire_one(self, conn: Connection) -> bool:
        """Mark the least recently used releasable handle with capacity for
        release (one with nothing unconfirmed if there is such); False if
        there is none."""
        victim = self._victim(conn)
        if victim is None:
            return False
        self._retire(victim, self.handles[victim])
        return True

    def _victim(self, conn: Connection) -> Hashable | None:
        busy: Hashable | None = None
        for sweep in range(2):
            for key, handle in list(self.handles.items()):
                if handle in self._pins or handle in self._starved:
                    continue
                count = self._published.get(handle, 0)
                if self._seen.get(handle) != count and sweep == 0:
                    # Used since the last sweep: a second chance, at the end.
                    self._seen[handle] = count
                    del self.handles[key]
                    self.handles[key] = handle
                    continue
                if not conn.confirmed(HandleType.TOPIC, handle):
                    continue
                if self._confirmed.get(handle, 0) >= count:
                    return key
                if busy is None:
                    busy = key
            if busy is not None:
                return busy
        return None

    # ---------------------------------------------------------------- deleted

    def on_deleted(self, handle: int) -> None:
        """Topic ``handle`` is deleted (released, freed by the broker, or its
        bind undone): forget it."""
        if handle in self._freeing:
            self._freeing.discard(handle)
        else:  # not released by us: forget its key too
            self.on_free_proposed(handle)
        for items in (self._funding, self._starved, self.wanted):
            items.discard(handle)
        self._seen.pop(handle, None)
        self._pins.pop(handle, None)
        key = self._releasing.pop(handle, None)
        if key is not None:
            self._releasing_keys.discard(key)
        self.released += 1
        self.released_published += self._published.pop(handle, 0)
        self.released_confirmed += self._confirmed.pop(handle, 0)

    def on_free_proposed(self, handle: int) -> None:
        """The broker proposed freeing topic ``handle``: publish anew on a new one."""
        key = self._key_of(handle)
        if key is not None:
            del self.handles[key]

    def statistics(self) -> dict[str, int]:
        """Messages published and confirmed (released handles included), and
        topic handles held and released."""
        return {
            "published": sum(self._published.values()) + self.released_published,
            "confirmed": sum(self._confirmed.values()) + self.released_confirmed,
            "topics": len(self.handles),
            "topics_released": self.released,
        }


@dataclass(frozen=True, slots=True)
class FlushTargets:
    """What a flush waits for: the publishes made before it, per topic
    handle, in the session as it was (``sessions_lost`` then)."""

    sessions_lost: int
    counts: dict[int, int]


def covered(
    targets: FlushTargets | dict[int, int],
    confirmed: dict[int, int],
    published: dict[int, int],
    sessions_lost: int,
) -> bool:
    """The ``confirmed`` counts cover ``targets`` (a handle released since
    had all its publishes confirmed). Targets taken before a lost session
    count no more: what was unconfirmed then was published again in the new
    session (with new counts, maybe under the same handles), and it is
    everything ``published`` now that must be confirmed (a flush waited for
    ever on the old counts)."""
    if isinstance(targets, FlushTargets):
        stale = targets.sessions_lost != sessions_lost
        targets = published if stale else targets.counts
    return all(confirmed.get(h, n) >= n for h, n in targets.items())
