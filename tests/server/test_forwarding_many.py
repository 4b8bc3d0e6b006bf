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
from broker.server.connection._publishing import PublishChannel

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


async def test_a_publish_many_takes_the_owners_account_past_its_watermark_by_one_publish(
    tmp_path: Path,
) -> None:
    """A subscriber at the owner that reads nothing: the link's channel
    account there stops at its watermark plus about one publish and its
    delivery, as publishes one at a time would; a PublishMany frame (here
    up to four times the watermark) is cut where it passes the watermark."""
    (topic,) = owned_by("w1", IDS, "many-")
    watermark = 64 * 1024
    payload = b"." * 100
    async with (
        running_workers(
            tmp_path, channel_high_watermark=watermark, channel_low_watermark=watermark // 2
        ) as (w0, w1),
        open_client(url(w1), name="stuck") as stuck,
        stuck.subscribe(topic),
        open_client(url(w0), name="publisher") as publisher,
        trio.open_nursery() as nursery,
    ):

        async def publish() -> None:
            while True:
                await publisher.publish(topic, payload)

        nursery.start_soon(publish)

        def link_channel() -> PublishChannel | None:
            for connection in w1.connections.values():
                if connection.protocol.publish_many:
                    for state in connection.publishing.channels.values():
                        return state
            return None

        def throttled() -> bool:
            state = link_channel()
            return state is not None and state.account.blocked

        await wait_until(throttled, what="the link's channel at the owner throttled")
        await trio.sleep(0.2)  # (what the link sends meanwhile is buffered, not charged)
        state = link_channel()
        assert state is not None
        one_publish = 2 * (len(payload) + 200)  # its loan and its delivery's, generously
        assert watermark < state.account.peak_debt <= watermark + one_publish
        nursery.cancel_scope.cancel()
        await publisher.aclose(flush=False)  # (its last publishes are never confirmed)
