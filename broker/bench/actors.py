"""Benchmark: loaned sends through actor mailboxes.

Measures, in one process on one trio thread:

- ``task_to_actor``: a producer task sends events to an actor with
  ``send_nowait`` on a watermarked account, checking funds between events
  (the socket reader's pattern), and the actor handles them;
- ``actor_to_actor``: the producer sends actor A one event per 100; each of
  A's turns sends 100 events to actor B (loaned sends inside a turn, charged
  to the triggering event's account). The figure counts A-to-B sends (each
  borrowed, queued, handled by B and repaid) per second;
- ``pipeline_2_hops``: the producer feeds A, which forwards every event to B;
  the figure counts events per second through both hops (two loaned sends
  and two turns each);
- ``fanout_1_to_10``: A forwards every event to ten actors; the figure counts
  deliveries per second.

Each event costs one borrow, one mailbox hop and one repay per hop.
"""

from __future__ import annotations

import time
from typing import Any

import trio
import trio.lowlevel

from accounts import Account
from actors import Actor, Turn, open_system

from ._yardstick import python_loop_10m_s

PAYLOAD = b"x" * 100


class _Sink(Actor):
    def __init__(self) -> None:
        self.count = 0

    def handle(self, turn: Turn, message: Any) -> None:
        self.count += 1


class _Burst(Actor):
    def __init__(self, target: Actor, size: int) -> None:
        self.target = target
        self.size = size

    def handle(self, turn: Turn, message: Any) -> None:
        for _ in range(self.size):
            turn.send(self.target, message, cost=len(message))


class _Forward(Actor):
    def __init__(self, targets: list[Actor]) -> None:
        self.targets = targets

    def handle(self, turn: Turn, message: Any) -> None:
        for target in self.targets:
            turn.send(target, message, cost=len(message))


async def _drive(
    n: int, first: Actor, sinks: list[_Sink], account: Account, expected: int
) -> float:
    start = time.perf_counter()
    for i in range(n):
        if not account.is_clear():
            await account.ensure_clear_funds()
        first.send_nowait(PAYLOAD, account=account, cost=len(PAYLOAD))
        if i % 256 == 255:
            await trio.lowlevel.checkpoint()  # where a socket read would be
    while any(sink.count < expected for sink in sinks):
        await trio.lowlevel.checkpoint()
    elapsed = time.perf_counter() - start
    assert account.debt == 0, account
    return elapsed


BURST = 100


async def _scenario(n: int, shape: str) -> float:
    """Time ``n`` events (sends into the last hop) through ``shape``."""
    account = Account("bench", high_watermark=1 << 20, low_watermark=1 << 19)
    async with open_system("bench") as system:
        if shape == "task_to_actor":
            sink = system.spawn(_Sink())
            elapsed = await _drive(n, sink, [sink], account, n)
        elif shape == "actor_to_actor":
            sink = system.spawn(_Sink())
            burst = system.spawn(_Burst(sink, BURST))
            elapsed = await _drive(n // BURST, burst, [sink], account, n // BURST * BURST)
        elif shape == "pipeline_2_hops":
            sink = system.spawn(_Sink())
            forward = system.spawn(_Forward([sink]))
            elapsed = await _drive(n, forward, [sink], account, n)
        else:
            sinks = [system.spawn(_Sink()) for _ in range(10)]
            forward = system.spawn(_Forward(list(sinks)))
            elapsed = await _drive(n // 10, forward, sinks, account, n // 10)
    account.close()
    return elapsed


def run(quick: bool = False) -> dict[str, Any]:
    """Run the suite; figures are per second, medians of 3 runs (1 if quick)."""
    n = 20_000 if quick else 300_000
    shapes = ["task_to_actor", "actor_to_actor", "pipeline_2_hops", "fanout_1_to_10"]
    result: dict[str, Any] = {"python_loop_10m_s": python_loop_10m_s(), "events_per_run": n}
    for shape in shapes:
        rates = sorted(n / trio.run(_scenario, n, shape) for _ in range(1 if quick else 3))
        result[f"{shape}_per_s"] = rates[len(rates) // 2]
    return result
