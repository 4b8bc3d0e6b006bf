"""How long to wait before trying to connect again: exponential backoff
with full jitter, for the clients' reconnection and the workers' links.

Attempt *n* (from 0) waits a uniformly random time between 0 and
``min(most, first * 2**n)``. Without the jitter, every client of a broker
that restarts tries again at the same instants (0.05 s, 0.15 s, 0.35 s, ...
after the break) and they arrive together, attempt after attempt; with it
they spread over each interval, and the expected wait is half the
ceiling. Sans-IO: no clock, no sleeping; the caller waits.
"""

from __future__ import annotations

import random
from collections.abc import Callable

__all__ = ["BACKOFF_FIRST", "BACKOFF_MOST", "Backoff"]

#: The first ceiling, in seconds (doubled after each attempt).
BACKOFF_FIRST = 0.05
#: The highest ceiling, in seconds.
BACKOFF_MOST = 2.0


class Backoff:
    """The waits between attempts: :meth:`next` for the next one,
    :meth:`reset` after a success. ``uniform`` draws from [0, 1) (tests
    pass their own; ``lambda: 1.0`` gives the ceilings themselves)."""

    __slots__ = ("_ceiling", "_uniform", "first", "most")

    def __init__(
        self,
        first: float = BACKOFF_FIRST,
        most: float = BACKOFF_MOST,
        *,
        uniform: Callable[[], float] = random.random,
    ) -> None:
        if not 0 < first <= most:
            raise ValueError(f"backoff needs 0 < first <= most (got {first} and {most})")
        self.first = first
        self.most = most
        self._uniform = uniform
        self._ceiling = first

    @property
    def ceiling(self) -> float:
        """The longest the next wait can be."""
        return self._ceiling

    def next(self) -> float:
        """The wait before the next attempt (the ceiling doubles after it)."""
        wait = self._ceiling * self._uniform()
        self._ceiling = min(self._ceiling * 2, self.most)
        return wait

    def reset(self) -> None:
        """An attempt succeeded: the next wait is short again."""
        self._ceiling = self.first
