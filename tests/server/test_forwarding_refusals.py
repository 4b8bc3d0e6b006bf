"""What a worker does not forward is refused in one line that names the
owner (and the link, shared by other clients, is not affected); other
delivery modes are forwarded."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from broker.client import ConnectionLost, open_client
from broker.protocol import BindTopic, GoodbyeCode, ListOffsets, Offsets, Stage, Subscribe

from .helpers import TIMEOUT, RawClient, wait_until
from .workers import owned_by, running_workers, url

IDS = ["w0", "w1"]


async def test_staged_publishing_to_a_topic_owned_elsewhere_is_refused(tmp_path: Path) -> None:
    (theirs,) = owned_by("w1", IDS, "staged-")
    async with running_workers(tmp_path, data=True) as (w0, _w1):
        raw = await RawClient.connect(w0)
        await raw.handshake()
        await raw.send(BindTopic(theirs, Stage("job-1", "0/1")))
        await raw.read_until_eof()
        await raw.aclose()
        (goodbye,) = raw.goodbyes()
        assert goodbye.code == GoodbyeCode.NOT_AUTHORISED
        assert f"topic {theirs!r} is owned by worker w1" in goodbye.reason
        assert "connect with metadata or to its direct address 127.0.0.1:" in goodbye.reason


async def test_list_offsets_answers_for_the_topics_this_worker_owns(tmp_path: Path) -> None:
    (theirs,) = owned_by("w1", IDS, "offsets-")
    (mine,) = owned_by("w0", IDS, "offsets-")
    async with running_workers(tmp_path, data=True) as (w0, _w1):
        async with open_client(url(w0), name="pub") as publisher:
            for topic in (mine, theirs):
                await publisher.publish(topic, b"x")
            await publisher.flush()
        raw = await RawClient.connect(w0)
        await raw.handshake()
        await raw.send(ListOffsets(1, [theirs]), ListOffsets(2, None))
        first = await raw.wait_for(lambda m: isinstance(m, Offsets) and m.request == 1)
        second = await raw.wait_for(lambda m: isinstance(m, Offsets) and m.request == 2)
        await raw.aclose()
        assert isinstance(first, Offsets) and isinstance(second, Offsets)
        assert first.topics == [] and "owned by worker w1" in first.reason
        assert second.topics == [(mine, 1, 2)] and not second.reason


async def test_an_option_not_forwarded_ends_only_its_connection(tmp_path: Path) -> None:
    """ "timestamps" through a forwarder: Goodbye 1 naming it, while another
    client's forwarded subscription to the same owner goes on."""
    topic, other = owned_by("w1", IDS, "opt-", 2)
    async with (
        running_workers(tmp_path, data=True) as (w0, w1),
        open_client(url(w0), name="sub") as subscriber,
        open_client(url(w1), name="pub") as publisher,
        subscriber.subscribe(other) as subscription,
    ):
        await wait_until(lambda: w1.statistics().subscriptions == 1, what="forwarded")
        raw = await RawClient.connect(w0)
        await raw.handshake()
        await raw.send(BindTopic(topic), Subscribe(0, "reliable", {"timestamps": True}))
        await raw.read_until_eof()
        await raw.aclose()
        (goodbye,) = raw.goodbyes()
        assert goodbye.code == GoodbyeCode.PROTOCOL_ERROR
        assert '"timestamps" is not forwarded between workers' in goodbye.reason
        await publisher.publish(other, b"still here")
        with trio.fail_after(TIMEOUT):
            assert (await subscription.receive()).payload == b"still here"


async def test_a_lossy_subscription_is_forwarded(tmp_path: Path) -> None:
    (topic,) = owned_by("w1", IDS, "lossy-")
    count = 300
    async with (
        running_workers(tmp_path) as (w0, w1),
        open_client(url(w0), name="sub") as subscriber,
        open_client(url(w1), name="pub") as publisher,
        subscriber.subscribe(topic, mode="lossy") as subscription,
    ):
        await wait_until(lambda: w1.statistics().subscriptions == 1, what="forwarded")
        got: list[int] = []
        with trio.fail_after(TIMEOUT):
            for n in range(count):
                await publisher.publish(topic, b"%d" % n)
                if n % 50 == 49:  # (the subscriber keeps up: nothing to drop)
                    await publisher.flush()
                    while len(got) < n + 1:
                        got.append(int((await subscription.receive()).payload))
        assert got == list(range(count))
        assert subscription.missed == 0


async def test_subscriptions_ended_at_once_are_ended_at_the_owner(tmp_path: Path) -> None:
    """Subscriptions through the forwarder closed as soon as made leave
    nothing at the owner (nothing there holds deliveries for them)."""
    (topic,) = owned_by("w1", IDS, "brief-")
    async with (
        running_workers(tmp_path) as (w0, w1),
        open_client(url(w0), name="sub") as subscriber,
        open_client(url(w1), name="pub") as publisher,
    ):
        for _ in range(20):
            async with subscriber.subscribe(topic):
                pass
        for _ in range(20):
            await publisher.publish(topic, b"x")
        await publisher.flush()
        await wait_until(lambda: w1.statistics().subscriptions == 0, what="owner's ended")
        (link,) = w0.link_statistics() or ()
        assert link.subscriptions_forwarded == 0


AUTH_FILE = """
[principals.writer]
token = "writer-token"
publish = ["events.*"]
subscribe = []

[principals.reader]
token = "reader-token"
publish = []
subscribe = ["events.*"]
"""


async def test_clients_are_authorised_at_the_edge_and_links_are_trusted(tmp_path: Path) -> None:
    """With an auth file, the forwarder authenticates its clients and applies
    their permissions; the owner takes the link without credentials."""
    (topic,) = owned_by("w1", IDS, "events.")
    auth = tmp_path / "auth.toml"
    auth.write_text(AUTH_FILE)
    async with (
        running_workers(tmp_path, auth_file=str(auth)) as (w0, w1),
        open_client(url(w0), name="reader", token="reader-token") as reader,
        open_client(url(w0), name="writer", token="writer-token") as writer,
        reader.subscribe(topic) as subscription,
    ):
        await wait_until(lambda: w1.statistics().subscriptions == 1, what="forwarded")
        await writer.publish(topic, b"allowed")
        await writer.flush()
        with trio.fail_after(TIMEOUT):
            assert (await subscription.receive()).payload == b"allowed"
        assert sum(w1.security.auth_failures.values()) == 0  # (the link needs none)
        try:
            async with open_client(url(w0), name="nobody", token="wrong") as nobody:
                await nobody.publish(topic, b"refused")
                await nobody.flush()
        except ConnectionLost as lost:
            assert lost.code == GoodbyeCode.NOT_AUTHORISED
        else:
            raise AssertionError("a client without a valid token was served")
        async with open_client(url(w0), name="writer-2", token="writer-token") as sneaky:
            with pytest.raises(ConnectionLost) as denied:
                await sneaky.publish(f"other.{topic}", b"not allowed")
                await sneaky.flush()
        assert denied.value.code == GoodbyeCode.NOT_AUTHORISED
