"""Where a forwarded reliable subscription that asked for the latest record
starts at the owner: from the first record received since it was made at
the forwarder ("from_time"), however many times it is made there (a broken
link, a restarted worker with its session record) while nothing was relayed
yet. Made "from latest" again, it skipped what was published meanwhile,
confirmed to its publishers: lost for it."""

from __future__ import annotations

import time
from typing import Any

import pytest

from accounts import Account
from broker.server.cluster._forward import ForwardedSubscription
from broker.server.topics._topic import Topic


class FakeLink:
    def __init__(self, offsets: bool) -> None:
        self.offsets = offsets
        self.made: list[ForwardedSubscription] = []

    def subscribe(self, subscription: ForwardedSubscription) -> None:
        self.made.append(subscription)

    def unsubscribe(self, subscription: ForwardedSubscription) -> None: ...

    def ack(self, subscription: ForwardedSubscription, seq: int) -> None: ...

    def resume_deliveries(self, subscription: ForwardedSubscription) -> None: ...


def forwarded(options: dict[str, Any], *, offsets: bool = True, mode: str = "reliable") -> Any:
    link = FakeLink(offsets)
    subscription = ForwardedSubscription(
        None,  # type: ignore[arg-type]
        1,
        Topic("t", {}),
        mode,
        options,
        link,
        Account("a", high_watermark=1 << 20, low_watermark=1 << 19),
    )
    assert link.made == [subscription]
    return subscription


@pytest.mark.parametrize("options", [{}, {"from": "latest"}])
def test_the_latest_is_pinned_to_when_it_was_made(options: dict[str, Any]) -> None:
    before = time.time_ns() // 1_000_000
    subscription = forwarded(options)
    after = time.time_ns() // 1_000_000
    made = subscription.resubscribe_options(offsets=True)
    assert set(made) == {"from_time"} and before <= made["from_time"] <= after
    # Again (a broken link) with nothing relayed: the same start.
    assert subscription.resubscribe_options(offsets=True) == made
    # Its session's record restores it with that start too.
    assert subscription.recorded_options(options) == made
    # Once something was relayed, it goes on after it.
    subscription.owner_received = 41
    assert subscription.resubscribe_options(offsets=True) == {"from": 42}


@pytest.mark.parametrize(
    ("options", "offsets", "mode"),
    [
        ({"from": "earliest"}, True, "reliable"),
        ({"from": 7}, True, "reliable"),
        ({"from_time": 5}, True, "reliable"),
        ({"cursor": "c"}, True, "reliable"),
        ({}, False, "reliable"),  # memory-only: no log to start from
        ({}, True, "lossy"),
    ],
)
def test_other_starts_are_kept_as_asked(options: dict[str, Any], offsets: bool, mode: str) -> None:
    subscription = forwarded(options, offsets=offsets, mode=mode)
    assert subscription.resubscribe_options(offsets=offsets) == options
    assert subscription.recorded_options(options) == options
