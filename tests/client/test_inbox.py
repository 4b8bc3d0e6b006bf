"""The subscription inbox: messages in order, and a frame's space released
once its last message is taken (a DeliverMany holds many)."""

from __future__ import annotations

import pytest

from broker.client import Message
from broker.client._inbox import Inbox, message_of, messages_of
from broker.protocol import (
    Channel,
    ChannelKind,
    Deliver,
    DeliverMany,
    DeliverManyReceived,
    DeliverReceived,
)

CHANNEL = Channel(ChannelKind.DELIVER, 4)


def one(seq: int, size: int = 20) -> DeliverReceived:
    return DeliverReceived(Deliver(4, seq, b"p%d" % seq), CHANNEL, size)


def many(first: int, count: int, size: int) -> DeliverManyReceived:
    entries = [(b"p%d" % (first + i), b"k" if i % 2 else None, None) for i in range(count)]
    return DeliverManyReceived(DeliverMany(4, first, entries), CHANNEL, size)


def test_messages_come_out_in_order_with_their_sequence_numbers() -> None:
    inbox = Inbox("t")
    assert inbox.put(one(1)) == 1
    assert inbox.put(many(2, 3, 50)) == 3
    assert inbox.put(one(5)) == 1
    assert len(inbox) == 5
    taken = [inbox.take() for _ in range(5)]
    assert [m.seq for m in taken] == [1, 2, 3, 4, 5]
    assert [m.payload for m in taken] == [b"p1", b"p2", b"p3", b"p4", b"p5"]
    assert [m.key for m in taken] == [None, None, b"k", None, None]
    assert {m.topic for m in taken} == {"t"}
    assert not inbox


def test_a_frame_is_released_whole_when_its_last_message_is_taken() -> None:
    inbox = Inbox("t")
    inbox.put(many(10, 3, 77))
    inbox.put(one(13, size=21))
    inbox.take()
    inbox.take()
    assert inbox.collect() == (0, 0)  # the DeliverMany is only partly taken
    inbox.take()
    assert inbox.collect() == (77, 3)  # its size, one count per entry
    assert inbox.collect() == (0, 0)  # handed out once
    inbox.take()
    assert inbox.collect() == (21, 1)


def test_take_many_stops_at_its_limit_and_counts_whole_frames_only() -> None:
    inbox = Inbox("t")
    inbox.put(one(1, size=20))
    inbox.put(many(2, 4, 90))
    assert [m.seq for m in inbox.take_many(3)] == [1, 2, 3]
    assert inbox.collect() == (20, 1)
    assert [m.seq for m in inbox.take_many(100)] == [4, 5]
    assert inbox.collect() == (90, 4)
    assert not inbox


def test_clear_gives_back_every_frame_not_released_even_one_partly_taken() -> None:
    inbox = Inbox("t")
    inbox.put(one(1, size=10))
    inbox.put(many(2, 4, 100))
    inbox.put(one(6, size=30))
    inbox.take()  # a whole frame, not collected yet
    inbox.take()  # part of the DeliverMany: its space is still held
    assert inbox.clear() == (140, 6)
    assert not inbox and len(inbox) == 0
    assert inbox.clear() == (0, 0)
    assert inbox.collect() == (0, 0)


@pytest.mark.parametrize("headers", [None, [("h", b"v"), ("h", b"w")]])
def test_the_fast_builders_make_what_the_constructor_makes(
    headers: list[tuple[str, bytes]] | None,
) -> None:
    deliver = Deliver(1, 9, b"payload", b"key", headers)
    assert message_of("t", deliver) == Message("t", b"payload", b"key", headers, 9)
    built = messages_of("t", 70_000, [(b"a", None, headers), (b"b", b"k", None)])
    assert built == [
        Message("t", b"a", None, headers, 70_000),
        Message("t", b"b", b"k", None, 70_001),
    ]
