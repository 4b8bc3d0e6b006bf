"""Property: for random actor graphs and event sequences, every account's debt
equals the cost of the loans charged to it (or below it) that are not yet
repaid, at every point the driver can observe; and it returns to zero once
every actor is idle."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accounts import Account
from actors import Actor, Turn, open_system
from tests.hypothesis_profiles import examples

EVENT_COST = 3


@dataclass(frozen=True)
class Event:
    cost: int


class Node(Actor):
    """Forwards each event to its successors (each with its own cost); an
    async node also yields to the scheduler in the middle of its turn."""

    def __init__(self, successors: list[tuple[int, int]], is_async: bool) -> None:
        self.successors = successors
        self.is_async = is_async
        self.peers: list[Node] = []
        self.in_turn: tuple[Account, int] | None = None

    def fan_out(self, turn: Turn) -> None:
        for index, cost in self.successors:
            turn.send(self.peers[index], Event(cost), cost=cost)

    def handle(self, turn: Turn, message: Any) -> Any:
        if not self.is_async:
            self.fan_out(turn)
            return None
        return self.slow_turn(turn, message)

    async def slow_turn(self, turn: Turn, message: Event) -> None:
        self.in_turn = (turn.account, message.cost + EVENT_COST)
        await trio.lowlevel.checkpoint()
        self.fan_out(turn)
        await trio.lowlevel.checkpoint()
        self.in_turn = None


@st.composite
def graphs(draw: st.DrawFn) -> list[tuple[list[tuple[int, int]], bool]]:
    """A DAG (edges go to higher indices, so every event dies out)."""
    n = draw(st.integers(2, 6))
    nodes = []
    for i in range(n):
        edges: list[tuple[int, int]] = []
        if i + 1 < n:
            edge = st.tuples(st.integers(i + 1, n - 1), st.integers(0, 50))
            edges = draw(st.lists(edge, max_size=4))
        nodes.append((edges, draw(st.booleans())))
    return nodes


steps = st.lists(
    st.one_of(
        # (inject, node, account, cost)
        st.tuples(st.just("inject"), st.integers(0, 5), st.integers(0, 3), st.integers(0, 60)),
        st.tuples(st.just("yield"), st.integers(1, 5)),
    ),
    max_size=40,
)


def outstanding(account: Account, nodes: list[Node]) -> int:
    """What the runtime says is lent below ``account``: loans in mailboxes,
    and the event of every turn in progress."""
    total = 0
    for node in nodes:
        for loan in list(node._mailbox) + list(node._signals):
            if account in loan.account._chain:
                total += loan.amount
        if node.in_turn is not None and account in node.in_turn[0]._chain:
            total += node.in_turn[1]
    return total


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=graphs(), script=steps)
def test_debt_is_exactly_the_unrepaid_loans(
    graph: list[tuple[list[tuple[int, int]], bool]], script: list[tuple[Any, ...]]
) -> None:
    async def main() -> None:
        # A lost repayment would leave a reader waiting forever: fail instead.
        with trio.fail_after(10):
            await run_script()

    async def run_script() -> None:
        root = Account("conn", high_watermark=400, low_watermark=100, event_cost=EVENT_COST)
        left = Account("left", high_watermark=150, low_watermark=50, parent=root)
        right = Account("right", high_watermark=10**6, low_watermark=0, parent=root)
        leaf = Account("leaf", high_watermark=60, low_watermark=0, parent=left)
        accounts = [root, left, right, leaf]
        async with open_system() as system:
            nodes = [system.spawn(Node(edges, is_async)) for edges, is_async in graph]
            for node in nodes:
                node.peers = nodes

            def check() -> None:
                for account in accounts:
                    stats = account.statistics()
                    assert account.debt == outstanding(account, nodes), account
                    assert stats.borrowed_total - stats.repaid_total == account.debt
                    assert stats.debt <= stats.peak_debt

            for step in script:
                if step[0] == "inject":
                    _, index, which, cost = step
                    account = accounts[which]
                    # Like a reader: wait for funds, then hand over the event.
                    await nodes[index % len(nodes)].send(Event(cost), account=account, cost=cost)
                else:
                    for _ in range(step[1]):
                        await trio.lowlevel.checkpoint()
                check()
            await trio.testing.wait_all_tasks_blocked()
            check()
            for account in accounts:
                assert account.debt == 0, account
                assert account.statistics().loans == 0

    trio.run(main)
