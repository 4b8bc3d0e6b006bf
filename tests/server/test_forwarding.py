"""Forwarding between the workers of a multi-worker broker: a client that
did not ask for metadata publishes and subscribes to any topic through any
worker; the worker that does not own the topic forwards to the owner."""

from __future__ import annotations

from pathlib import Path

import trio

from broker.client import open_client

from .helpers import TIMEOUT
from .workers import owned_by, running_workers, url

IDS = ["w0", "w1"]


async def test_publish_through_a_non_owner_reaches_subscribers_of_both(tmp_path: Path) -> None:
    (topic,) = owned_by("w1", IDS, "news-")
    count = 500
    async with running_workers(tmp_path) as (w0, w1):
        async with (
            open_client(url(w1), name="at-owner") as at_owner,
            open_client(url(w0), name="via-w0") as via_w0,
            open_client(url(w0), name="publisher") as publisher,
            at_owner.subscribe(topic) as direct,
            via_w0.subscribe(topic) as forwarded,
        ):
            with trio.fail_after(TIMEOUT):
                while w1.statistics().subscriptions < 2:  # the forwarded one, at the owner
                    await trio.sleep(0.01)
                for n in range(count):
                    await publisher.publish(topic, b"%d" % n)
                await publisher.flush()
                for subscription in (direct, forwarded):
                    got = [int((await subscription.receive()).payload) for _ in range(count)]
                    assert got == list(range(count))
            links = w0.statistics().links
            assert [link.owner for link in links] == ["w1"]
            assert links[0].open and links[0].publishes_in_flight == 0
            assert links[0].publishes_forwarded == count
            assert links[0].subscriptions_forwarded == 1
            assert topic in w1.topics and not w1.topics[topic].forwarded
            assert w0.topics[topic].forwarded
