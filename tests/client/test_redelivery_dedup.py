"""No record handed to the application twice (issue 46): a subscription
whose deliveries carry offsets drops any delivery at or below the last
offset it handed out or queued, counted in ``duplicates_dropped``, and
releases and acknowledges it as if taken. Sans-IO against the fake broker
of ``test_core.py``, then through every client over a socket against the
fake broker of ``fake_log_broker.py``, which delivers again what a first
connection delivered and had acknowledged."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from broker.client import (
    BlockingClient,
    BlockingClusterClient,
    ConnectionLost,
    Message,
    open_client,
    open_cluster_client,
)
from broker.client._core import ClientSession, Ending
from broker.client._subscription import SubscriptionState
from broker.protocol import Ack, Channel, ChannelKind, Event, HelloReceived
from broker.protocol.connection import BrokerSessionState
from broker.protocol.frames import encode_deliver_tail
from tests.server.helpers import TIMEOUT

from .fake_log_broker import FIRST, fake_broker
from .test_core import SESSION, FakeBroker, connected
from .test_offsets import lose_session, subscribe, subscribed_options


def deliver_many(broker: FakeBroker, handle: int, first: int, count: int) -> None:
    tails = [encode_deliver_tail(b"again %d" % (first + i), None, None) for i in range(count)]
    assert broker.conn.deliver_encoded_many(handle, first, tails) == count


def taken(subscription: SubscriptionState) -> list[int | None]:
    messages = []
    while subscription._inbox:
        messages.append(subscription._take())
    return [m.offset if m.offset is not None else m.seq for m in messages]


def buffered(session: ClientSession, subscription: SubscriptionState) -> int:
    channel = Channel(ChannelKind.DELIVER, subscription.handle)
    return session.conn.receiver(channel).buffered


def acks(broker: FakeBroker) -> list[int]:
    return [e.seq for e in broker.events if isinstance(e, Ack)]


def test_a_cursor_subscribed_again_drops_what_was_taken() -> None:
    """The durable cursor stood before what the application took (its Ack
    was not sent, or not read): the broker delivers those records again,
    whole frames and part of one; only the rest reaches the application."""
    broker = FakeBroker(offsets=True)
    session = connected(broker, reconnect=5.0)
    subscription = subscribe(session, broker, "t", start="earliest", cursor="c")
    for seq in (10, 11, 12):
        broker.conn.deliver(subscription.handle, seq, b"m%d" % seq)
    broker.pump(session)
    assert [subscription._take().offset for _ in range(2)] == [10, 11]
    again = lose_session(session)
    assert subscribed_options(again) == [{"cursor": "c", "from": 12}]
    again.conn.deliver(subscription.handle, 9, b"m9")  # (before the last one taken too)
    again.conn.deliver(subscription.handle, 10, b"m10")
    deliver_many(again, subscription.handle, 11, 4)  # 11 dropped, 12-14 queued
    again.pump(session)
    # The frames dropped whole gave their room back at once; the other
    # holds its room until its last message is taken.
    assert len(subscription._inbox) == 3 and buffered(session, subscription) > 0
    assert taken(subscription) == [12, 13, 14]
    assert subscription.duplicates_dropped == 3 == session.statistics()["duplicates_dropped"]
    assert subscription.received == 3 + 3  # (the duplicates not counted)
    assert buffered(session, subscription) == 0
    session.unsubscribe(subscription)
    again.pump(session)
    assert acks(again)[-1] == 14 and acks(again) == sorted(acks(again))


def test_record_times_stay_with_their_records_in_a_frame_dropped_in_part() -> None:
    broker = FakeBroker(offsets=True)
    session = connected(broker, reconnect=5.0)
    subscription = subscribe(session, broker, "t", cursor="c", timestamps=True)
    tails = [encode_deliver_tail(b"%d" % i, None, None) for i in range(1, 3)]
    assert broker.conn.deliver_timed(subscription.handle, 1, tails, [101, 102]) == 2
    broker.pump(session)
    assert taken(subscription) == [1, 2]
    again = lose_session(session)
    tails = [encode_deliver_tail(b"%d" % i, None, None) for i in range(1, 5)]
    assert again.conn.deliver_timed(subscription.handle, 1, tails, [101, 102, 103, 104]) == 4
    again.pump(session)
    messages = subscription._take_many(10)
    assert [(m.offset, m.payload, m.timestamp) for m in messages] == [
        (3, b"3", 103),
        (4, b"4", 104),
    ]
    assert session.duplicates_dropped == 2 and buffered(session, subscription) == 0


def test_leaving_after_a_redelivery_moves_a_cursor_past_it() -> None:
    """What was dropped counts as processed (nothing waited before it): a
    subscription closed before anything new arrived acknowledges it, so the
    next run of the cursor does not get it again either."""
    broker = FakeBroker(offsets=True)
    session = connected(broker, reconnect=5.0)
    subscription = subscribe(session, broker, "t", cursor="c")
    deliver_many(broker, subscription.handle, 1, 5)
    broker.pump(session)
    assert len(subscription._take_many(5)) == 5
    again = lose_session(session)
    deliver_many(again, subscription.handle, 3, 3)  # 3, 4, 5: all taken before
    again.pump(session)
    assert not subscription._inbox and buffered(session, subscription) == 0
    session.unsubscribe(subscription)
    again.pump(session)
    assert acks(again) == [5]
    assert session.duplicates_dropped == 3


def test_what_was_queued_is_not_queued_twice() -> None:
    """After a lost session what was received and not taken stays queued
    and the subscription starts after it; a broker that delivers some of
    it anyway does not get it queued twice."""
    broker = FakeBroker(offsets=True)
    session = connected(broker, reconnect=5.0)
    subscription = subscribe(session, broker, "t", start="earliest")
    for seq in (10, 11, 12):
        broker.conn.deliver(subscription.handle, seq, b"m%d" % seq)
    broker.pump(session)
    assert subscription._take().offset == 10
    again = lose_session(session)
    assert subscribed_options(again) == [{"from": 13}]
    deliver_many(again, subscription.handle, 11, 3)  # 11 and 12 are queued already
    again.pump(session)
    assert taken(subscription) == [11, 12, 13]
    assert subscription.duplicates_dropped == 2
    assert buffered(session, subscription) == 0  # (its last message taken: released)


def test_a_second_lost_session_drops_what_was_kept_and_taken() -> None:
    """Lost twice: what the application took of the first loss's kept
    messages is not handed out again whatever the next broker sends."""
    broker = FakeBroker(offsets=True)
    session = connected(broker, reconnect=5.0)
    subscription = subscribe(session, broker, "t", start="earliest")
    deliver_many(broker, subscription.handle, 1, 4)
    broker.pump(session)
    assert subscription._take().offset == 1
    again = lose_session(session)  # 2-4 kept
    assert [subscription._take().offset for _ in range(2)] == [2, 3]
    third = lose_session(session)
    deliver_many(third, subscription.handle, 1, 6)  # 1-3 taken, 4 still queued
    third.pump(session)
    assert taken(subscription) == [4, 5, 6]
    assert session.statistics()["duplicates_dropped"] == 4
    assert again is not third


def test_a_memory_only_broker_numbers_again_and_nothing_is_dropped() -> None:
    """Without topic logs sequence numbers are the session's: a new session
    numbers from 1 again, and those are new messages."""
    broker = FakeBroker()
    session = connected(broker, reconnect=5.0)
    subscription = subscribe(session, broker, "t")
    deliver_many(broker, subscription.handle, 1, 3)
    broker.pump(session)
    assert taken(subscription) == [1, 2, 3]
    again = lose_session(session, offsets=False)
    deliver_many(again, subscription.handle, 1, 2)
    again.pump(session)
    assert taken(subscription) == [1, 2]
    assert session.duplicates_dropped == 0


@pytest.mark.parametrize("mode", ["lossy", "latest"])
def test_lossy_and_latest_keep_their_own_numbering(mode: str) -> None:
    """On a broker with topic logs too, their numbers are the
    subscription's, from 1: not offsets, never compared."""
    broker = FakeBroker(offsets=True)
    session = connected(broker, reconnect=5.0)
    subscription = subscribe(session, broker, "t", mode=mode)
    deliver_many(broker, subscription.handle, 1, 3)
    broker.pump(session)
    assert taken(subscription) == [1, 2, 3]
    again = lose_session(session)
    deliver_many(again, subscription.handle, 1, 2)
    again.pump(session)
    assert taken(subscription) == [1, 2]
    assert session.duplicates_dropped == 0


class ResumingBroker(FakeBroker):
    """A broker that knows the session of ``before`` and resumes it."""

    def __init__(self, before: FakeBroker) -> None:
        super().__init__(offsets=True)
        state = before.conn.session_state()
        assert isinstance(state, BrokerSessionState)
        self.state = state

    def handle(self, events: list[Event]) -> None:
        hello = [e for e in events if isinstance(e, HelloReceived)]
        if hello:
            self.events.extend(hello)
            restore_state, _ = self.state.for_resume(hello[0].hello.processed)
            self.conn.welcome(session=SESSION, epoch=b"epoch", restore=restore_state, offsets=True)
            events = [e for e in events if not isinstance(e, HelloReceived)]
        super().handle(events)


def resumed(session: ClientSession, broker: FakeBroker) -> ResumingBroker:
    assert session.fail(ConnectionLost("connection broken"), now=1.0) is Ending.RECONNECT
    again = ResumingBroker(broker)
    session.start(1.0, session.begin_attempt(1.0))
    assert again.pump(session) is None
    assert session.attempt_welcomed() is None  # resumed
    session.reconnected()
    return again


def test_a_resume_sends_what_was_not_taken_and_nothing_is_dropped() -> None:
    broker = FakeBroker(offsets=True)
    session = connected(broker, reconnect=5.0)
    subscription = subscribe(session, broker, "t", start="earliest")
    deliver_many(broker, subscription.handle, 10, 3)
    broker.pump(session)
    assert subscription._take().offset == 10
    again = resumed(session, broker)
    deliver_many(again, subscription.handle, 11, 3)  # what follows `processed`
    again.pump(session)
    assert taken(subscription) == [11, 12, 13]
    assert session.duplicates_dropped == 0 and session.resumes == 1


def test_offsets_given_again_to_a_resumed_session_are_new_records(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A resumed broker sends what follows the offset the client said it
    processed: one at or below it can only be a new record at an offset
    given again (its log lost an unsynced tail when its machine crashed).
    It is handed out, with a warning, not dropped."""
    broker = FakeBroker(offsets=True)
    session = connected(broker, reconnect=5.0)
    subscription = subscribe(session, broker, "t", start="earliest")
    deliver_many(broker, subscription.handle, 10, 3)
    broker.pump(session)
    assert taken(subscription) == [10, 11, 12]
    again = resumed(session, broker)
    deliver_many(again, subscription.handle, 11, 3)  # (its log ends at 10 now)
    again.pump(session)
    messages = subscription._take_many(10)
    assert [(m.offset, m.payload) for m in messages] == [
        (11, b"again 11"),
        (12, b"again 12"),
        (13, b"again 13"),
    ]
    assert session.duplicates_dropped == 0
    assert "delivers offsets of 't' from 11 again" in caplog.text


# ---------------------------------------------------------------- through the clients


def offsets_of(messages: list[Message]) -> list[int | None]:
    return [message.offset for message in messages]


@pytest.mark.parametrize("cluster", [False, True], ids=["client", "cluster"])
async def test_async_clients(cluster: bool) -> None:
    """The first connection breaks once the three messages taken are
    acknowledged; the next session delivers them again, and two more."""
    with trio.fail_after(TIMEOUT):
        async with fake_broker(True, redeliver=[5]) as (address, seen):
            opened: Any = (
                open_cluster_client(address, reconnect=TIMEOUT)
                if cluster
                else open_client(address, reconnect=TIMEOUT)
            )
            async with opened as either:
                client = either.clients[address] if cluster else either
                async with either.subscribe("t", cursor="c") as subscription:
                    messages = [await subscription.receive() for _ in range(5)]
                    statistics = client.statistics()
    assert offsets_of(messages) == list(range(FIRST, FIRST + 5))
    assert seen.options == [{"cursor": "c"}, {"cursor": "c", "from": FIRST + 3}]
    assert statistics["sessions_lost"] == 1
    assert statistics["duplicates_dropped"] == 3 == subscription.duplicates_dropped


@pytest.mark.parametrize("cluster", [False, True], ids=["client", "cluster"])
async def test_blocking_clients(cluster: bool) -> None:
    def consume(address: str) -> tuple[list[Message], dict[str, int], int]:
        either: Any = (
            BlockingClusterClient(address, reconnect=TIMEOUT)
            if cluster
            else BlockingClient(address, reconnect=TIMEOUT)
        )
        with either:
            client = either.clients[address] if cluster else either
            with either.subscribe("t", cursor="c", timeout=TIMEOUT) as subscription:
                messages = [subscription.receive(timeout=TIMEOUT) for _ in range(5)]
                return messages, client.statistics(), subscription.duplicates_dropped

    with trio.fail_after(TIMEOUT):
        async with fake_broker(True, redeliver=[5]) as (address, seen):
            messages, statistics, dropped = await trio.to_thread.run_sync(consume, address)
    assert offsets_of(messages) == list(range(FIRST, FIRST + 5))
    assert seen.options == [{"cursor": "c"}, {"cursor": "c", "from": FIRST + 3}]
    assert statistics["sessions_lost"] == 1
    assert statistics["duplicates_dropped"] == 3 == dropped
