"""The broker's policy is pure while the protocol handles a read.

``BrokerPolicy.initial_capacity`` runs inside ``Connection.receive_data``
(a BindTopic opens a publish channel): it quotes the channel's capacity
from a snapshot of the budget and reads no clock, writes no ledger. What it
granted is booked (``ConnectionBudget.book``: the ledger, the starved queue
and its times) by the connection once ``receive_data`` has returned.

Sans-IO: a :class:`ConnectionPair` with the broker's policy over a budget
whose ledger and clock count what touches them.
"""

from __future__ import annotations

import pytest

from broker.config import BrokerConfig
from broker.protocol import Channel, ChannelKind
from broker.server.connection import _budget as budget_module
from broker.server.connection._budget import ConnectionBudget
from broker.server.connection._policy import BrokerPolicy
from tests.protocol.pair import ConnectionPair

FRAME = 1024
FULL = 8 * 1024
ONE_FRAME = FRAME + 64
#: Both bind channels, two publish channels in full and one at one frame:
#: a fourth channel starves, and a fifth queues behind it.
CONFIG = BrokerConfig(
    max_frame=FRAME,
    publish_capacity=FULL,
    bind_capacity=FRAME,
    connection_budget=2 * FRAME + 2 * FULL + ONE_FRAME + 100,
)
NOW = 1234.5


class _Ledger:
    """A broker with room to spare; counts the writes."""

    def __init__(self) -> None:
        self.buffer_reserved = 0
        self.writes = 0

    def reserve(self, amount: int) -> None:
        self.writes += 1
        self.buffer_reserved += amount

    def spare_budget(self) -> int:
        return (1 << 40) - self.buffer_reserved

    def broker_spare(self) -> int:
        return (1 << 40) - self.buffer_reserved


class _Clock:
    """Stands in for ``trio`` in the budget's module: counts clock reads."""

    def __init__(self) -> None:
        self.reads = 0

    def current_time(self) -> float:
        self.reads += 1
        return NOW


def test_the_policy_reads_no_clock_and_writes_no_ledger_inside_receive_data(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = _Clock()
    monkeypatch.setattr(budget_module, "trio", clock)
    ledger = _Ledger()
    budget = ConnectionBudget(CONFIG, ledger)
    pair = ConnectionPair(broker_policy=BrokerPolicy(budget, lambda _index: False), handshake=False)
    budget.protocol = pair.broker
    pair.handshake()
    budget.settle()  # (books the bind channels the Welcome opened)
    pair.run()
    assert budget.capacity_in_use() == 2 * FRAME

    handles = [pair.client.bind_topic(f"t.{index}") for index in range(5)]
    pair.flush()
    data = b"".join(pair.wire_to_broker)
    pair.wire_to_broker.clear()
    reads, writes, reserved = clock.reads, ledger.writes, ledger.buffer_reserved

    pair.broker.receive_data(data, pair.now)  # the five binds, in one read

    assert (clock.reads, ledger.writes) == (reads, writes)  # neither clock nor ledger
    assert ledger.buffer_reserved == reserved
    assert not budget.starved
    channels = [Channel(ChannelKind.PUBLISH, handle) for handle in handles]
    capacities = [pair.broker.receiver(channel).capacity for channel in channels]
    assert capacities == [FULL, FULL, ONE_FRAME, 0, 0]
    assert [grant.capacity for grant in budget.pending] == capacities

    budget.book()  # what the connection does once receive_data has returned

    assert budget.pending == []
    assert ledger.buffer_reserved == budget.capacity_in_use() == 2 * FRAME + sum(capacities)
    assert list(budget.starved.items()) == [(channels[3], NOW), (channels[4], NOW)]
    assert clock.reads > reads
