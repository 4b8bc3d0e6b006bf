"""Walks: generators that yield where the event loop may take a turn, and
what runs them (at once, or with a trio checkpoint at each yield)."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Generator
from typing import Generic, TypeVar

import trio

T = TypeVar("T")
#: A walk: a generator that yields where the loop may take a turn, and returns its result.
Walk = Generator[None, None, T]


def run_now(walk: Walk[T]) -> T:
    """The result of ``walk``, run to its end without giving the loop a turn."""
    try:
        while True:
            next(walk)
    except StopIteration as stop:
        result: T = stop.value
        return result


async def run_in_pieces(walk: Walk[T]) -> T:
    """The result of ``walk``, with a trio checkpoint wherever it yields."""
    try:
        while True:
            next(walk)
            await trio.lowlevel.checkpoint()
    except StopIteration as stop:
        result: T = stop.value
        return result


class Best(Generic[T]):
    """The ``n`` items offered with the largest keys (ties: the first offered)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self._heap: list[tuple[tuple[float, ...], int, T]] = []
        self._offered = itertools.count()

    def offer(self, key: tuple[float, ...], item: T) -> None:
        entry = (key, -next(self._offered), item)
        if len(self._heap) < self.n:
            heapq.heappush(self._heap, entry)
        elif self._heap and self._heap[0][:2] < entry[:2]:
            heapq.heapreplace(self._heap, entry)

    def best(self) -> list[T]:
        """The items kept, the largest key first."""
        return [item for *_, item in sorted(self._heap, key=lambda e: e[:2], reverse=True)]
