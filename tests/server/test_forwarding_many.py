"""A worker's link forwards publishes as PublishMany frames (its Hello asks,
the owner's Welcome allows): a burst of a client's publishes reaches the
owner in far fewer frames than publishes, in order, each confirmed to its
publisher only once the owner confirmed it; nothing is kept for a resume
on the link (it re-sends what is unconfirmed itself)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from broker.client import open_client
from broker.protocol import LocalProtocolError

from .helpers import TIMEOUT, wait_until
from .workers import owned_by, running_workers, url

IDS = ["w0", "w1"]


async def test_a_burst_goes_to_the_owner_in_few_frames(tmp_path: Path) -> None:
    (topic,) = owned_by("w1", IDS, "many-")
    count = 3000
    async with (
        running_workers(tmp_path) as (w0, w1),
        open_client(url(w1), name="at-owner") as at_owner,
        open_client(url(w0), name="publisher") as publisher,
        at_owner.subscribe(topic) as subscription,
    ):
        with trio.fail_after(TIMEOUT):
            for n in range(count):
                await publisher.publish(topic, b"%05d" % n + b"." * 40)
            await publisher.flush()  # (every one confirmed by the owner)
            got = [int((await subscription.receive()).payload[:5]) for _ in range(count)]
        assert got == list(range(count))
        assert w0.links is not None
        link = w0.links.links["w1"]
        assert link.conn is not None
        assert link.conn.publish_many
        (at_w1,) = [c for c in w1.connections.values() if c.protocol.publish_many]
        # A frame per batch of publishes at most, not one per publish.
        assert at_w1.protocol.frames_received < count // 10
        with pytest.raises(LocalProtocolError):
            link.conn.session_state()  # (the link never resumes)
        (statistics,) = w0.link_statistics()
        assert statistics.publishes_forwarded == count
        await wait_until(lambda: w0.link_statistics()[0].publishes_in_flight == 0, what="confirms")
