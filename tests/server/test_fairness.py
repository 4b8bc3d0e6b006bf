"""One connection cannot slow every other client (issue 40, item 6).

A client writing tiny Ping frames in 2 MB writes made the broker handle a
whole 64 KiB read (some 9,000 frames, tens of milliseconds) before anyone
else got a turn: another client's median round trip went from 0.3 ms to
18-22 ms. The reader now handles ``FRAMES_PER_TURN`` frames per turn and
lets the other tasks go; and the control frames whose answers wait to be
written are charged to the connection's account, so that its backstop
stops a flooder that does not read, as it stops a publisher.

The assertions count frames and turns, not milliseconds: they do not
depend on the machine's speed.
"""

from __future__ import annotations

import socket

import trio

from broker.config import KiB, MiB
from broker.protocol import Ping, Pong
from broker.protocol.frames import FrameDecoder, encode
from broker.server.connection._connection import FRAMES_PER_TURN

from .helpers import TIMEOUT, RawClient, connection_named, raw_client, running_broker, wait_until

PING = encode(Ping(1))
#: The flooder's writes: 2 MB of Pings (285,714 frames).
FLOOD = PING * (2_000_000 // len(PING))
#: Scheduler batches a round trip takes in this process (the prober's send,
#: the broker's read, the prober's wake-up, with trio's checkpoints): a
#: generous count, each allowing the flooder one turn. Before, one turn was
#: a whole read: about 9,000 Pings.
TURNS_PER_ROUND_TRIP = 16


async def round_trip(prober: RawClient, nonce: int) -> None:
    """Send Ping ``nonce`` and read until its Pong."""
    decoder = FrameDecoder()
    with trio.fail_after(TIMEOUT):
        await prober.stream.send_all(encode(Ping(nonce)))
        while True:
            data = await prober.stream.receive_some(1 << 16)
            assert data, "the broker closed the prober's connection"
            decoder.feed(data)
            if any(isinstance(m, Pong) and m.nonce == nonce for m, _ in decoder.messages()):
                return


async def test_a_ping_flood_gives_another_client_its_turn_within_a_few_turns() -> None:
    """While a client floods Pings in 2 MB writes (and reads its Pongs),
    another client's Ping is answered after the flooder's connection has
    handled at most a few turns' frames, every time (before: at least one
    whole read, thousands of frames, each time)."""
    async with (
        running_broker() as broker,
        raw_client(broker) as flooder,
        raw_client(broker) as prober,
    ):
        await flooder.handshake("flooder")
        await prober.handshake("prober")
        flooding = connection_named(broker, "flooder").protocol

        async def flood() -> None:
            while True:
                await flooder.stream.send_all(FLOOD)

        async def read_pongs() -> None:
            while await flooder.stream.receive_some(1 << 20):
                pass

        async with trio.open_nursery() as nursery:
            nursery.start_soon(flood)
            nursery.start_soon(read_pongs)
            await wait_until(lambda: flooding.frames_received > 20_000, what="the flood")
            handled = []
            for nonce in range(2, 32):
                before = flooding.frames_received
                await round_trip(prober, nonce)
                handled.append(flooding.frames_received - before)
            nursery.cancel_scope.cancel()
        assert max(handled) <= TURNS_PER_ROUND_TRIP * FRAMES_PER_TURN, handled
        assert flooding.frames_received > 20_000 + sum(handled) // 2  # (it did flood)
        assert not flooding.closed
        assert broker.internal_errors == 0


async def test_a_ping_flooder_that_does_not_read_is_stopped_by_its_account() -> None:
    """The Pings whose Pongs wait to be written are charged to the
    connection's account (their bytes and the per-event cost each): a
    flooder that reads nothing blocks its account and the reader stops,
    long before ``max_unsent`` would stop it. Once the client reads, the
    charges are repaid and the connection works on (before: its account
    stayed at 0 while a Ping flood queued 8 MiB of answers)."""
    async with running_broker(
        connection_high_watermark=256 * KiB,
        connection_low_watermark=128 * KiB,
        max_unsent=8 * MiB,
    ) as broker:
        client = await RawClient.connect(broker)
        try:
            client.stream.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            await client.handshake("flooder")
            connection = connection_named(broker, "flooder")

            pings = PING * 10_000
            sent = 0

            async def flood() -> None:
                nonlocal sent
                while True:  # (one send at a time: cancelled between sends)
                    sent += await client.stream.socket.send(pings[sent % len(pings) :])

            async with trio.open_nursery() as nursery:
                nursery.start_soon(flood)
                await wait_until(lambda: connection.account.blocked, what="the account to block")
                await wait_until(
                    lambda: connection.account.statistics().waiters > 0,
                    what="the reader to wait for its account",
                )
                stats = connection.account.statistics()
                assert stats.debt > 256 * KiB
                assert connection.protocol.memory_to_send < 8 * MiB / 4
                nursery.cancel_scope.cancel()
            # The client reads at last: its answers go out, the charges are repaid.
            async with trio.open_nursery() as nursery:
                client.start_reading(nursery)
                await client.send(PING[sent % len(PING) :])  # (the last Ping's rest)
                await wait_until(
                    lambda: connection.account.debt == 0, what="the charges to be repaid"
                )
                await client.send(Ping(7))
                await client.wait_for(lambda m: isinstance(m, Pong) and m.nonce == 7)
                nursery.cancel_scope.cancel()
            assert not connection.protocol.closed
            assert broker.internal_errors == 0
        finally:
            await client.aclose()


async def test_a_reader_that_passes_max_unsent_on_output_it_held_goes_on() -> None:
    """Review: output held for a read's last turn could pass ``max_unsent``
    for a client that reads promptly; the pause wrote it all at once, which
    set the writer's old event, and the reader then waited on a new one that
    nothing set until a heartbeat (15 s for one 64 KiB read of Pings, where
    the code before answered in 0.09 s). Now it writes, checks again, and
    goes on: every Pong comes without any pause."""
    async with running_broker(max_unsent=128 * KiB, heartbeat=3600.0, lease=7200.0) as broker:
        client = await RawClient.connect(broker)
        try:
            await client.handshake("reader")
            connection = connection_named(broker, "reader")
            pings = b"".join(encode(Ping(n)) for n in range(10, 65_536 // len(PING) + 10))
            last = 65_536 // len(PING) + 9
            async with trio.open_nursery() as nursery:
                client.start_reading(nursery)
                with trio.fail_after(TIMEOUT):
                    await client.stream.send_all(pings)
                    await client.wait_for(lambda m: isinstance(m, Pong) and m.nonce == last)
                nursery.cancel_scope.cancel()
            assert connection.counters.reader_pauses == 0
            assert broker.internal_errors == 0
        finally:
            await client.aclose()


async def test_a_client_that_reads_is_not_charged_for_answers_the_broker_held() -> None:
    """Review: the turns of a read before its last hold their output back
    on purpose (the last writes it all at once), and each of them charged
    its control frames as if the client did not read: a prompt reader's
    8 KiB of Pings (about 1,170, 18 turns) ran its account to some 80 KB of
    debt. Charged per read, and only if the answers still wait once the
    last turn wrote them, a client that reads stays near 0."""
    async with running_broker(heartbeat=3600.0, lease=7200.0) as broker:
        client = await RawClient.connect(broker)
        try:
            await client.handshake("reader")
            connection = connection_named(broker, "reader")
            count = 8192 // len(PING)
            async with trio.open_nursery() as nursery:
                client.start_reading(nursery)
                for round_ in range(5):
                    first = 1000 + round_ * count
                    pings = b"".join(encode(Ping(first + n)) for n in range(count))
                    with trio.fail_after(TIMEOUT):
                        await client.stream.send_all(pings)
                        last = first + count - 1
                        await client.wait_for(
                            lambda m, n=last: isinstance(m, Pong) and m.nonce == n
                        )
                nursery.cancel_scope.cancel()
            assert connection.account.statistics().peak_debt < 8192
            assert connection.account.debt == 0
        finally:
            await client.aclose()
