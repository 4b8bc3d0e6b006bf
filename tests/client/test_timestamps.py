"""Message.timestamp on the client side: the inbox gives each message of a
DeliverTimed its time and every other message None; ``timestamps=`` makes
the Subscribe option (reliable only, and only where the broker keeps logs)."""

from __future__ import annotations

import pytest

from broker.client import Message
from broker.client._inbox import Inbox, message_of, messages_of
from broker.client._start import subscribe_options, without_log_problem
from broker.protocol import (
    Channel,
    ChannelKind,
    Deliver,
    DeliverMany,
    DeliverManyReceived,
    DeliverReceived,
    DeliverTimed,
)

CHANNEL = Channel(ChannelKind.DELIVER, 4)
T0 = 1_764_294_000_000


def test_a_deliver_timed_gives_each_message_its_time() -> None:
    inbox = Inbox("t")
    inbox.offsets = True
    entries = [(b"a", None, None), (b"b", b"k", [("h", b"v")]), (b"c", None, None)]
    assert (
        inbox.put(DeliverManyReceived(DeliverTimed(4, 10, entries, [T0, T0, T0 + 5]), CHANNEL, 90))
        == 3
    )
    assert inbox.put(DeliverReceived(Deliver(4, 13, b"d"), CHANNEL, 20)) == 1
    assert (
        inbox.put(DeliverManyReceived(DeliverMany(4, 14, [(b"e", None, None)]), CHANNEL, 20)) == 1
    )
    taken = [inbox.take() for _ in range(5)]
    assert [m.timestamp for m in taken] == [T0, T0, T0 + 5, None, None]
    assert [m.offset for m in taken] == [10, 11, 12, 13, 14]
    assert taken[1] == Message("t", b"b", b"k", [("h", b"v")], 11, 11, T0)
    assert inbox.collect() == (130, 5)


def test_timestamp_defaults_to_none() -> None:
    assert Message("t", b"p", None, None, 3).timestamp is None
    assert message_of("t", Deliver(0, 1, b"p")).timestamp is None
    assert [m.timestamp for m in messages_of("t", 1, [(b"p", None, None)])] == [None]
    assert [m.timestamp for m in messages_of("t", 1, [(b"p", None, None)], True, [T0])] == [T0]
    with pytest.raises(ValueError):
        messages_of("t", 1, [(b"p", None, None)], True, [T0, T0])


def test_timestamps_makes_the_option() -> None:
    assert subscribe_options("reliable", None, timestamps=True) == {"timestamps": True}
    assert subscribe_options("reliable", {"x": 1}, 5, timestamps=True) == {
        "x": 1,
        "from": 5,
        "timestamps": True,
    }
    given = {"timestamps": True}
    assert subscribe_options("reliable", given) is given  # (asked in the options: as it was)
    with pytest.raises(ValueError, match="say the same thing"):
        subscribe_options("reliable", {"timestamps": False}, timestamps=True)
    with pytest.raises(ValueError, match="timestamps= needs mode='reliable'"):
        subscribe_options("lossy", None, timestamps=True)
    with pytest.raises(ValueError, match="start= and timestamps= need mode='reliable'"):
        subscribe_options("latest", None, "earliest", timestamps=True)


def test_a_broker_without_logs_is_told_before_anything_is_sent() -> None:
    assert without_log_problem({"timestamps": False}) is None
    assert without_log_problem({"timestamps": False, "from": "latest"}) is None
    problem = without_log_problem({"timestamps": True})
    assert problem is not None and "no record times" in problem
    problem = without_log_problem({"timestamps": True, "from": "earliest"})
    assert problem is not None and "from, timestamps" in problem
