"""Room for receive buffers across connections: the broker's ``global_budget``.

Each connection decides its own channels' room (``_budget``), and shrinks
its own idle channels when its budget is short. The broker's budget is
shared: once the channels of all connections have reserved it, a new
channel is *starved* however idle the others are (at the defaults, about a
thousand connections that each published once and stayed connected left
every later publisher waiting). The pool closes that gap:

- a connection whose new channel starves because the *broker's* budget is
  short (not its own or its principal's) asks the pool, which has other
  connections shrink their *quiet* publish channels (nothing buffered, no
  publish for ``IDLE_AFTER``) towards one frame, pleading with their
  clients to give the room back, until enough is on its way;
- once room is freed anywhere (a shrink completes, a handle or a connection
  goes), the pool has the waiting connections fund their starved channels,
  oldest waiter first, from its own task (never inside another
  connection's bookkeeping).

A channel shrunk so takes its room back when its client publishes again
(``note_busy``), from channels quiet by then: its own connection's, or
others' through the pool (:meth:`BudgetPool.reclaim_for`).
"""

from __future__ import annotations

import itertools
from typing import Protocol

import trio

__all__ = ["SCAN", "BudgetPool", "PoolMember"]

#: Most connections one ask looks at.
SCAN = 256
#: How often (seconds) the pool asks again for room while connections wait:
#: a channel is quiet (may be shrunk for another) a second after its last
#: publish (``_budget.IDLE_AFTER``).
RETRY = 1.0


class PoolMember(Protocol):
    """A connection's budget, as the pool sees it."""

    def reclaim_quiet(self, needed: int) -> int:
        """Shrink quiet publish channels for ``needed`` bytes; returns the
        bytes pleaded back (and has the connection send its Pleads)."""
        ...

    def fund_starved(self) -> bool:
        """Fund starved channels that room now allows (and have the
        connection send what that queued); whether some are still starved."""
        ...


class BudgetPool:
    """The connections sharing one broker's budget (see the module)."""

    def __init__(self) -> None:
        #: Every connection's budget; those asked to reclaim least recently first.
        self._members: dict[PoolMember, None] = {}
        #: Members with channels starved for want of the broker's budget
        #: (oldest first), and the bytes they lack.
        self._waiting: dict[PoolMember, int] = {}
        self._freed = trio.Event()
        #: Counters (for statistics): reclaims asked, bytes pleaded back for them.
        self.reclaims = 0
        self.reclaimed_bytes = 0

    def add(self, member: PoolMember) -> None:
        self._members[member] = None

    def remove(self, member: PoolMember) -> None:
        self._members.pop(member, None)
        self._waiting.pop(member, None)

    @property
    def waiting(self) -> int:
        """Connections with channels starved for want of the broker's budget."""
        return len(self._waiting)

    def short(self, member: PoolMember, needed: int) -> None:
        """``member`` has channels starved for want of ``needed`` bytes of the
        broker's budget: wait for room, and have quiet channels elsewhere
        give some back (asked again every ``RETRY`` seconds while it waits:
        channels busy now may be quiet then)."""
        self._waiting[member] = needed
        self._reclaim(needed)
        self._freed.set()  # (the run task starts its timer)

    def reclaim_for(self, member: PoolMember, needed: int) -> None:
        """``member``'s busy channel, shrunk before for another, wants
        ``needed`` bytes back: quiet channels elsewhere give some back (it
        takes them as it next grows)."""
        self._reclaim(needed, also_skip=member)

    def _reclaim(self, needed: int, also_skip: PoolMember | None = None) -> None:
        self.reclaims += 1
        members = self._members
        # At most SCAN members per ask, each moved to the end once looked at:
        # the next ask starts where this one stopped (no quadratic rescans).
        for other in list(itertools.islice(members, SCAN)):
            if needed <= 0:
                break
            del members[other]
            members[other] = None
            if other in self._waiting or other is also_skip:
                continue
            pleaded = other.reclaim_quiet(needed)
            needed -= pleaded
            self.reclaimed_bytes += pleaded

    def freed(self) -> None:
        """Some connection's reserved room went down."""
        if self._waiting:
            self._freed.set()

    async def run(self) -> None:
        """Fund waiting connections as room frees up, and ask for room again
        every ``RETRY`` seconds while some wait, until cancelled."""
        while True:
            if self._waiting:
                with trio.move_on_after(RETRY) as timer:
                    await self._freed.wait()
            else:
                await self._freed.wait()
                timer = None
            self._freed = trio.Event()
            waiting = self._waiting
            for member in list(waiting):
                if member in waiting and not member.fund_starved():
                    del waiting[member]
            if waiting and timer is not None and timer.cancelled_caught:
                self._reclaim(sum(waiting.values()))
