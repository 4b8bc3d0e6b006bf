"""A commit being routed (``_commit``), as the broker's services hold it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import trio

__all__ = ["CommitInFlight"]


@dataclass(slots=True, eq=False)
class CommitInFlight:
    """A commit being routed: ``waiters`` are called once it is all routed
    (its own answer, and those of the same commit sent again meanwhile),
    then ``routed`` is set (also if it was cut off)."""

    routed: trio.Event = field(default_factory=trio.Event)
    waiters: list[Callable[[], None]] = field(default_factory=list)
