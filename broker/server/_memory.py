"""Giving memory back after a burst: the broker's RSS follows its debt down.

Every byte the broker holds for clients is debt on its root account. After a
burst (a large staged batch committed and delivered, a backlog drained) the
debt falls back, but the C allocator keeps the freed heap pages for reuse,
so the process's RSS would stay at its peak. :class:`MemoryReturn` watches
the debt and, once it has fallen ``threshold`` bytes below its peak since
the last return and stopped falling, asks for the free pages to be handed back
(:func:`broker.runtime.release_free_memory`, in a worker thread).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import trio

from broker.runtime import release_free_memory

#: How far the debt must fall below its peak before memory is handed back.
RETURN_AFTER_BYTES = 32 * 1024 * 1024
#: How often the debt is looked at (seconds).
CHECK_EVERY = 2.0


class Debtor(Protocol):
    """What is watched: an account's current debt in bytes."""

    @property
    def debt(self) -> int: ...


class MemoryReturn:
    """Decides when freed memory is worth handing back (see the module)."""

    def __init__(self, account: Debtor, threshold: int = RETURN_AFTER_BYTES) -> None:
        self.account = account
        self.threshold = threshold
        self.peak = account.debt
        self._last = account.debt
        #: Times memory was handed back.
        self.returns = 0

    def due(self) -> bool:
        """Record the debt now; True once it has fallen ``threshold`` below
        the peak since the last return and stopped falling (a drain under
        way frees more: one return at its end gives back all of it). This
        then counts as done."""
        debt = self.account.debt
        falling = debt < self._last
        self._last = debt
        if debt > self.peak:
            self.peak = debt
            return False
        if falling or self.peak - debt < self.threshold:
            return False
        self.peak = debt
        self.returns += 1
        return True

    async def run(
        self,
        every: float = CHECK_EVERY,
        release: Callable[[], bool] = release_free_memory,
    ) -> None:
        """Look every ``every`` seconds, and hand memory back when due (forever)."""
        while True:
            await trio.sleep(every)
            if self.due():
                await trio.to_thread.run_sync(release)
