"""A message larger than a frame through a worker that does not own its
topic: the forwarder's link passes it on to the owner in parts, and the
owner's deliveries to the forwarder's subscriber come in parts too. On
the base code the publish itself was refused (exceeds max_frame)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from broker.client import Subscription, open_client
from broker.config import MiB

from .helpers import TIMEOUT, wait_until
from .workers import owned_by, running_workers, url

IDS = ["w0", "w1"]
BIG = bytes(range(256)) * (MiB // 256)


@pytest.mark.parametrize("data", [False, True], ids=["memory-only", "topic-log"])
async def test_a_1_mib_message_through_a_non_owner(tmp_path: Path, data: bool) -> None:
    (topic,) = owned_by("w1", IDS, "large-")
    async with (
        running_workers(tmp_path, data=data) as (w0, w1),
        open_client(url(w1), name="at-owner") as at_owner,
        open_client(url(w0), name="via-w0") as via_w0,
        open_client(url(w0), name="publisher") as publisher,
        at_owner.subscribe(topic) as direct,
        via_w0.subscribe(topic) as forwarded,
    ):
        await wait_until(lambda: w1.statistics().subscriptions == 2, what="subscriptions")
        received: dict[str, list[bytes]] = {}

        async def take(name: str, subscription: Subscription) -> None:
            received[name] = [(await subscription.receive()).payload for _ in range(3)]

        with trio.fail_after(TIMEOUT):
            # (Both subscribers read at once: a large message holds the
            # publishing channel's account until each has taken it.)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(take, "direct", direct)
                nursery.start_soon(take, "forwarded", forwarded)
                await publisher.publish(topic, b"small")
                await publisher.publish(topic, BIG, key=b"k")
                await publisher.publish(topic, b"after")
                await publisher.flush()
        assert received == {n: [b"small", BIG, b"after"] for n in ("direct", "forwarded")}
        (link,) = w0.link_statistics()
        assert link.publishes_forwarded == 3
