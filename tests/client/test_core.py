"""The client session core, sans-IO: fed bytes by a broker-side
:class:`~broker.protocol.Connection` (as ``tests/protocol/pair.py`` does),
with time passed in. The drivers (trio, blocking) are tested over loopback
by the other files here."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import pytest

from broker.backoff import BACKOFF_FIRST, BACKOFF_MOST, Backoff
from broker.client import ConnectionLost, LimitReached, StagingRefused
from broker.client._common import check_outcome
from broker.client._core import ClientSession, Ending
from broker.client._flows import Flow, Steps, open_subscription, request, restore, round_trip
from broker.client._resume import ReconnectPlan, unconfirmed_publishes
from broker.client._subscription import RELEASE_BATCH, SubscriptionState
from broker.protocol import (
    Abort,
    Ack,
    Commit,
    Connection,
    ConnectionClosed,
    Event,
    GoodbyeCode,
    HandleType,
    HelloReceived,
    OutcomeStatus,
    PublishReceived,
    Role,
    Stage,
    Subscribed,
)

SESSION = bytes(range(16))
T = TypeVar("T")


class FakeBroker:
    """One broker connection: welcomes (saying ``offsets`` if told to),
    confirms what it receives (unless told to hold it), answers commits and
    aborts, and records everything."""

    def __init__(
        self,
        *,
        resumed: bool = False,
        lease_ms: int = 3000,
        heartbeat_ms: int = 1000,
        offsets: bool = False,
    ):
        self.conn = Connection(Role.BROKER, now=0.0)
        self.resumed = resumed
        self.offsets = offsets
        self.lease_ms = lease_ms
        self.heartbeat_ms = heartbeat_ms
        self.events: list[Event] = []
        self.received: dict[str, list[bytes]] = {}
        self.counts: dict[int, int] = {}
        self.confirming = True
        self.held: list[PublishReceived] = []
        self.outcome_status = int(OutcomeStatus.COMMITTED)

    def handle(self, events: list[Event]) -> None:
        conn = self.conn
        for event in events:
            self.events.append(event)
            if isinstance(event, HelloReceived):
                conn.welcome(
                    session=SESSION,
                    epoch=b"epoch",
                    lease_ms=self.lease_ms,
                    heartbeat_ms=self.heartbeat_ms,
                    offsets=self.offsets,
                )
            elif isinstance(event, PublishReceived):
                self.received.setdefault(event.topic_name, []).append(event.message.payload)
                if self.confirming:
                    self._confirm(event)
                else:
                    self.held.append(event)
            elif isinstance(event, (Commit, Abort)):
                conn.outcome(event.request, self.outcome_status, 0, "no")

    def _confirm(self, event: PublishReceived) -> None:
        topic = event.message.topic
        self.conn.release(event)
        self.counts[topic] = self.counts.get(topic, 0) + 1
        self.conn.confirm(topic, self.counts[topic])

    def pump(self, session: ClientSession, now: float = 0.0) -> ConnectionLost | None:
        """Move bytes both ways until neither side has anything to say."""
        lost = None
        for _ in range(100):
            data = session.conn.data_to_send(now)
            if data:
                self.handle(self.conn.receive_data(data, now))
            back = self.conn.data_to_send(now)
            if back:
                lost = lost or session.receive_data(back, now)
            if not data and not back:
                return lost
        raise AssertionError("the peers keep talking")


def connected(broker: FakeBroker, **options: Any) -> ClientSession:
    options = {"max_topics": 1000, "reconnect": 0.0, **options}
    session = ClientSession("core", None, None, clock=lambda: 0.0, **options)
    session.start(0.0)
    assert broker.pump(session) is None
    assert session.conn.welcome_message is not None
    return session


def run(steps: Steps[T], broker: FakeBroker, session: ClientSession) -> T:
    """Drive a flow as a driver does, the fake broker answering."""
    with Flow(steps) as flow:
        for condition in flow:
            for _ in range(20):
                if condition():
                    break
                session.check_open()
                broker.pump(session)
            else:
                raise AssertionError("a flow's condition never held")
    return flow.result


def publish(
    session: ClientSession, broker: FakeBroker, topic: str, payload: bytes, **kw: Any
) -> None:
    for _ in range(20):
        if session.try_publish(topic, payload, None, None, **kw):
            return
        broker.pump(session)
    raise AssertionError("no guarantees")


def subscribed(session: ClientSession, broker: FakeBroker, topic: str) -> SubscriptionState:
    subscription = SubscriptionState(session, -1, topic)
    run(open_subscription(session, subscription), broker, session)
    return subscription


def test_publishes_are_counted_and_confirmed() -> None:
    broker = FakeBroker()
    session = connected(broker)
    for i in range(5):
        publish(session, broker, "t", b"%d" % i)
    targets = session.flush_targets()
    assert not session.all_confirmed(targets)  # sent (some not yet), not confirmed
    broker.pump(session)
    assert session.all_confirmed(targets)
    assert broker.received == {"t": [b"0", b"1", b"2", b"3", b"4"]}
    statistics = session.statistics()
    assert statistics["published"] == statistics["confirmed"] == 5
    assert statistics["topics"] == 1
    assert statistics["bytes_sent"] > 0 and statistics["bytes_received"] > 0


def test_a_bad_topic_name_is_refused_before_anything_is_sent() -> None:
    broker = FakeBroker()
    session = connected(broker)
    with pytest.raises(ValueError):
        session.try_publish("bad name", b"x", None, None)
    assert session.conn.bytes_to_send == 0


def test_keepalive_pings_when_due_and_gives_up_on_a_silent_broker() -> None:
    broker = FakeBroker(lease_ms=300, heartbeat_ms=100)
    session = connected(broker)
    due = session.next_deadline()
    assert due is not None and 0 < due <= 0.1
    assert session.handle_timer(due) is None
    assert session.conn.bytes_to_send  # a Ping
    broker.pump(session, now=due)
    assert session.pong == 1  # answered
    lost = session.handle_timer(10.0)
    assert lost is not None and "went silent" in str(lost)
    assert session.conn.closed
    closed = [e for e in broker.conn.receive_data(session.conn.data_to_send(10.0), 10.0)]
    assert [e.code for e in closed if isinstance(e, ConnectionClosed)] == [
        GoodbyeCode.LEASE_EXPIRED
    ]
    assert session.next_deadline() is None


def test_no_timers_before_the_welcome() -> None:
    session = ClientSession("core", None, None, max_topics=10, reconnect=0.0, clock=lambda: 0.0)
    session.start(0.0)
    assert session.next_deadline() is None
    assert session.handle_timer(1000.0) is None
    assert not session.conn.closed


def test_past_max_topics_the_least_recently_used_is_released() -> None:
    broker = FakeBroker()
    session = connected(broker, max_topics=2)
    for topic in ("a", "b", "c", "a", "d"):
        publish(session, broker, topic, topic.encode())
        broker.pump(session)
        assert session.statistics()["topics"] <= 2
    statistics = session.statistics()
    assert statistics["topics_released"] >= 2
    assert statistics["published"] == statistics["confirmed"] == 5
    assert broker.received == {"a": [b"a", b"a"], "b": [b"b"], "c": [b"c"], "d": [b"d"]}


def test_subscribing_taking_and_releasing_in_batches() -> None:
    broker = FakeBroker()
    session = connected(broker)
    subscription = subscribed(session, broker, "t")
    assert [e for e in broker.events if isinstance(e, Subscribed)]
    count = RELEASE_BATCH + 3
    for seq in range(1, count + 1):
        broker.conn.deliver(subscription.handle, seq, b"m%d" % seq)
    broker.pump(session)
    assert subscription.received == count == len(subscription._inbox)
    taken = [subscription._take() for _ in range(RELEASE_BATCH - 1)]
    broker.pump(session)
    assert not [e for e in broker.events if isinstance(e, Ack)]  # not yet a batch
    taken.append(subscription._take())
    broker.pump(session)
    acks = [e for e in broker.events if isinstance(e, Ack)]
    assert [a.seq for a in acks] == [RELEASE_BATCH]
    taken += subscription._take_many(100)  # everything left: released at once...
    broker.pump(session)
    assert [m.seq for m in taken] == list(range(1, count + 1))
    assert [e.seq for e in broker.events if isinstance(e, Ack)] == [RELEASE_BATCH]
    due = session.next_deadline()  # ...and acknowledged within the policy's ack_delay
    assert due == session.conn.policy.ack_delay
    assert session.handle_timer(due) is None
    broker.pump(session)
    assert [e.seq for e in broker.events if isinstance(e, Ack)] == [RELEASE_BATCH, count]
    session.unsubscribe(subscription)
    broker.pump(session)
    assert subscription._closed and not session.subscriptions
    assert not broker.conn.confirmed(HandleType.SUBSCRIPTION, subscription.handle)


def test_round_trip_waits_for_the_pong() -> None:
    broker = FakeBroker()
    session = connected(broker)
    before = session.pong
    run(round_trip(session), broker, session)
    assert session.pong == before + 1


def test_staging_counts_and_lets_go_of_the_stage() -> None:
    broker = FakeBroker()
    session = connected(broker)
    stage = Stage("job", "part-0")
    for i in range(3):
        publish(session, broker, "t", b"%d" % i, stage=stage)
    publish(session, broker, "t", b"routed")
    broker.pump(session)
    assert ("t", stage) in session.handles and "t" in session.handles
    assert session.finish_stage(stage) == 3
    assert ("t", stage) not in session.handles and "t" in session.handles
    outcome = run(
        request(session, lambda conn: conn.commit("job", [("part-0", 3)])), broker, session
    )
    assert outcome.status == OutcomeStatus.COMMITTED
    assert [e.members for e in broker.events if isinstance(e, Commit)] == [[("part-0", 3)]]
    broker.outcome_status = int(OutcomeStatus.REFUSED)
    refused = run(request(session, lambda conn: conn.abort("job")), broker, session)
    with pytest.raises(StagingRefused):
        check_outcome("job", refused)


def test_a_broken_connection_is_planned_for_resume() -> None:
    broker = FakeBroker()
    session = connected(broker, reconnect=5.0)
    subscription = subscribed(session, broker, "news")
    broker.conn.deliver(subscription.handle, 1, b"one")
    broker.conn.deliver(subscription.handle, 2, b"two")
    broker.pump(session)
    assert subscription._take().seq == 1  # consumed; 2 is received, not consumed
    publish(session, broker, "t", b"confirmed")
    broker.pump(session)
    broker.confirming = False
    publish(session, broker, "t", b"unconfirmed")
    broker.pump(session)
    assert session.fail(ConnectionLost("connection broken"), now=1.0) is Ending.RECONNECT
    assert (session.ready, session.broken is None) == (False, False)  # being replaced
    assert session.fail(ConnectionLost("again"), now=1.0) is Ending.IGNORED
    state = session.resume
    assert state is not None
    assert state.processed == {subscription.handle: 1}  # the rest is delivered again
    assert not subscription._inbox
    assert [(t, m.payload) for t, _, m in unconfirmed_publishes(state)] == [("t", b"unconfirmed")]
    assert session.plan is not None and session.plan.next_attempt == 1.0

    # The broker lost the session: subscribe again, publish again.
    again = FakeBroker(resumed=False)
    session.start(1.0, session.begin_attempt(1.0))
    assert again.pump(session) is None
    lost = session.attempt_welcomed()
    assert lost is not None and session.sessions_lost == 1
    run(restore(session, lost), again, session)
    session.reconnected()
    again.pump(session)
    assert again.received == {"t": [b"unconfirmed"]}
    assert [e.topic_name for e in again.events if isinstance(e, Subscribed)] == ["news"]
    assert session.subscriptions == {subscription.handle: subscription}
    assert (session.ready, session.broken) == (True, None)


def test_an_attempt_ended_by_an_unexpected_error_leaves_the_next_one_possible() -> None:
    """A driver that raises out of an attempt (e.g. LimitReached while
    restoring a lost session) ends it with attempt_aborted: the session is
    still broken, the plan stands, and a later failure is not ignored."""
    broker = FakeBroker()
    session = connected(broker, reconnect=5.0)
    assert session.fail(ConnectionLost("connection broken"), now=1.0) is Ending.RECONNECT
    plan = session.plan
    session.start(1.0, session.begin_attempt(1.0))
    assert session.attempting
    session.attempt_aborted()
    assert (session.attempting, session.ready) == (False, False)
    assert session.broken is not None and session.plan is plan
    session.start(2.0, session.begin_attempt(2.0))  # the next attempt
    assert FakeBroker().pump(session) is None
    assert session.attempt_welcomed() is not None  # (this broker never resumes)
    session.reconnected()
    assert (session.ready, session.broken, session.attempting) == (True, None, False)


def test_without_reconnect_a_broken_connection_ends_the_client() -> None:
    broker = FakeBroker()
    session = connected(broker)
    assert session.fail(ConnectionLost("connection broken"), now=0.0) is Ending.ENDED
    assert not session.ready and session.closed
    with pytest.raises(ConnectionLost, match="broken"):
        session.check_open()
    with pytest.raises(ConnectionLost):
        session.try_publish("t", b"x", None, None)


def test_a_refusal_is_not_retried() -> None:
    broker = FakeBroker()
    session = connected(broker, reconnect=5.0)
    refused = ConnectionLost("not authorised", int(GoodbyeCode.NOT_AUTHORISED))
    assert session.fail(refused, now=0.0) is Ending.ENDED


def test_reconnect_plan_backs_off_and_gives_up() -> None:
    # (Each wait at its ceiling: the jitter is tested in tests/client/test_backoff.py.)
    plan = ReconnectPlan(now=10.0, reconnect=5.0, backoff=Backoff(uniform=lambda: 1.0))
    assert plan.next_attempt == 10.0
    assert plan.attempt_deadline(10.0, connect_timeout=1.0) == 11.0
    assert plan.attempt_deadline(14.5, connect_timeout=1.0) == 15.0
    waits = []
    now = 10.0
    while (final := plan.failed(ConnectionLost("refused by the OS"), now)) is None:
        waits.append(round(plan.next_attempt - now, 3))
        now = plan.next_attempt
    assert waits[:4] == [0.05, 0.1, 0.2, 0.4]
    assert max(waits) <= BACKOFF_MOST
    assert now < 15.0 and "could not reconnect within 5.0 s" in str(final)
    assert now >= 15.0 - BACKOFF_FIRST  # (the last waits cut to the window's end)


@pytest.mark.parametrize("draw", [0.0, 0.3, 0.7, 0.999])
def test_reconnect_plan_tries_until_its_window_is_over(draw: float) -> None:
    """However the jitter falls, a plan gives up only within the first wait
    of its window's end, never early (a drawn wait past it is cut)."""
    plan = ReconnectPlan(now=0.0, reconnect=0.5, backoff=Backoff(uniform=lambda: draw))
    now = 0.0
    while (final := plan.failed(ConnectionLost("refused by the OS"), now)) is None:
        assert now <= plan.next_attempt < 0.5
        now = plan.next_attempt if plan.next_attempt > now else now + 0.001
    assert 0.5 - BACKOFF_FIRST <= now < 0.5
    assert "could not reconnect within 0.5 s" in str(final)
    shut = ReconnectPlan(now=0.0, reconnect=5.0)
    assert shut.failed(ConnectionLost("bye", int(GoodbyeCode.SHUTTING_DOWN)), 0.0) is None
    refused = ReconnectPlan(now=0.0, reconnect=5.0)
    final = refused.failed(ConnectionLost("no", int(GoodbyeCode.NOT_AUTHORISED)), 0.0)
    assert final is not None and final.code == GoodbyeCode.NOT_AUTHORISED


def test_an_unreachable_address_falls_back_once_and_a_redirect_still_wins() -> None:
    """A client given a fallback (a worker's client, with its broker's public
    address) goes there at once when its own address cannot be reached; a
    connection that broke or was refused does not make it; a Goodbye 8
    sends it on from there."""
    unreachable = ConnectionLost("cannot connect: refused", unreachable=True)
    plain = ReconnectPlan(now=0.0, reconnect=5.0)
    assert plain.failed(unreachable, 0.0) is None and plain.redirect is None
    plan = ReconnectPlan(now=0.0, reconnect=5.0, fallback="public:7400")
    assert plan.failed(ConnectionLost("broken pipe"), 0.0) is None
    assert plan.redirect is None  # (it broke: the address is still right)
    assert plan.failed(unreachable, 1.0) is None
    assert plan.redirect == "public:7400" and plan.next_attempt == 1.0
    assert plan.failed(unreachable, 1.0) is None  # the public address too: backoff
    assert plan.redirect == "public:7400" and plan.next_attempt > 1.0
    redirect = ConnectionLost("resume at w0:7401", int(GoodbyeCode.REDIRECT))
    assert plan.failed(redirect, 2.0) is None and plan.redirect == "w0:7401"


def test_the_subscription_limit_is_said_after_a_round_trip(monkeypatch: pytest.MonkeyPatch) -> None:
    broker = FakeBroker()
    session = connected(broker)
    subscription = SubscriptionState(session, -1, "t")
    never: Callable[..., bool] = lambda *_: False  # noqa: E731
    monkeypatch.setattr(session, "try_subscribe", never)
    monkeypatch.setattr(type(session), "near_subscription_limit", property(lambda _: True))
    with pytest.raises(LimitReached, match="max_subscriptions"):
        run(open_subscription(session, subscription), broker, session)
    assert not session.cache._pins  # the topic is unpinned again


def test_a_flush_under_way_ends_once_a_lost_sessions_publishes_are_confirmed_again() -> None:
    """A flush that began before the broker lost the session waited for the
    old session's counts (3 on the topic's handle) while the new session
    counts from 0 under the same handle: with 2 of them published again
    and confirmed, it waited for ever (the producers of a memory-only
    broker killed with publishes in flight hung for good)."""
    broker = FakeBroker()
    session = connected(broker, reconnect=5.0)
    publish(session, broker, "t", b"one")
    broker.pump(session)
    broker.confirming = False
    publish(session, broker, "t", b"two")
    publish(session, broker, "t", b"three")
    broker.pump(session)
    targets = session.flush_targets()
    assert not session.all_confirmed(targets)
    assert session.fail(ConnectionLost("connection broken"), now=1.0) is Ending.RECONNECT
    again = restored_on_a_new_broker(session)
    again.pump(session)
    assert again.received == {"t": [b"two", b"three"]}
    assert session.all_confirmed(targets)


def restored_on_a_new_broker(session: ClientSession) -> FakeBroker:
    """The broken ``session``'s next attempt reaches a broker that does not
    know it: restored there (subscribed again, unconfirmed published again)."""
    again = FakeBroker(resumed=False)
    session.start(1.0, session.begin_attempt(1.0))
    again.pump(session)
    lost = session.attempt_welcomed()
    assert lost is not None
    run(restore(session, lost), again, session)
    session.reconnected()
    return again


def broken_with_unconsumed(reconnect: float = 5.0) -> tuple[ClientSession, SubscriptionState]:
    """A subscription that received seqs 1-3 and consumed 1, then its
    connection broke (the client reconnects)."""
    broker = FakeBroker()
    session = connected(broker, reconnect=reconnect)
    subscription = subscribed(session, broker, "news")
    for seq in (1, 2, 3):
        broker.conn.deliver(subscription.handle, seq, b"m%d" % seq)
    broker.pump(session)
    assert subscription._take().seq == 1
    assert session.fail(ConnectionLost("connection broken"), now=1.0) is Ending.RECONNECT
    return session, subscription


def test_what_was_received_and_not_consumed_outlives_a_lost_session() -> None:
    """A memory-only broker that restarted (or shut down gracefully) lost the
    session: the messages the client had received and not consumed were
    dropped, to be delivered again by a session that no longer existed
    (confirmed messages lost for subscribers that kept reading)."""
    session, subscription = broken_with_unconsumed()
    again = restored_on_a_new_broker(session)
    again.conn.deliver(subscription.handle, 1, b"new")
    again.pump(session)
    taken = [subscription._take() for _ in range(3)]
    assert [(m.payload, m.seq) for m in taken] == [(b"m2", 2), (b"m3", 3), (b"new", 1)]
    session.ack_consumed([subscription])
    again.pump(session)
    # Only the new session's delivery is acknowledged to the new broker.
    assert [e.seq for e in again.events if isinstance(e, Ack)] == [1]


def test_what_was_received_is_still_taken_when_reconnecting_gives_up() -> None:
    session, subscription = broken_with_unconsumed(reconnect=0.5)
    session.start(1.0, session.begin_attempt(1.0))
    session.attempt_failed(ConnectionLost("refused"), now=5.0)  # past its 0.5 s
    assert session.closed
    assert [subscription._take().payload for _ in range(2)] == [b"m2", b"m3"]
