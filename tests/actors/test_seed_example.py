"""The example of the seed "internal flow control in message brokers", pinned.

A reads publications from a source; it stops reading while its account owes
more than 5 units. Every forwarded event costs 1 unit. M goes to D (+1); D
fans out nine M' to O1..O9 (+9) and D's receipt of M repays 1, so A's account
shows 9 outstanding. O1..O9 are busy, so A stops reading; as each O handles
its M' the debt falls, and A resumes at its low watermark (3 here).
"""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from accounts import Account
from actors import Actor, Turn, open_system


class Reader(Actor):
    """A: forwards each publication from its source to D, checking funds
    between reading an event and forwarding it, as a socket reader does
    between frames."""

    def __init__(self, source: trio.MemoryReceiveChannel[str], d: Actor, account: Account) -> None:
        self.source = source
        self.d = d
        self.account = account
        self.forwarded: list[str] = []

    async def started(self) -> None:
        self.start_soon(self.read_loop)

    async def read_loop(self) -> None:
        while True:
            message = await self.source.receive()
            await self.account.ensure_clear_funds()
            self.d.send_nowait(message, account=self.account, cost=0)
            self.forwarded.append(message)


class Dataspace(Actor):
    """D: fans every event out to its peers, in the event's turn."""

    def __init__(self, peers: list[Actor], account: Account) -> None:
        self.peers = peers
        self.account = account
        self.debt_at_fanout: list[int] = []

    def handle(self, turn: Turn, message: Any) -> None:
        for peer in self.peers:
            turn.send(peer, f"{message}'")
        # Outbound loans are charged before the inbound one is repaid.
        self.debt_at_fanout.append(self.account.debt)


class Peer(Actor):
    """O: busy with a slow job until its gate opens, then handles M' quickly."""

    def __init__(self) -> None:
        self.gate = trio.Event()
        self.handled: list[str] = []

    async def handle(self, turn: Turn, message: Any) -> None:
        if message == "busy":
            await self.gate.wait()
        self.handled.append(message)


async def test_seed_example_exactly() -> None:
    a_account = Account("A", high_watermark=5, low_watermark=3, event_cost=1)
    other_work = Account("other", high_watermark=1000, low_watermark=0, event_cost=1)
    send, source = trio.open_memory_channel[str](10)
    async with open_system() as system:
        peers = [system.spawn(Peer(), name=f"O{i}") for i in range(1, 10)]
        d = system.spawn(Dataspace(peers, a_account), name="D")
        a = system.spawn(Reader(source, d, a_account), name="A")
        for peer in peers:  # O1..O9 are busy with other work
            peer.send_nowait("busy", account=other_work)
        await trio.testing.wait_all_tasks_blocked()

        send.send_nowait("M")
        await trio.testing.wait_all_tasks_blocked()
        # +1 (M to D) +9 (M' to O1..O9) while D's turn runs: 10 ...
        assert d.debt_at_fanout == [10]
        # ... then D's receipt repays 1: 9 outstanding, above the threshold 5.
        assert a_account.debt == 9
        assert a_account.blocked
        # Next time round its loop, A stops: N is not forwarded, and P is
        # not even read (it waits in the source, as bytes in a socket would).
        send.send_nowait("N")
        send.send_nowait("P")
        await trio.testing.wait_all_tasks_blocked()
        assert a.forwarded == ["M"]
        assert source.statistics().current_buffer_used == 1
        assert a_account.statistics().waiters == 1

        # Each O that gets round to its M' repays 1 unit. At 5 and 4 (between
        # the watermarks) A stays stopped: it resumes at the low watermark.
        for i, peer in enumerate(peers[:5]):
            peer.gate.set()
            await trio.testing.wait_all_tasks_blocked()
            assert peer.handled == ["busy", "M'"]
            assert a_account.debt == 8 - i
            assert a.forwarded == ["M"], f"A resumed early at debt {a_account.debt}"
        peers[5].gate.set()
        await trio.testing.wait_all_tasks_blocked()
        # Debt reached 3, the low watermark: A resumed and forwarded N. (What
        # follows, P before or after D's turn for N, is up to the scheduler.)
        assert a.forwarded[:2] == ["M", "N"]
        assert source.statistics().current_buffer_used == 0

        for peer in peers[6:]:
            peer.gate.set()
        await trio.testing.wait_all_tasks_blocked()
        assert a.forwarded == ["M", "N", "P"]
        assert all(peer.handled == ["busy", "M'", "N'", "P'"] for peer in peers)
        # Idle: every loan repaid.
        assert a_account.debt == 0
        assert other_work.debt == 0
        assert a_account.statistics().peak_debt >= 10
