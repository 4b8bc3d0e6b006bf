"""Busy publish channels short of room (``ConnectionBudget.note_busy``):
when a look finds no room to grow into, the other busy channels do not
each survey every channel again for ``GROW_EVERY`` (a client publishing
round-robin to 100 topics made 100 surveys of 100 channels a period); a
freed handle makes the next one look at once.

The budget runs over a sans-IO broker connection (``ConnectionPair``)
under trio's ``MockClock``, which the tests move a period at a time."""

from __future__ import annotations

import pytest
import trio
from trio.testing import MockClock

from broker.config import BrokerConfig, KiB
from broker.protocol import Channel, ChannelKind, HandleType
from broker.server.connection import _budget as budget_module
from broker.server.connection._budget import GROW_EVERY, ConnectionBudget
from broker.server.connection._policy import BrokerPolicy
from tests.protocol.pair import ConnectionPair

FRAME = 1024
FULL = 8 * KiB
#: Three channels at full capacity and seven at one frame each, exactly.
CONFIG = BrokerConfig(
    max_frame=FRAME,
    publish_capacity=FULL,
    bind_capacity=FRAME,
    connection_budget=2 * FRAME + 3 * FULL + 7 * (FRAME + 64),
)


class _Ledger:
    """A broker with room to spare: only the connection's budget binds."""

    def __init__(self) -> None:
        self.buffer_reserved = 0

    def reserve(self, amount: int) -> None:
        self.buffer_reserved += amount

    def spare_budget(self) -> int:
        return 1 << 40

    def broker_spare(self) -> int:
        return 1 << 40


def _busy_connection() -> tuple[ConnectionBudget, ConnectionPair, list[Channel]]:
    budget = ConnectionBudget(CONFIG, _Ledger())
    pair = ConnectionPair(broker_policy=BrokerPolicy(budget, lambda _index: False), handshake=False)
    budget.protocol = pair.broker
    pair.handshake()
    handles = [pair.client.bind_topic(f"t.{index}") for index in range(10)]
    pair.run()
    budget.settle()
    pair.run()
    channels = [Channel(ChannelKind.PUBLISH, handle) for handle in handles]
    return budget, pair, channels


def _count_surveys(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls = [0]
    survey = ConnectionBudget._survey

    def counted(self: ConnectionBudget) -> tuple[int, bool, int]:
        calls[0] += 1
        return survey(self)

    monkeypatch.setattr(budget_module.ConnectionBudget, "_survey", counted)
    return calls


def _period(
    budget: ConnectionBudget, pair: ConnectionPair, channels: list[Channel], clock: MockClock
) -> None:
    """A period later, every channel busy (as the dispatcher notes them,
    at trio's time); then what the connection does after a read (settle)
    and the client's answers (absolving shrinks)."""
    clock.jump(GROW_EVERY + 0.01)
    now = trio.current_time()
    for channel in channels:
        budget.note_busy(channel, now)
    budget.settle()
    pair.run()


def _steady(
    budget: ConnectionBudget, pair: ConnectionPair, channels: list[Channel], clock: MockClock
) -> None:
    """Busy periods until the capacities stop changing."""
    capacities: list[int] = []
    for _ in range(50):
        _period(budget, pair, channels, clock)
        after = [pair.broker.receiver(c).capacity for c in channels]
        if after == capacities:
            return
        capacities = after
    raise AssertionError(f"the capacities keep changing: {capacities}")


async def test_busy_channels_without_room_look_once_a_period(
    monkeypatch: pytest.MonkeyPatch, mock_clock: MockClock
) -> None:
    budget, pair, channels = _busy_connection()
    _steady(budget, pair, channels, mock_clock)
    short = [c for c in channels if pair.broker.receiver(c).capacity < FULL]
    assert len(short) >= 5, [pair.broker.receiver(c).capacity for c in channels]
    surveys = _count_surveys(monkeypatch)
    for _ in range(3):
        before = surveys[0]
        _period(budget, pair, channels, mock_clock)
        # One short channel looked (and found no room); the others waited.
        assert 1 <= surveys[0] - before <= 3, surveys[0] - before


async def test_a_freed_handle_lets_a_busy_channel_grow_at_its_next_look(
    mock_clock: MockClock,
) -> None:
    budget, pair, channels = _busy_connection()
    _steady(budget, pair, channels, mock_clock)
    full = [c for c in channels if pair.broker.receiver(c).capacity >= FULL]
    short = [c for c in channels if pair.broker.receiver(c).capacity < FULL]
    assert full and short
    _period(budget, pair, channels, mock_clock)  # (no room: the connection waits a period)
    # A full channel's handle goes: its room is the connection's again.
    gone = full[0]
    pair.client.free_handle(HandleType.TOPIC, gone.index)
    pair.run()
    budget.forget(gone)
    budget.settle()
    pair.run()
    before = [pair.broker.receiver(c).capacity for c in short]
    # The next due channel looks (and finds the room).
    _period(budget, pair, short, mock_clock)
    after = [pair.broker.receiver(c).capacity for c in short]
    assert sum(after) >= sum(before) + FULL - FRAME - 64, (before, after)
