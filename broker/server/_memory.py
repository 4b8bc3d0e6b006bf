"""Giving memory back after a burst: the broker's RSS follows its debt down.

Every byte the broker holds for clients is debt on its root account. After a
burst (a large staged batch committed and delivered, a backlog drained) the
debt falls back, but the C allocator keeps the freed heap pages for reuse,
so the process's RSS would stay at its peak. :class:`MemoryReturn` watches
the debt and, once it has fallen ``threshold`` bytes below its peak since
the last return and stopped moving, asks for the free pages to be handed back
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
    """What is watched: an account's current debt in bytes, and the largest
    it has had."""

    @property
    def debt(self) -> int: ...

    @property
    def peak_debt(self) -> int: ...


class MemoryReturn:
    """Decides when freed memory is worth handing back (see the module)."""

    def __init__(self, account: Debtor, threshold: int = RETURN_AFTER_BYTES) -> None:
        self.account = account
        self.threshold = threshold
        self.peak = account.debt
        self._last = account.debt
        #: The account's own peak at the last look: a burst between two
        #: looks that set a new record is seen through it, however short.
        self._record = account.peak_debt
        #: Times memory was handed back.
        self.returns = 0

    def due(self) -> bool:
        """Record the debt now; True once it has fallen ``threshold`` below
        the peak since the last return and stayed put between two looks (a
        drain or a commit under way moves it: one return at its end gives
        back all of it, where a return half-way would leave the rest below
        the threshold). This then counts as done."""
        account = self.account
        debt = account.debt
        record = account.peak_debt
        if record > self._record:
            self._record = record
            self.peak = max(self.peak, record)
        moving = debt != self._last
        self._last = debt
        if debt > self.peak:
            self.peak = debt
            return False
        if moving or self.peak - debt < self.threshold:
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
