"""Every diagram of the seed "Resource Management", as a test.

Each test builds the diagram's starting state through the real operations
(grow, issue, send, accept, release), then replays the diagram's steps and
checks both sides' numbers at each step. Sizes are in bytes ("slots").
"""

from __future__ import annotations

import pytest

from broker.protocol import (
    AnnounceDropping,
    Channel,
    ChannelKind,
    GoodbyeCode,
    IssueGuarantee,
    RemoteProtocolError,
)
from broker.protocol.guarantees import ChannelReceiver, ChannelSender, SentFrame

CH = Channel(ChannelKind.PUBLISH, 0)


def send(sender: ChannelSender, size: int) -> SentFrame:
    entry = SentFrame(size, b"x" * size, None)
    sender.record_sent(entry)
    return entry


def deliver(receiver: ChannelReceiver, size: int) -> bool:
    accepted, _ = receiver.on_frame(size)
    return accepted


def grant(receiver: ChannelReceiver, sender: ChannelSender, amount: int | None = None) -> None:
    message = receiver.issue(amount)
    assert message is not None
    sender.on_guarantee(message.amount)


def fill(receiver: ChannelReceiver, sender: ChannelSender, *sizes: int) -> None:
    """Sender sends frames within guarantees and the receiver buffers them."""
    for size in sizes:
        assert size <= sender.balance
        send(sender, size)
        assert deliver(receiver, size)


def test_six_slots_sending_a_message_uses_guarantees_not_issuable_space() -> None:
    receiver, sender = ChannelReceiver(CH, 6), ChannelSender(CH)
    grant(receiver, sender, 4)
    assert (receiver.issuable, sender.balance) == (2, 4)
    send(sender, 3)
    assert sender.balance == 1
    assert deliver(receiver, 3)
    assert (receiver.buffered, receiver.free, receiver.issuable) == (3, 3, 2)
    assert receiver.sender_balance == sender.balance


def test_capacity_increase_from_zero_then_issue() -> None:
    receiver, sender = ChannelReceiver(CH, 0), ChannelSender(CH)
    assert (receiver.capacity, receiver.issuable, sender.balance) == (0, 0, 0)
    receiver.grow(5)
    assert (receiver.capacity, receiver.issuable) == (5, 5)
    grant(receiver, sender)
    assert (receiver.issuable, sender.balance) == (0, 5)


def test_processing_twice_then_one_aggregated_issue() -> None:
    receiver, sender = ChannelReceiver(CH, 7), ChannelSender(CH)
    grant(receiver, sender)
    fill(receiver, sender, 2, 1, 2)
    assert (receiver.free, receiver.issuable, sender.balance) == (2, 0, 2)
    receiver.release(2)
    assert (receiver.free, receiver.issuable) == (4, 2)
    receiver.release(1)
    assert (receiver.buffered, receiver.issuable) == (2, 3)
    message = receiver.issue()
    assert message == IssueGuarantee(CH, 3)
    sender.on_guarantee(3)
    assert (receiver.issuable, sender.balance) == (0, 5)


def test_shrinking_by_processing_without_issuing() -> None:
    receiver, sender = ChannelReceiver(CH, 6), ChannelSender(CH)
    grant(receiver, sender)
    fill(receiver, sender, 2, 2)
    assert (receiver.free, receiver.issuable, sender.balance) == (2, 0, 2)
    assert receiver.set_capacity(4) == 0  # processing alone can reach the target
    assert receiver.capacity == 6  # nothing unpromised to reclaim yet
    receiver.release(2)
    assert (receiver.capacity, receiver.buffered, receiver.issuable) == (4, 2, 0)
    assert receiver.target_capacity is None
    assert sender.balance == receiver.sender_balance == 2


def test_plead_and_absolve_without_concurrency_seven_to_three() -> None:
    receiver, sender = ChannelReceiver(CH, 7), ChannelSender(CH)
    grant(receiver, sender)
    assert receiver.set_capacity(3) == 4  # an empty buffer needs the sender's help
    plead = receiver.plead_for_target()
    assert plead is not None and plead.target == 3
    absolve = sender.on_plead(plead.target)
    assert absolve is not None and absolve.amount == 4
    assert sender.balance == 3
    receiver.on_absolve(absolve.amount)
    assert (receiver.capacity, receiver.issuable, receiver.sender_balance) == (3, 0, 3)


def test_plead_with_a_concurrent_one_byte_message_ends_at_capacity_seven() -> None:
    receiver, sender = ChannelReceiver(CH, 9), ChannelSender(CH)
    grant(receiver, sender)
    fill(receiver, sender, 2)
    assert (receiver.buffered, receiver.issuable, sender.balance) == (2, 0, 7)
    plead = receiver.plead(4)  # in flight to the client...
    send(sender, 1)  # ...while the client sends one byte
    assert sender.balance == 6
    assert deliver(receiver, 1)
    absolve = sender.on_plead(plead.target)
    assert absolve is not None and absolve.amount == 2
    assert sender.balance == 4
    receiver.on_absolve(absolve.amount)
    assert receiver.capacity == 7
    assert (receiver.buffered, receiver.free, receiver.issuable) == (3, 4, 0)
    assert receiver.sender_balance == sender.balance == 4


def test_plead_is_ignored_by_a_sender_already_below_the_target() -> None:
    receiver, sender = ChannelReceiver(CH, 5), ChannelSender(CH)
    grant(receiver, sender)
    fill(receiver, sender, 3)
    assert sender.on_plead(2) is None  # balance 2 is not above the target
    assert sender.on_plead(3) is None


def test_optimistic_send_into_free_space_diagram() -> None:
    receiver, sender = ChannelReceiver(CH, 7), ChannelSender(CH)
    grant(receiver, sender, 6)
    fill(receiver, sender, 4, 2)
    assert (receiver.free, receiver.issuable, sender.balance) == (1, 1, 0)
    receiver.release(4)
    assert (receiver.free, receiver.issuable) == (5, 5)
    entry = send(sender, 3)  # optimistic: no guarantees left
    assert sender.balance == -3 and list(sender.unconfirmed) == [entry]
    assert deliver(receiver, 3)
    assert (receiver.free, receiver.issuable, receiver.dropping) == (2, 5, False)
    grant(receiver, sender)
    assert (receiver.issuable, sender.balance) == (0, 2)
    assert not sender.unconfirmed  # the guarantees confirmed the optimistic frame


def test_optimistic_send_dropped_angry_until_apology() -> None:
    receiver, sender = ChannelReceiver(CH, 7), ChannelSender(CH)
    grant(receiver, sender, 7)
    fill(receiver, sender, 6)
    assert (receiver.free, receiver.issuable, sender.balance) == (1, 0, 1)
    first = send(sender, 3)
    assert sender.balance == -2
    accepted, to_send = receiver.on_frame(3)
    assert not accepted and receiver.dropping  # angry
    assert to_send == [AnnounceDropping(CH)]  # nothing issuable to send first
    second = send(sender, 1)
    assert sender.balance == -3
    accepted, to_send = receiver.on_frame(1)  # fits, but the channel is dropping
    assert not accepted and to_send == []
    assert (receiver.buffered, receiver.issuable) == (6, 0)  # state unchanged
    apology, dropped = sender.on_announce_dropping()
    assert apology.channel == CH
    assert dropped == [first, second]
    assert sender.balance == 1
    receiver.on_apologise()
    assert not receiver.dropping  # happy again
    assert list(sender.retransmit) == [first, second]


def test_partly_optimistic_two_bytes_survive_and_three_bytes_are_dropped() -> None:
    receiver, sender = ChannelReceiver(CH, 7), ChannelSender(CH)
    grant(receiver, sender, 4)
    fill(receiver, sender, 3)
    assert (receiver.free, receiver.issuable, sender.balance) == (4, 3, 1)
    two = send(sender, 2)  # one of its bytes is optimistic
    assert sender.balance == -1 and list(sender.unconfirmed) == [two]
    assert deliver(receiver, 2)
    three = send(sender, 3)
    assert sender.balance == -4
    accepted, to_send = receiver.on_frame(3)
    assert not accepted
    # The first-drop rule: exactly the issuable amount of this moment, then the announcement.
    assert to_send == [IssueGuarantee(CH, 3), AnnounceDropping(CH)]
    confirmed = sender.on_guarantee(3)
    assert confirmed == [two]  # the client learns the 2-byte message made it
    assert list(sender.unconfirmed) == [three]
    _, dropped = sender.on_announce_dropping()
    assert dropped == [three]
    assert sender.balance == receiver.sender_balance == 2
    receiver.on_apologise()
    assert (receiver.buffered, receiver.free, receiver.issuable) == (5, 2, 0)


def test_issuing_freed_space_before_the_announcement_would_mislead_the_sender() -> None:
    """Why the first-drop rule is not optional: break it and the sender misjudges."""
    receiver, sender = ChannelReceiver(CH, 7), ChannelSender(CH)
    grant(receiver, sender, 4)
    fill(receiver, sender, 3)
    two = send(sender, 2)
    deliver(receiver, 2)
    three = send(sender, 3)
    accepted, to_send = receiver.on_frame(3)
    assert not accepted
    owed = to_send[0]
    assert isinstance(owed, IssueGuarantee) and owed.amount == 3
    # A wrong receiver processes its old 3-byte frame and promises the freed
    # space too before announcing (here: both amounts reach the sender first).
    receiver.release(3)
    extra = receiver.issue()
    assert extra is not None and extra.amount == 3
    sender.on_guarantee(owed.amount + extra.amount)
    # The dropped frame now looks buffered to the sender...
    assert two not in sender.unconfirmed and three not in sender.unconfirmed
    # ...so the announcement names nothing: a protocol error, and the frame is lost.
    with pytest.raises(RemoteProtocolError, match="no unconfirmed frames"):
        sender.on_announce_dropping()


def test_a_sender_that_goes_on_sending_on_a_dropping_channel_is_cut_off() -> None:
    """``max_dropping``: what a sender sends after the first drop and before
    its Apologise is bounded (a sender that heeds AnnounceDropping stops at
    what it had in flight); past it, code 3. The Apologise starts afresh."""
    receiver = ChannelReceiver(Channel(ChannelKind.PUBLISH, 0), 10)
    receiver.max_dropping = 100
    receiver.issue(10)
    assert receiver.on_frame(10)[0]  # within the guarantees
    accepted, to_send = receiver.on_frame(60)  # the first drop: not counted
    assert not accepted and receiver.dropping and to_send
    assert receiver.on_frame(60) == (False, [])
    assert receiver.on_frame(40) == (False, [])  # 100 dropped since: the bound
    with pytest.raises(RemoteProtocolError, match="more than 100 bytes") as raised:
        receiver.on_frame(1)
    assert raised.value.code == GoodbyeCode.LIMIT_EXCEEDED
    receiver.on_apologise()
    assert receiver.dropping_bytes == 0
