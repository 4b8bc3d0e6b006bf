"""Guarantee rules at the connection level: limits, errors, optimism, policy."""

from __future__ import annotations

import pytest

from broker.protocol import (
    U64_MAX,
    Absolve,
    AnnounceDropping,
    Apologise,
    Channel,
    ChannelKind,
    Confirm,
    ConnectionClosed,
    Deliver,
    DropAnnounced,
    Goodbye,
    GoodbyeCode,
    HandleType,
    IssueGuarantee,
    LimitReceiving,
    LimitSending,
    LocalProtocolError,
    NoGuarantees,
    Policy,
    Publish,
    PublishReceived,
)
from broker.protocol.frames import encode

from .pair import ConnectionPair, of, split_frames


def payload_for(topic: int, frame_size: int) -> bytes:
    """A payload whose Publish frame on ``topic`` is exactly ``frame_size`` bytes."""
    for length in range(frame_size, -1, -1):
        if len(encode(Publish(topic, b"w" * length))) == frame_size:
            return b"w" * length
    raise AssertionError(f"no payload makes a {frame_size}-byte frame")


def open_topic(pair: ConnectionPair, name: str = "t") -> tuple[int, Channel]:
    topic = pair.client.bind_topic(name)
    pair.run()
    return topic, Channel(ChannelKind.PUBLISH, topic)


def closed_by(events: list) -> ConnectionClosed:
    closed = of(ConnectionClosed, events)
    assert len(closed) == 1 and closed[0] is events[-1], events
    assert closed[0].by_peer is False and closed[0].error is not None
    return closed[0]


def test_a_violation_queues_a_goodbye_with_its_code_and_stops_processing() -> None:
    pair = ConnectionPair()
    _, channel = open_topic(pair)
    bad = encode(Absolve(channel, 10**9)) + encode(Apologise(channel))
    events = pair.broker.receive_data(bad, 0.0)
    closed = closed_by(events)
    assert closed.code == GoodbyeCode.PROTOCOL_ERROR and "exceeds" in closed.reason
    goodbye = split_frames(pair.broker.data_to_send())[-1]
    assert goodbye == encode(Goodbye(1, closed.reason))
    assert pair.broker.closed
    assert pair.broker.receive_data(encode(Apologise(channel)), 0.0) == []
    # The bad Absolve changed nothing.
    assert pair.broker.receiver(channel).sender_balance == pair.broker.policy.publish_capacity


@pytest.mark.parametrize(
    ("message", "fragment"),
    [
        (Apologise(Channel(2, 0)), "not dropping"),
        (IssueGuarantee(Channel(2, 0), 5), "not a channel this side sends"),
        (AnnounceDropping(Channel(2, 0)), "not a channel this side sends"),
        (Absolve(Channel(3, 0), 1), "not a channel this side receives"),
        (Absolve(Channel(2, 7), 1), "unbound topic handle 7"),
    ],
)
def test_guarantee_messages_in_the_wrong_state_or_direction(message: object, fragment: str) -> None:
    pair = ConnectionPair()
    open_topic(pair)
    events = pair.broker.receive_data(encode(message), 0.0)  # type: ignore[arg-type]
    assert fragment in closed_by(events).reason


def test_announce_dropping_with_nothing_unconfirmed_is_an_error() -> None:
    pair = ConnectionPair()
    _, channel = open_topic(pair)
    events = pair.client.receive_data(encode(AnnounceDropping(channel)), 0.0)
    assert "no unconfirmed frames" in closed_by(events).reason


def test_guarantees_overflowing_u64_are_limit_exceeded() -> None:
    pair = ConnectionPair()
    _, channel = open_topic(pair)
    events = pair.client.receive_data(encode(IssueGuarantee(channel, U64_MAX)), 0.0)
    assert closed_by(events).code == GoodbyeCode.LIMIT_EXCEEDED


def test_a_deliver_beyond_the_subscribers_guarantees_is_limit_exceeded() -> None:
    pair = ConnectionPair(client_policy=Policy(deliver_capacity=20))
    topic, _ = open_topic(pair)
    sub = pair.client.subscribe(topic)
    pair.run()
    events = pair.client.receive_data(encode(Deliver(sub, 1, b"x" * 40)), 0.0)
    assert closed_by(events).code == GoodbyeCode.LIMIT_EXCEEDED


def test_the_broker_never_delivers_beyond_guarantees() -> None:
    pair = ConnectionPair(
        client_policy=Policy(deliver_capacity=30, optimism=10_000),
        broker_policy=Policy(optimism=10_000),
    )
    topic, _ = open_topic(pair)
    sub = pair.client.subscribe(topic)
    pair.run()
    pair.broker.deliver(sub, 1, b"x" * 10)
    with pytest.raises(NoGuarantees):
        pair.broker.deliver(sub, 2, b"x" * 10)  # optimism does not apply to deliveries


def test_limit_sending_must_tighten_strictly_exceeding_is_code_3() -> None:
    pair = ConnectionPair()
    _, channel = open_topic(pair)
    pair.client.limit_sending(channel, 100)
    for bound in (100, 101):  # equal or looser: refused, nothing sent
        with pytest.raises(LocalProtocolError, match="does not tighten"):
            pair.client.limit_sending(channel, bound)
    pair.run()
    assert pair.broker.receiver(channel).sending_limit == 100
    pair.client.publish(channel.index, b"x" * 50)
    pair.run()
    assert pair.broker.receiver(channel).sending_limit == pair.client.sender(channel).sending_limit
    left = pair.client.sender(channel).sending_limit
    assert left is not None and 0 < left < 100
    with pytest.raises(NoGuarantees):
        pair.client.publish(channel.index, b"x" * 100)  # would break its own bound
    # A looser bound or an oversized frame from the peer is a protocol error.
    events = pair.broker.receive_data(encode(LimitSending(channel, left + 1)), 0.0)
    assert "does not tighten" in closed_by(events).reason
    pair2 = ConnectionPair()
    _, ch2 = open_topic(pair2)
    pair2.broker.receive_data(encode(LimitSending(ch2, 5)), 0.0)
    events = pair2.broker.receive_data(encode(Publish(0, b"x" * 20)), 0.0)
    assert closed_by(events).code == GoodbyeCode.LIMIT_EXCEEDED


def test_limit_sending_counts_dropped_frames_on_both_sides_equally() -> None:
    pair = ConnectionPair(
        client_policy=Policy(optimism=1000), broker_policy=Policy(publish_capacity=30)
    )
    _, channel = open_topic(pair)
    pair.client.limit_sending(channel, 500)
    for _ in range(5):
        pair.client.publish(channel.index, b"y" * 15)
    pair.run()
    receiver = pair.broker.receiver(channel)
    assert receiver.dropped_frames > 0
    assert receiver.sending_limit == pair.client.sender(channel).sending_limit


def test_limit_receiving_bounds_future_guarantees_and_closes_at_zero() -> None:
    pair = ConnectionPair(broker_policy=Policy(publish_capacity=100))
    _, channel = open_topic(pair)
    pair.broker.limit_receiving(channel, 30)
    for bound in (31, 30):  # looser or equal: refused, nothing sent
        with pytest.raises(LocalProtocolError, match="does not tighten"):
            pair.broker.limit_receiving(channel, bound)
    pair.run()
    sender = pair.client.sender(channel)
    assert sender.receiving_limit == 30
    # Spend all 100 guarantees; processing frees space but only 30 more bytes may be issued.
    pair.client.publish(channel.index, payload_for(channel.index, 50))
    pair.client.publish(channel.index, payload_for(channel.index, 50))
    assert pair.client.room(channel) == 0
    pair.run()
    for event in of(PublishReceived, pair.broker_events):
        pair.broker.release(event)
    pair.run()
    receiver = pair.broker.receiver(channel)
    assert receiver.receiving_limit == sender.receiving_limit == 0
    assert receiver.issued_total == 130
    assert sender.balance == 30
    pair.client.publish(channel.index, payload_for(channel.index, 30))
    pair.run()
    assert sender.balance == 0 and sender.receiving_closed


def test_optimistic_publishing_into_a_full_channel_delivers_everything_once_in_order() -> None:
    pair = ConnectionPair(
        client_policy=Policy(optimism=400), broker_policy=Policy(publish_capacity=100)
    )
    topic, channel = open_topic(pair)
    sent: list[bytes] = []
    received: list[bytes] = []
    for i in range(200):
        payload = b"%04d" % i + b"." * (i % 23)
        while True:
            try:
                pair.client.publish(topic, payload)
                break
            except NoGuarantees:
                # Let the broker catch up: deliver a few frames, process one.
                pair.to_broker(3)
                pair.to_client(3)
                pending = of(PublishReceived, pair.broker_events)[len(received) :]
                if pending:
                    received.append(pending[0].message.payload)
                    pair.broker.release(pending[0])
        sent.append(payload)
        pair.to_broker(1)  # interleave: the wire moves while the client publishes
    while True:
        pair.run()
        pending = of(PublishReceived, pair.broker_events)[len(received) :]
        if not pending:
            break
        for event in pending:
            received.append(event.message.payload)
            pair.broker.release(event)
    pair.assert_no_errors()
    assert received == sent
    assert of(DropAnnounced, pair.client_events), "the channel never saturated"
    assert pair.client.sender(channel).balance == pair.broker.receiver(channel).sender_balance


def test_issue_threshold_batches_guarantees() -> None:
    pair = ConnectionPair(broker_policy=Policy(publish_capacity=1000, issue_threshold=500))
    topic, channel = open_topic(pair)
    sizes = [pair.client.publish(topic, payload_for(topic, 25)) for _ in range(40)]
    assert sizes == [25] * 40  # all 1000 bytes of guarantees spent
    pair.run()
    events = of(PublishReceived, pair.broker_events)
    receiver = pair.broker.receiver(channel)
    issued_before = receiver.issued_total
    # The sender has nothing left: the first freed frame is promised at once.
    pair.broker.release(events[0])
    assert receiver.issued_total == issued_before + 25
    # From then on the sender holds guarantees, so freed space is batched.
    for event in events[1:20]:
        pair.broker.release(event)
    assert receiver.issued_total == issued_before + 25  # 475 bytes issuable: below 500
    pair.broker.release(events[20])
    assert receiver.issued_total == issued_before + 525  # one aggregated guarantee
    pair.run()
    pair.assert_no_errors()


def test_may_issue_withholds_guarantees_until_asked_again() -> None:
    class Gate(Policy):
        open = False

        def may_issue(self, channel: Channel) -> bool:
            return self.open or channel.kind != ChannelKind.PUBLISH

    gate = Gate(publish_capacity=100)
    pair = ConnectionPair(broker_policy=gate)
    _, channel = open_topic(pair)
    assert pair.client.room(channel) == 0
    gate.open = True
    pair.broker.issue_guarantees()
    pair.run()
    assert pair.client.room(channel) == 100


def test_set_capacity_shrinks_an_idle_channel_by_pleading() -> None:
    pair = ConnectionPair(broker_policy=Policy(publish_capacity=100))
    _, channel = open_topic(pair)
    pair.broker.set_capacity(channel, 40)
    pair.run()
    receiver = pair.broker.receiver(channel)
    assert receiver.capacity == 40 and receiver.target_capacity is None
    assert pair.client.sender(channel).balance == 40
    pair.broker.set_capacity(channel, 70)
    pair.run()
    assert pair.client.sender(channel).balance == 70


def test_spontaneous_absolve_returns_budget() -> None:
    pair = ConnectionPair(broker_policy=Policy(publish_capacity=100))
    _, channel = open_topic(pair)
    pair.client.absolve(channel, 60)
    with pytest.raises(LocalProtocolError):
        pair.client.absolve(channel, 41)
    pair.run()
    assert pair.broker.receiver(channel).capacity == 40
    assert pair.client.sender(channel).balance == 40
    assert isinstance(LimitReceiving(channel, 0), LimitReceiving)


def test_without_pleading_an_idle_channel_keeps_its_promises() -> None:
    pair = ConnectionPair(broker_policy=Policy(publish_capacity=100, plead_on_shrink=False))
    topic, channel = open_topic(pair)
    pair.broker.set_capacity(channel, 40)
    pair.run()
    receiver = pair.broker.receiver(channel)
    # No Plead: the sender keeps its 100 bytes and the buffer cannot shrink yet...
    assert pair.client.sender(channel).balance == 100 and receiver.capacity == 100
    assert receiver.target_capacity == 40
    # ...until frames are processed, each shrinking it instead of being re-promised.
    pair.client.publish(topic, payload_for(topic, 60))
    pair.run()
    for event in of(PublishReceived, pair.broker_events):
        pair.broker.release(event)
    assert receiver.capacity == 40 and receiver.target_capacity is None
    assert receiver.issuable == 0 and pair.client.sender(channel).balance == 40


def test_deliver_slack_covers_the_largest_per_subscriber_fields() -> None:
    from broker.protocol.connection import DELIVER_SLACK

    for payload in (b"", b"x" * 23, b"x" * 1000):
        publish = len(encode(Publish(0, payload)))
        deliver = len(encode(Deliver(U64_MAX, U64_MAX, payload)))
        assert deliver - publish <= DELIVER_SLACK


def test_goodbye_reasons_are_bounded_even_when_they_echo_peer_text() -> None:
    from broker.protocol import MessageType

    pair = ConnectionPair()
    topic, _ = open_topic(pair)
    import cbor2

    body = cbor2.dumps([int(MessageType.SUBSCRIBE), topic, "m" * 50_000, {}])
    events = pair.broker.receive_data(len(body).to_bytes(4, "big") + body, 0.0)
    closed = closed_by(events)
    assert len(closed.reason) <= 200
    assert len(pair.broker.data_to_send()) < 400


def test_control_messages_about_unconfirmed_or_freed_handles_are_refused_locally() -> None:
    pair = ConnectionPair(
        client_policy=Policy(optimism=10_000), broker_policy=Policy(bind_capacity=10)
    )
    topic = pair.client.bind_topic("optimistic")  # beyond the 10-byte guarantee
    channel = Channel(ChannelKind.PUBLISH, topic)
    for action in (
        lambda: pair.client.limit_sending(channel, 5),
        lambda: pair.client.absolve(channel, 0),
    ):
        with pytest.raises(LocalProtocolError, match="not confirmed or is being freed"):
            action()
    assert pair.client.sender(channel).sending_limit is None  # nothing changed
    pair2 = ConnectionPair()
    topic2, channel2 = open_topic(pair2)
    pair2.client.free_handle(HandleType.TOPIC, topic2)
    with pytest.raises(LocalProtocolError):
        pair2.client.limit_sending(channel2, 5)


@pytest.mark.parametrize("who", ["client", "broker"])
def test_throttled_about_a_topic_being_freed_is_refused_locally(who: str) -> None:
    """Once the broker has sent its FreeHandle (answering the client's, or
    proposing), it says nothing more about the topic, not even Throttled:
    the client may have deleted the handle already (issue 18, item 13)."""
    pair = ConnectionPair()
    topic, channel = open_topic(pair)
    pair.client.publish(topic, b"still buffered at the broker")
    pair.broker.throttled(channel, True)  # while bound: fine
    pair.run()
    if who == "client":
        pair.client.free_handle(HandleType.TOPIC, topic)
        pair.to_broker()  # the broker answers with its own FreeHandle
    else:
        pair.broker.free_handle(HandleType.TOPIC, topic)
    # The buffered publish keeps the handle (and its channel) at the broker...
    assert channel in pair.broker.receiving_channels
    for action in (
        lambda: pair.broker.throttled(channel, False),
        lambda: pair.broker.confirm(topic, 1),
    ):
        with pytest.raises(LocalProtocolError, match="being freed"):
            action()
    pair.run()
    # ...until it is processed; the client saw nothing about the topic after it.
    (received,) = of(PublishReceived, pair.broker_events)
    pair.broker.release(received)
    pair.run()
    pair.assert_no_errors()
    assert topic not in pair.client.topics and topic not in pair.broker.topics


def confirm_counts(published: int, counts: list[int]) -> list[ConnectionClosed]:
    """A client that published ``published`` times on a topic receives
    Confirms with ``counts``, in order; the closes that causes."""
    pair = ConnectionPair()
    topic, _ = open_topic(pair)
    for _ in range(published):
        pair.client.publish(topic, b"m")
    pair.run()
    events = []
    for count in counts:
        events += pair.client.receive_data(encode(Confirm(topic, count)), 0.0)
    return of(ConnectionClosed, events)


@pytest.mark.parametrize(
    ("published", "counts", "fine"),
    [
        (0, [0], True),  # nothing published, nothing confirmed: a (pointless) repeat
        (1, [1], True),
        (3, [1, 3], True),
        (3, [2, 2], True),  # a repeat of the last count changes nothing
        (0, [1], False),  # nothing was published
        (0, [5], False),
        (1, [2], False),  # more than was published
        (3, [2, 1], False),  # a count going backwards
        (3, [3, 0], False),
    ],
)
def test_confirm_counts_follow_one_rule(published: int, counts: list[int], fine: bool) -> None:
    """A Confirm count never goes back and never exceeds the publishes sent
    on the handle in the session; anything else is code 1 (issue 18, item 15)."""
    closed = confirm_counts(published, counts)
    if fine:
        assert closed == []
    else:
        assert len(closed) == 1 and closed[0].code == GoodbyeCode.PROTOCOL_ERROR
        assert "Confirm of" in closed[0].reason


def test_a_repeated_limit_is_a_protocol_error_from_either_end() -> None:
    """An equal bound does not tighten: refused from the peer (code 1), in
    both directions (issue 18, item 17)."""
    pair = ConnectionPair()
    _, channel = open_topic(pair)
    pair.client.limit_sending(channel, 100)
    pair.broker.limit_receiving(channel, 1000)
    pair.run()
    events = pair.broker.receive_data(encode(LimitSending(channel, 100)), 0.0)
    assert closed_by(events).code == GoodbyeCode.PROTOCOL_ERROR
    assert pair.broker.receiver(channel).sending_limit == 100  # unchanged
    events = pair.client.receive_data(encode(LimitReceiving(channel, 1000)), 0.0)
    assert closed_by(events).code == GoodbyeCode.PROTOCOL_ERROR
    assert pair.client.sender(channel).receiving_limit == 1000  # unchanged
