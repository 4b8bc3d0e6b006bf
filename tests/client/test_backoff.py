"""``broker.backoff.Backoff``: exponential ceilings, full jitter under
them, a reset after a success; and the client's reconnection plan waits
as it says (clients of a broker that restarts spread out)."""

from __future__ import annotations

import random

import pytest

from broker.backoff import BACKOFF_FIRST, BACKOFF_MOST, Backoff
from broker.client import ConnectionLost
from broker.client._resume import ReconnectPlan


def test_the_ceilings_double_up_to_the_most() -> None:
    backoff = Backoff(0.05, 2.0, uniform=lambda: 1.0)
    waits = [backoff.next() for _ in range(9)]
    assert waits == [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0, 2.0]
    backoff.reset()
    assert backoff.ceiling == 0.05 and backoff.next() == 0.05


def test_each_wait_is_drawn_under_its_ceiling() -> None:
    draws = iter([0.5, 0.0, 0.25])
    backoff = Backoff(0.1, 1.0, uniform=lambda: next(draws))
    assert [backoff.next() for _ in range(3)] == [0.05, 0.0, 0.1]


def test_clients_that_break_together_do_not_come_back_together() -> None:
    """100 clients of one broker, each with its own random stream: their
    third attempts spread over the third interval instead of all landing
    at 0.35 s after the break (as they did without jitter)."""
    rng = random.Random(42)
    thirds = []
    for _ in range(100):
        plan = ReconnectPlan(now=0.0, reconnect=60.0, backoff=Backoff(uniform=rng.random))
        now = 0.0
        for _ in range(3):
            assert plan.failed(ConnectionLost("refused by the OS"), now) is None
            now = plan.next_attempt
        thirds.append(now)
    assert all(0.0 <= at <= 0.35 for at in thirds)
    assert len({round(at, 3) for at in thirds}) > 50
    spread = max(thirds) - min(thirds)
    assert spread > 0.15, spread


def test_the_defaults_and_bad_bounds() -> None:
    backoff = Backoff()
    assert backoff.ceiling == BACKOFF_FIRST
    assert all(0.0 <= backoff.next() <= BACKOFF_MOST for _ in range(20))
    with pytest.raises(ValueError, match="0 < first <= most"):
        Backoff(2.0, 1.0)
