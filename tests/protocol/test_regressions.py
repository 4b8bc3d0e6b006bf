"""Regressions found by the stateful and fuzz tests, pinned deterministically."""

from __future__ import annotations

import pytest

from broker.protocol import Channel, ChannelKind, LocalProtocolError, Policy
from broker.protocol.guarantees import ChannelReceiver, ChannelSender, SentFrame

CH = Channel(ChannelKind.PUBLISH, 0)


def optimistic_state() -> tuple[ChannelReceiver, ChannelSender]:
    """Capacity 100, 60 bytes buffered of which 30 were accepted optimistically."""
    receiver, sender = ChannelReceiver(CH, 100), ChannelSender(CH)
    guarantee = receiver.issue(30)
    assert guarantee is not None
    sender.on_guarantee(guarantee.amount)
    for size in (30, 30):  # the second frame is beyond the guarantees
        sender.record_sent(SentFrame(size, b"", None))
        accepted, _ = receiver.on_frame(size)
        assert accepted
    assert receiver.sender_balance == sender.balance == -30
    return receiver, sender


def test_shrinking_never_reclaims_what_is_owed_to_optimistic_frames() -> None:
    receiver, sender = optimistic_state()
    receiver.set_capacity(0)
    assert receiver.buffered <= receiver.capacity
    # The 30 bytes owed for the optimistic frame can still be issued, confirming it.
    assert receiver.issuable >= 30
    guarantee = receiver.issue(30)
    assert guarantee is not None
    assert len(sender.on_guarantee(guarantee.amount)) == 1
    assert not sender.unconfirmed


def test_limit_receiving_cannot_go_below_what_accepted_optimistic_frames_are_owed() -> None:
    receiver, _ = optimistic_state()
    with pytest.raises(LocalProtocolError, match="owed"):
        receiver.limit_receiving(29)
    message = receiver.limit_receiving(30)
    assert message.bound == 30 and receiver.issuable == 30


def test_bind_channels_are_never_batched() -> None:
    policy = Policy(issue_threshold=1000)
    for kind, expected in ((ChannelKind.TOPIC_BINDS, 10), (ChannelKind.PUBLISH, 0)):
        receiver = ChannelReceiver(Channel(kind, 0), 200)
        receiver.issue(190)
        assert receiver.on_frame(100)[0]  # 100 buffered, the sender keeps 90
        assert receiver.issuable == 10
        # A publish channel waits: releasing its 100 buffered bytes completes a batch.
        assert policy.amount_to_issue(receiver) == expected


def test_a_batch_processing_cannot_complete_is_not_waited_for() -> None:
    policy = Policy(issue_threshold=1000)
    receiver = ChannelReceiver(CH, 200)
    receiver.issue(190)
    assert receiver.buffered == 0 and receiver.sender_balance == 190
    assert policy.amount_to_issue(receiver) == 10  # nothing will ever free up more
    limited = ChannelReceiver(CH, 200)
    limited.issue(150)
    assert limited.on_frame(100)[0]
    limited.limit_receiving(20)
    assert policy.amount_to_issue(limited) == 20  # the limit caps any batch


def test_a_sender_that_can_send_its_largest_frame_waits_for_a_batch() -> None:
    """With the largest frame known, the shortcut for a batch processing
    cannot complete applies only to a sender that may be stuck on a frame."""
    policy = Policy(issue_threshold=1000)
    receiver = ChannelReceiver(CH, 200)
    receiver.largest_frame = 50
    receiver.issue(190)
    assert receiver.buffered == 0 and receiver.sender_balance == 190
    assert policy.amount_to_issue(receiver) == 0  # it can send any frame: they complete a batch
    receiver.largest_frame = 191
    assert policy.amount_to_issue(receiver) == 10  # it may be waiting for a frame of 191
    limited = ChannelReceiver(CH, 200)
    limited.largest_frame = 50
    limited.issue(150)
    assert limited.on_frame(100)[0]
    limited.limit_receiving(20)
    assert policy.amount_to_issue(limited) == 20  # a receiving limit still caps the batch


def test_publishes_trickling_in_are_answered_by_a_guarantee_per_batch_not_per_frame() -> None:
    """A publisher whose frames are processed one by one as they come gets
    its guarantees back a batch at a time (a quarter of the channel), not
    with an IssueGuarantee per frame."""
    from broker.protocol import GuaranteesReceived, PublishReceived

    from .pair import ConnectionPair, of

    pair = ConnectionPair(broker_max_frame=1024)
    topic = pair.client.bind_topic("t")
    pair.run()
    channel = Channel(ChannelKind.PUBLISH, topic)
    capacity = pair.broker.receiver(channel).capacity
    pair.client_events.clear()

    def trickle(count: int) -> None:
        """``count`` publishes, each read and processed before the next."""
        for _ in range(count):
            pair.client.publish(topic, b"x" * 100)
            pair.run()
            for event in of(PublishReceived, pair.broker_events):
                pair.broker.release(event)
            pair.broker_events.clear()
            pair.run()

    trickle(200)
    assert pair.broker.receiver(channel).accepted_frames == 200
    assert capacity // 4 > 200 * 120  # (fewer bytes than a batch)
    assert of(GuaranteesReceived, pair.client_events) == []
    # Past a quarter of the channel, one IssueGuarantee gives it all back.
    trickle(capacity // 4 // 100)
    assert len(of(GuaranteesReceived, pair.client_events)) == 1
    assert pair.client.sender(channel).balance > capacity - capacity // 4
