"""Where a reliable subscription starts (``start=``, ``cursor=``) and
``Message.offset``, client side and sans-IO: the Subscribe options they make,
what they refuse before anything is sent, and offsets taken from a Welcome
that says ``offsets`` (the fake broker of ``test_core.py`` stands in for a
broker that keeps topic logs)."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from broker.client import ClientError, ConnectionLost, Message
from broker.client._core import ClientSession, Ending
from broker.client._flows import open_subscription, restore
from broker.client._start import subscribe_options
from broker.client._subscription import ACK_EVERY, SubscriptionState
from broker.protocol import Ack, Options, Subscribed
from broker.protocol.frames import encode_deliver_tail
from tests.client.test_core import FakeBroker, connected, run

UTC = datetime.UTC


# ---------------------------------------------------------------- the options


@pytest.mark.parametrize(
    ("start", "cursor", "options"),
    [
        ("earliest", None, {"from": "earliest"}),
        ("latest", None, {"from": "latest"}),
        (0, None, {"from": 0}),
        (1234, None, {"from": 1234}),
        (2**63 - 1, None, {"from": 2**63 - 1}),
        (None, "billing", {"cursor": "billing"}),
        ("earliest", "billing", {"from": "earliest", "cursor": "billing"}),
        (
            datetime.datetime(2026, 11, 25, 10, 0, 0, 123999, tzinfo=UTC),
            None,
            {"from_time": 1795600800123},  # to the millisecond, rounded down
        ),
        (
            datetime.datetime(
                2026, 11, 25, 11, 0, tzinfo=datetime.timezone(datetime.timedelta(hours=1))
            ),
            None,
            {"from_time": 1795600800000},  # the same instant as 10:00 UTC
        ),
        (datetime.datetime(1970, 1, 1, tzinfo=UTC), None, {"from_time": 0}),
    ],
)
def test_start_and_cursor_make_the_options(start: Any, cursor: str | None, options: Any) -> None:
    assert subscribe_options("reliable", None, start, cursor) == options


def test_options_given_are_kept_and_not_changed() -> None:
    given: Options = {"x": 1}
    assert subscribe_options("reliable", given, "earliest") == {"x": 1, "from": "earliest"}
    assert given == {"x": 1}
    assert subscribe_options("lossy", given) is given  # nothing asked: as it was
    assert subscribe_options("reliable", None) is None


@pytest.mark.parametrize(
    ("start", "cursor", "error", "said"),
    [
        (-(2**63), None, ValueError, "N is at most 2..63 - 1"),
        (2**63, None, ValueError, "at most 2..63 - 1"),
        ("first", None, ValueError, "'earliest', 'latest'"),
        (True, None, TypeError, "not a bool"),
        (1.5, None, TypeError, "not float"),
        (datetime.datetime(2026, 11, 25, 10, 0), None, ValueError, "tzinfo=timezone.utc"),
        (datetime.datetime(1969, 12, 31, tzinfo=UTC), None, ValueError, "before 1970"),
        (None, "", ValueError, "topic-name rule"),
        (None, "two words", ValueError, "topic-name rule"),
        (None, "x" * 256, ValueError, "too long"),
    ],
)
def test_bad_values_are_refused(start: Any, cursor: Any, error: type, said: str) -> None:
    with pytest.raises(error, match=said):
        subscribe_options("reliable", None, start, cursor)


@pytest.mark.parametrize("mode", ["lossy", "latest"])
def test_only_a_reliable_subscription_takes_them(mode: str) -> None:
    with pytest.raises(ValueError, match="start= needs mode='reliable'"):
        subscribe_options(mode, None, "earliest")
    with pytest.raises(ValueError, match="cursor= needs mode='reliable'"):
        subscribe_options(mode, {"max_queued": 5}, cursor="c")


@pytest.mark.parametrize(
    ("options", "start", "cursor"),
    [
        ({"from": "earliest"}, 5, None),
        ({"from_time": 1}, "earliest", None),
        ({"cursor": "a"}, None, "b"),
    ],
)
def test_an_option_given_both_ways_is_refused(options: Any, start: Any, cursor: Any) -> None:
    with pytest.raises(ValueError, match="say the same thing"):
        subscribe_options("reliable", options, start, cursor)


def test_message_offset_defaults_to_none() -> None:
    """Positional constructions made before ``offset`` keep working."""
    message = Message("t", b"p", None, None, 3)
    assert message.offset is None
    assert Message("t", b"p", None, None, 3, 3).offset == 3


# ---------------------------------------------------------------- offsets from the Welcome


def subscribe(
    session: ClientSession, broker: FakeBroker, topic: str, mode: str = "reliable", **kw: Any
) -> SubscriptionState:
    subscription = SubscriptionState(session, -1, topic)
    subscription.mode = mode
    subscription.options = subscribe_options(mode, None, **kw)
    run(open_subscription(session, subscription), broker, session)
    return subscription


def subscribed_options(broker: FakeBroker) -> list[dict[str, Any]]:
    return [dict(e.options) for e in broker.events if isinstance(e, Subscribed)]


def test_the_options_go_out_in_the_subscribe_frame() -> None:
    broker = FakeBroker(offsets=True)
    session = connected(broker)
    when = datetime.datetime(2026, 11, 25, 10, 0, tzinfo=UTC)
    subscribe(session, broker, "a", start="earliest", cursor="billing")
    subscribe(session, broker, "b", start=7)
    subscribe(session, broker, "c", start=when)
    subscribe(session, broker, "d")
    assert subscribed_options(broker) == [
        {"from": "earliest", "cursor": "billing"},
        {"from": 7},
        {"from_time": 1795600800000},
        {},
    ]


def test_messages_carry_offsets_when_the_welcome_says_so() -> None:
    broker = FakeBroker(offsets=True)
    session = connected(broker)
    assert session.offsets
    reliable = subscribe(session, broker, "t", start=41)
    lossy = subscribe(session, broker, "t", mode="lossy")
    broker.conn.deliver(reliable.handle, 41, b"a")
    tails = [encode_deliver_tail(b"b", None, None), encode_deliver_tail(b"c", None, None)]
    assert broker.conn.deliver_encoded_many(reliable.handle, 42, tails) == 2
    broker.conn.deliver(lossy.handle, 1, b"own numbering")
    broker.pump(session)
    messages = reliable._take_many(10)
    assert [(m.payload, m.seq, m.offset) for m in messages] == [
        (b"a", 41, 41),
        (b"b", 42, 42),
        (b"c", 43, 43),
    ]
    assert lossy._take().offset is None  # lossy subscriptions keep their own numbering


def test_without_offsets_in_the_welcome_messages_have_none() -> None:
    broker = FakeBroker()
    session = connected(broker)
    assert not session.offsets
    subscription = subscribe(session, broker, "t")
    broker.conn.deliver(subscription.handle, 1, b"a")
    broker.pump(session)
    message = subscription._take()
    assert (message.seq, message.offset) == (1, None)


def test_a_resume_is_processed_up_to_the_offset_consumed() -> None:
    """The Hello of a resume names the last consumed seq: with offsets, an
    offset (nothing to convert)."""
    broker = FakeBroker(offsets=True)
    session = connected(broker, reconnect=5.0)
    subscription = subscribe(session, broker, "t", start=100)
    for seq in (100, 101, 102):
        broker.conn.deliver(subscription.handle, seq, b"m")
    broker.pump(session)
    assert [subscription._take().offset for _ in range(2)] == [100, 101]
    assert session.fail(ConnectionLost("connection broken"), now=1.0) is Ending.RECONNECT
    assert session.resume is not None
    assert session.resume.processed == {subscription.handle: 101}


def lose_session(session: ClientSession, *, offsets: bool = True) -> FakeBroker:
    """The connection breaks and the next broker (``offsets`` or not) no
    longer knows the session: the client subscribes again."""
    assert session.fail(ConnectionLost("connection broken"), now=1.0) is Ending.RECONNECT
    again = FakeBroker(offsets=offsets)
    session.start(1.0, session.begin_attempt(1.0))
    assert again.pump(session) is None
    lost = session.attempt_welcomed()
    assert lost is not None
    run(restore(session, lost), again, session)
    session.reconnected()
    return again


def lost_and_restored(
    offsets_after: bool,
) -> tuple[ClientSession, SubscriptionState, FakeBroker]:
    """A subscription made with a start and a cursor consumes offsets 10
    and 11 of 12 received; the broker then loses the session, and a broker
    (with ``offsets_after``) welcomes the client's next attempt."""
    broker = FakeBroker(offsets=True)
    session = connected(broker, reconnect=5.0)
    subscription = subscribe(session, broker, "t", start="earliest", cursor="c")
    for seq in (10, 11, 12):
        broker.conn.deliver(subscription.handle, seq, b"m")
    broker.pump(session)
    assert [subscription._take().offset for _ in range(2)] == [10, 11]
    return session, subscription, lose_session(session, offsets=offsets_after)


def test_a_lost_session_subscribes_again_after_the_last_offset_consumed() -> None:
    session, subscription, again = lost_and_restored(offsets_after=True)
    assert subscribed_options(again) == [{"cursor": "c", "from": 12}]
    again.conn.deliver(subscription.handle, 12, b"m")
    again.pump(session)
    assert subscription._take().offset == 12


def test_a_lost_session_on_a_broker_without_logs_drops_the_start_options(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """That broker would refuse them (ending the connection): the client
    subscribes again from the next message, and says so."""
    session, subscription, again = lost_and_restored(offsets_after=False)
    assert subscribed_options(again) == [{}]
    assert "keeps no topic log any more" in caplog.text
    again.conn.deliver(subscription.handle, 1, b"m")
    again.pump(session)
    # What was received and not consumed (offset 12) is taken first: no
    # broker has it any more (it used to be dropped).
    assert [subscription._take().offset for _ in range(2)] == [12, None]


def test_a_start_on_a_broker_without_logs_is_refused_before_sending() -> None:
    """It would end the connection (Goodbye 1), every subscription with it."""
    broker = FakeBroker()
    session = connected(broker)
    for start, cursor in [("earliest", None), (5, None), (None, "c")]:
        with pytest.raises(ClientError, match="keeps no topic log"):
            subscribe(session, broker, "t", start=start, cursor=cursor)
    subscribe(session, broker, "t", start="latest")  # (what it does anyway)
    assert subscribed_options(broker) == [{"from": "latest"}]
    assert not session.conn.closed


def delivered_in_one_frame(
    count: int, *, first: int
) -> tuple[FakeBroker, ClientSession, SubscriptionState]:
    """A subscription with a durable cursor, and ``count`` messages from
    offset ``first`` delivered to it in one DeliverMany."""
    broker = FakeBroker(offsets=True)
    session = connected(broker)
    subscription = subscribe(session, broker, "t", cursor="c")
    tails = [encode_deliver_tail(b"%d" % i, None, None) for i in range(count)]
    broker.conn.deliver_encoded_many(subscription.handle, first, tails)
    broker.pump(session)
    return broker, session, subscription


def test_unsubscribing_acknowledges_what_was_taken_mid_frame() -> None:
    """A frame's room goes back once all its messages are taken, but a
    subscription that ends mid-frame still acknowledges what was taken (a
    durable cursor then stands right after it), and nothing more."""
    broker, session, subscription = delivered_in_one_frame(3, first=5)
    assert [subscription._take().offset for _ in range(2)] == [5, 6]
    broker.pump(session)
    assert not [e for e in broker.events if isinstance(e, Ack)]
    session.unsubscribe(subscription)
    broker.pump(session)
    assert [e.seq for e in broker.events if isinstance(e, Ack)] == [6]
    session.ack_consumed([subscription])  # (again: nothing new to say)
    broker.pump(session)
    assert [e.seq for e in broker.events if isinstance(e, Ack)] == [6]


@pytest.mark.parametrize("taking", ["one by one", "in batches"])
def test_what_is_taken_is_acknowledged_as_it_goes_whatever_the_frames(taking: str) -> None:
    """A DeliverMany may carry a thousand messages: an application that took
    most of one has acknowledged them (its durable cursor and its session
    stand at most ACK_EVERY behind), not waited for the frame's end."""
    broker, session, subscription = delivered_in_one_frame(1000, first=1)
    taken = 0
    while taken < 700:
        if taking == "one by one":
            taken = subscription._take().seq
        else:
            taken = subscription._take_many(25)[-1].seq
    broker.pump(session)
    acks = [e.seq for e in broker.events if isinstance(e, Ack)]
    assert acks == sorted(acks)
    assert 700 - ACK_EVERY < acks[-1] <= 700
    assert len(acks) <= 700 // ACK_EVERY  # batched, not one per message
