"""Held acknowledgements: a subscription whose messages trickle in sends one
cumulative ``Ack`` per ``Policy.ack_delay`` instead of one per message
(every Ack the broker reads costs it a wake-up), and never holds one back
longer than that, nor for more than ``HOLD_BYTES``."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from broker.client import connect, open_client
from broker.client._acks import HOLD_BYTES, HeldAcks
from broker.client._core import ClientSession
from broker.protocol import Ack, Policy
from tests.server.helpers import running_broker, url, wait_until

from .test_blocking import blocking_client
from .test_core import FakeBroker, subscribed


def test_held_acks_fall_due_in_order_and_bytes_bound_them() -> None:
    held = HeldAcks[str](0.02)
    timers: list[float] = []
    held.on_timer = timers.append
    window = 1 << 20
    assert held.earliest() is None
    assert held.hold("a", 100, 1.0, window)
    assert held.hold("b", 100, 1.005, window)
    assert held.hold("a", 100, 1.01, window)  # held already: no new timer
    assert timers == [1.02, 1.025]
    assert held.earliest() == 1.02
    assert held.take_due(1.019) == []
    assert held.take_due(1.02) == ["a"]
    assert len(held) == 1
    held.forget("b")
    assert held.earliest() is None
    # Bytes: what reaches HOLD_BYTES goes at once, and nothing of it stays held.
    assert not held.hold("c", HOLD_BYTES, 2.0, window)
    assert held.hold("c", HOLD_BYTES - 1, 2.0, window)
    assert not held.hold("c", 1, 2.0, window)
    assert len(held) == 0
    # ...and so does what reaches a quarter of a small delivery window.
    assert held.hold("d", 255, 2.0, 1024)
    assert not held.hold("d", 1, 2.0, 1024)
    # A delay of 0 holds nothing.
    assert not HeldAcks[str](0.0).hold("a", 1, 0.0, window)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def trickle(policy: Policy | None, count: int, gap: float) -> tuple[list[int], ClientSession]:
    """``count`` messages delivered and taken one at a time, ``gap`` seconds
    apart, the session's timer run as a driver runs it: the Acks the broker
    read, by sequence number."""
    broker = FakeBroker()
    clock = Clock()
    session = ClientSession("held", policy, None, max_topics=10, reconnect=0.0, clock=clock)
    session.start(0.0)
    broker.pump(session)
    subscription = subscribed(session, broker, "t")
    for seq in range(1, count + 1):
        broker.conn.deliver(subscription.handle, seq, b"m%d" % seq)
        broker.pump(session, clock.now)
        assert subscription._take().seq == seq
        broker.pump(session, clock.now)
        clock.now += gap
        due = session.next_deadline()
        if due is not None and due <= clock.now:
            assert session.handle_timer(clock.now) is None
            broker.pump(session, clock.now)
    return [e.seq for e in broker.events if isinstance(e, Ack)], session


def test_trickling_messages_are_acknowledged_once_per_ack_delay() -> None:
    # 1,000 msg/s for 0.1 s with the default ack_delay of 20 ms: 5 Acks, not 100.
    acks, session = trickle(None, 100, 0.001)
    assert session.conn.policy.ack_delay == 0.02
    assert len(acks) in (5, 6)
    assert acks == sorted(acks) and acks[-1] >= 95
    # Each Ack went out within the delay of the first message it covers.
    assert all(later - earlier <= 21 for earlier, later in zip([0, *acks], acks, strict=False))


def test_an_ack_delay_of_zero_acknowledges_each_message_at_once() -> None:
    acks, _session = trickle(Policy(ack_delay=0.0), 10, 0.001)
    assert acks == list(range(1, 11))


def test_slow_messages_are_each_acknowledged_after_the_delay() -> None:
    acks, _session = trickle(None, 5, 0.05)  # 20 msg/s: nothing to coalesce
    assert acks == [1, 2, 3, 4, 5]


def test_a_large_message_is_acknowledged_at_once() -> None:
    broker = FakeBroker()
    session = ClientSession("held", None, None, max_topics=10, reconnect=0.0, clock=Clock())
    session.start(0.0)
    broker.pump(session)
    subscription = subscribed(session, broker, "t")
    broker.conn.deliver(subscription.handle, 1, b"x" * HOLD_BYTES)
    broker.pump(session)
    subscription._take()
    broker.pump(session)
    assert [e.seq for e in broker.events if isinstance(e, Ack)] == [1]
    assert session.next_deadline() == session.conn.next_deadline()  # nothing held


@pytest.mark.parametrize("delay", [0.0, 0.02])
async def test_the_async_client_sends_a_held_ack_by_its_timer(delay: float) -> None:
    async with running_broker() as broker:
        policy = Policy(ack_delay=delay)
        async with (
            open_client(url(broker), name="sub", policy=policy) as reader,
            open_client(url(broker), name="pub") as writer,
            reader.subscribe("t") as sub,
        ):
            await writer.publish("t", b"one")
            message = await sub.receive()
            acked = reader._conn.processed
            # Taken: acknowledged at once with no delay, else held.
            assert acked == {sub.handle: message.seq if delay == 0 else 0}
            # The keepalive task's timer sends it, without any other call.
            await wait_until(lambda: reader._conn.processed[sub.handle] == 1)


async def test_the_blocking_client_sends_a_held_ack_while_it_waits() -> None:
    async with running_broker() as broker:
        address = url(broker)
        async with blocking_client(address, name="sub") as reader:

            def run() -> dict[str, Any]:
                with reader.subscribe("t", timeout=30) as sub:
                    with connect(address, name="pub") as writer:
                        writer.publish("t", b"one")
                    message = sub.receive(timeout=30)
                    held = dict(reader._conn.processed)
                    with pytest.raises(TimeoutError):
                        sub.receive(timeout=0.2)  # waiting, the held Ack goes
                    return {
                        "seq": message.seq,
                        "held": held,
                        "after": dict(reader._conn.processed),
                        "handle": sub.handle,
                    }

            result = await trio.to_thread.run_sync(run)
    handle = result["handle"]
    assert result["held"] == {handle: 0}
    assert result["after"] == {handle: result["seq"]}


def test_guarantees_released_while_an_ack_is_held_are_sent_at_once() -> None:
    # A small delivery window: releasing a few frames frees a batch of room,
    # whose IssueGuarantee must not wait for the held Ack (the broker may
    # have nothing more to send until it comes).
    broker = FakeBroker()
    policy = Policy(deliver_capacity=16 * 1024)  # (below the largest Deliver: room goes at once)
    session = ClientSession("held", policy, None, max_topics=10, reconnect=0.0, clock=Clock())
    woken: list[int] = []
    session.on_output = lambda: woken.append(session.conn.bytes_to_send)
    session.start(0.0)
    broker.pump(session)
    subscription = subscribed(session, broker, "t")
    issued_while_held = 0
    for seq in range(1, 21):
        broker.conn.deliver(subscription.handle, seq, b"x" * 100)
        broker.pump(session)
        woken.clear()
        subscription._take()
        if session.conn.bytes_to_send:  # the release issued guarantees...
            assert len(session.held) == 1  # ...while the Ack is held,
            assert woken and woken[-1] > 0  # and the driver was told to write them
            issued_while_held += 1
        broker.pump(session)
    assert issued_while_held >= 3
    assert not [e for e in broker.events if isinstance(e, Ack)]  # all still held (time stood still)


async def test_the_blocking_client_sends_a_held_ack_between_calls() -> None:
    # Heartbeats 100 s apart: only the held Ack's own timer can send it in time.
    async with running_broker(heartbeat=100.0, lease=200.0) as broker:
        address = url(broker)
        async with blocking_client(address, name="sub") as reader:

            def take_one() -> tuple[int, int, int]:
                with connect(address, name="pub") as writer:
                    sub = reader.subscribe("t", timeout=30)
                    writer.publish("t", b"one")
                message = sub.receive(timeout=30)
                return sub.handle, message.seq, reader._conn.processed[sub.handle]

            # The application takes a message and then makes no call at all.
            handle, seq, acked_then = await trio.to_thread.run_sync(take_one)
            assert acked_then == 0  # held
            await wait_until(lambda: reader._conn.processed[handle] == seq)
