"""Runs of Publish or Deliver frames on one handle, read in one go, are
accepted exactly as frame by frame: each within its guarantees, in order,
and a frame that breaks a rule stops the run with the right Goodbye."""

from __future__ import annotations

from broker.protocol import (
    Channel,
    ChannelKind,
    Deliver,
    DeliverReceived,
    FreeHandle,
    GoodbyeCode,
    HandleType,
    Policy,
    Publish,
    PublishReceived,
)
from broker.protocol.frames import encode

from .pair import ConnectionPair, of
from .test_rules import closed_by, open_topic


def test_a_run_of_deliveries_stops_at_the_first_beyond_the_guarantees() -> None:
    frame = len(encode(Deliver(0, 1, b"x" * 30)))
    pair = ConnectionPair(client_policy=Policy(deliver_capacity=5 * frame, issue_fraction=1.0))
    topic, _ = open_topic(pair)
    sub = pair.client.subscribe(topic)
    pair.run()
    data = b"".join(encode(Deliver(sub, seq, b"x" * 30)) for seq in range(1, 8))
    events = pair.client.receive_data(data, 0.0)
    assert [e.message.seq for e in of(DeliverReceived, events)] == [1, 2, 3, 4, 5]
    assert closed_by(events).code == GoodbyeCode.LIMIT_EXCEEDED
    receiver = pair.client.receiver(Channel(ChannelKind.DELIVER, sub))
    assert receiver.accepted_frames == 5


def test_runs_on_two_topics_interleaved_are_counted_per_topic() -> None:
    pair = ConnectionPair()
    first, _ = open_topic(pair, "a")
    second, _ = open_topic(pair, "b")
    order = [first, first, second, first, second, second, first]
    data = b"".join(encode(Publish(t, b"%d" % i)) for i, t in enumerate(order))
    events = pair.broker.receive_data(data, 0.0)
    received = of(PublishReceived, events)
    assert [(e.message.topic, e.message.payload) for e in received] == [
        (t, b"%d" % i) for i, t in enumerate(order)
    ]
    assert [e.topic_name for e in received] == [{first: "a", second: "b"}[t] for t in order]
    assert pair.broker.publishes_received[first] == 4
    assert pair.broker.publishes_received[second] == 3
    assert pair.broker.topics.references(first) == 4


def test_a_free_handle_in_the_middle_ends_the_run() -> None:
    """A Deliver after the broker's own FreeHandle of the subscription is
    refused, even right after a run of deliveries on it."""
    pair = ConnectionPair()
    topic, _ = open_topic(pair)
    sub = pair.client.subscribe(topic)
    pair.run()
    data = (
        encode(Deliver(sub, 1, b"x"))
        + encode(Deliver(sub, 2, b"x"))
        + encode(FreeHandle(HandleType.SUBSCRIPTION, sub, False))
        + encode(Deliver(sub, 3, b"x"))
    )
    events = pair.client.receive_data(data, 0.0)
    assert [e.message.seq for e in of(DeliverReceived, events)] == [1, 2]
    assert closed_by(events).code == GoodbyeCode.PROTOCOL_ERROR
