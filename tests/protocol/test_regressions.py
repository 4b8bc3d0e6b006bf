"""Regressions found by the stateful and fuzz tests, pinned deterministically."""

from __future__ import annotations

import pytest

from broker.protocol import (
    Channel,
    ChannelKind,
    ChannelReceiver,
    ChannelSender,
    LocalProtocolError,
    Policy,
    SentFrame,
)

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
