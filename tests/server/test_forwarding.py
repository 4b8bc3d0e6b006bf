"""Forwarding between the workers of a multi-worker broker: a client that
did not ask for metadata publishes and subscribes to any topic through any
worker; the worker that does not own the topic forwards to the owner."""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path

import trio

from broker.client import ConnectionLost, open_client
from broker.config import BrokerConfig
from broker.metrics import stat_document
from broker.protocol import BindTopic, GoodbyeCode, Subscribe
from broker.protocol.frames._encode import encode_publish
from broker.server import Broker

from .helpers import TIMEOUT, RawClient, wait_until
from .workers import owned_by, running_workers, url

IDS = ["w0", "w1"]


async def test_publish_through_a_non_owner_reaches_subscribers_of_both(tmp_path: Path) -> None:
    (topic,) = owned_by("w1", IDS, "news-")
    count = 500
    async with (
        running_workers(tmp_path) as (w0, w1),
        open_client(url(w1), name="at-owner") as at_owner,
        open_client(url(w0), name="via-w0") as via_w0,
        open_client(url(w0), name="publisher") as publisher,
        at_owner.subscribe(topic) as direct,
        via_w0.subscribe(topic) as forwarded,
    ):
        # (The forwarded one is made at the owner a round trip later.)
        await wait_until(lambda: w1.statistics().subscriptions == 2, what="subscriptions")
        with trio.fail_after(TIMEOUT):
            for n in range(count):
                await publisher.publish(topic, b"%d" % n)
            await publisher.flush()
            for subscription in (direct, forwarded):
                got = [int((await subscription.receive()).payload) for _ in range(count)]
                assert got == list(range(count))
        links = w0.link_statistics()
        assert links is not None and w1.link_statistics() == ()  # (w1 forwarded nothing)
        document = stat_document(w0)
        assert document["broker"]["links"][0]["owner"] == "w1"
        assert document["broker"]["links"][0]["publishes_forwarded"] == count
        assert [link.owner for link in links] == ["w1"]
        assert links[0].open and links[0].publishes_in_flight == 0
        assert links[0].publishes_forwarded == count
        assert links[0].subscriptions_forwarded == 1
        assert topic in w1.topics and not w1.topics[topic].forwarded
        assert w0.topics[topic].forwarded


async def test_a_publish_is_confirmed_only_once_the_owner_confirmed_it(tmp_path: Path) -> None:
    """While the link to the owner cannot be opened, publishes through the
    forwarder stay unconfirmed (flush waits) and charged to their publisher;
    once the link opens, the owner routes them, then the client's Confirm
    comes: when flush returns, the owner has every message."""
    (topic,) = owned_by("w1", IDS, "held-")
    count = 50
    async with running_workers(tmp_path, data=True) as (w0, w1):
        assert w0.worker is not None
        right = w0.worker.link_paths["w1"]
        w0.worker.link_paths["w1"] = str(tmp_path / "nowhere")  # type: ignore[index]
        async with open_client(url(w0), name="publisher") as publisher:
            for n in range(count):
                await publisher.publish(topic, b"%d" % n)
            with trio.move_on_after(0.5) as waited:
                await publisher.flush()
            assert waited.cancelled_caught  # no Confirm without the owner's
            (link,) = w0.link_statistics()
            assert not link.open and link.publishes_in_flight == count
            assert link.bytes_in_flight > 0
            assert w0.connections and any(c.account.debt > 0 for c in w0.connections.values())
            w0.links.links["w1"].runner.path = right  # type: ignore[union-attr]
            with trio.fail_after(TIMEOUT):
                await publisher.flush()
            assert w1.topics[topic].messages_in == count  # routed (written) at the owner first
            (link,) = w0.link_statistics()
            assert link.open and link.publishes_in_flight == 0 and link.bytes_in_flight == 0
        async with (
            open_client(url(w1), name="reader") as reader,
            reader.subscribe(topic, start="earliest") as subscription,
        ):
            with trio.fail_after(TIMEOUT):
                got = [int((await subscription.receive()).payload) for _ in range(count)]
        assert got == list(range(count))


async def test_more_forwarded_topics_than_a_link_can_fund_at_once(tmp_path: Path) -> None:
    """A link is one connection to the owner, funded from one connection
    budget (here three topics' worth): twelve clients publishing at once to
    twelve topics through the forwarder all get everything confirmed (the
    link frees idle topics' handles when the owner withholds a channel), and
    the owner's logs hold every message, in order."""
    frame = 64 * 1024 + 64
    budget = 2 * 16 * 1024 + 3 * frame
    topics = owned_by("w1", IDS, "many-", 12)
    per_topic = 200
    async with running_workers(tmp_path, data=True, connection_budget=budget) as (w0, w1):
        flushed: list[str] = []

        async def publish(topic: str) -> None:
            async with open_client(url(w0), name=f"pub-{topic}") as publisher:
                for n in range(per_topic):
                    await publisher.publish(topic, b"%d" % n)
                await publisher.flush()
                flushed.append(topic)
                # Every publisher (so every forwarding topic) stays until all flushed.
                await wait_until(lambda: len(flushed) == len(topics), what="every flush")

        with trio.fail_after(4 * TIMEOUT):
            async with trio.open_nursery() as nursery:
                for topic in topics:
                    nursery.start_soon(publish, topic)
        (link,) = w0.link_statistics()
        assert link.publishes_forwarded >= len(topics) * per_topic
        assert link.publishes_in_flight == 0
        for topic in topics:
            async with (
                open_client(url(w1), name="reader") as reader,
                reader.subscribe(topic, start="earliest") as subscription,
            ):
                with trio.fail_after(TIMEOUT):
                    got = [int((await subscription.receive()).payload) for _ in range(per_topic)]
                assert got == list(range(per_topic)), topic


async def test_three_workers_forward_keys_headers_and_the_largest_payloads(
    tmp_path: Path,
) -> None:
    """Three workers: w0 publishes to topics w1 and w2 own, w2 subscribes to
    w1's topic through itself; keys, headers and a payload filling a frame
    arrive as published, offsets are the owners' log offsets."""
    ids = ["w0", "w1", "w2"]
    (on_w1,) = owned_by("w1", ids, "three-")
    (on_w2,) = owned_by("w2", ids, "three-")
    big = bytes(range(256)) * 240  # 61,440 bytes: within a 64 KiB frame with its head
    sent = [
        (b"small", None, None),
        (b"keyed", b"k\x00ey", [("h", b"v"), ("empty", b"")]),
        (big, b"big", [("size", b"%d" % len(big))]),
    ]
    async with (
        running_workers(tmp_path, 3, data=True) as (w0, w1, w2),
        open_client(url(w2), name="via-w2") as via_w2,
        open_client(url(w0), name="via-w0") as via_w0,
        via_w2.subscribe(on_w1) as from_w1,
        via_w0.subscribe(on_w2) as from_w2,
    ):
        await wait_until(lambda: w1.statistics().subscriptions == 1, what="at w1")
        # (w2 counts its own client's forwarded subscription too.)
        await wait_until(lambda: w2.statistics().subscriptions == 2, what="at w2")
        async with open_client(url(w0), name="publisher") as publisher:
            for topic in (on_w1, on_w2):
                for payload, key, headers in sent:
                    await publisher.publish(topic, payload, key=key, headers=headers)
            await publisher.flush()
        for subscription in (from_w1, from_w2):
            with trio.fail_after(TIMEOUT):
                got = [await subscription.receive() for _ in sent]
            assert [(m.payload, m.key, m.headers or None) for m in got] == [
                (p, k, h) for p, k, h in sent
            ]
            assert [m.offset for m in got] == [1, 2, 3]
        assert sorted(link.owner for link in w0.link_statistics() or ()) == ["w1", "w2"]
        assert [link.owner for link in w2.link_statistics() or ()] == ["w1"]


async def test_a_publish_filling_a_frame_is_forwarded_whatever_its_link_handle(
    tmp_path: Path,
) -> None:
    """A client's Publish of exactly ``max_frame`` bytes on topic handle 0
    becomes, on a link whose handle for the topic takes more bytes (24 and
    on), a frame a little over ``max_frame``: the owner takes it from a
    link (as a client takes a Deliver a little over), so it is forwarded.
    (And the link's 25 other topics, held by forwarded subscriptions, use
    up the owner's connection budget: the link frees their handles, which
    the subscriptions no longer need, so this topic is funded.)"""
    topics = owned_by("w1", IDS, "full-", 26)
    frame = BrokerConfig().max_frame
    # Publish head (3 bytes), handle 0 (1), a long byte string's head (3), no key or headers (2).
    payload = b"x" * (frame - 9)
    assert len(encode_publish(0, payload, None, max_frame=frame)) - 4 == frame
    async with (
        running_workers(tmp_path) as (w0, w1),
        open_client(url(w0), name="holder") as holder,
        AsyncExitStack() as held,
        open_client(url(w1), name="at-owner") as at_owner,
        at_owner.subscribe(topics[-1]) as direct,
    ):
        for topic in topics[:-1]:  # (each holds a link handle: the last topic's is 25)
            await held.enter_async_context(holder.subscribe(topic))
        await wait_until(lambda: w1.statistics().subscriptions == 26, what="subscriptions")
        async with open_client(url(w0), name="publisher") as publisher:
            await publisher.publish(topics[-1], payload)
            with trio.fail_after(TIMEOUT):
                await publisher.flush()
        with trio.fail_after(TIMEOUT):
            assert (await direct.receive()).payload == payload


CURSOR_AUTH = """
[principals.alice]
token = "alice-token"
publish = ["jobs.*"]
subscribe = ["jobs.*"]

[principals.bob]
token = "bob-token"
subscribe = ["jobs.*"]
"""


async def test_a_durable_cursor_is_the_principals_whichever_worker_it_reached(
    tmp_path: Path,
) -> None:
    """A cursor taken through a forwarder is the owner's cursor of the
    client's principal (not of the link): the same principal continues it
    at the owner directly, and another principal's cursor of the same name
    is its own."""
    (topic,) = owned_by("w1", IDS, "jobs.")
    auth = tmp_path / "auth.toml"
    auth.write_text(CURSOR_AUTH)
    async with running_workers(tmp_path, data=True, auth_file=str(auth)) as (w0, w1):
        async with open_client(url(w1), name="pub", token="alice-token") as publisher:
            for n in range(1, 31):
                await publisher.publish(topic, b"%d" % n)
            await publisher.flush()

        async def take(address: str, token: str, count: int) -> list[int | None]:
            async with (
                open_client(address, name="reader", token=token) as reader,
                reader.subscribe(topic, start="earliest", cursor="group") as subscription,
            ):
                with trio.fail_after(TIMEOUT):
                    got = [(await subscription.receive()).offset for _ in range(count)]
            # (Leaving acknowledged them; the owner has stored it once the
            # forwarded subscription is gone there.)
            await wait_until(lambda: w1.statistics().subscriptions == 0, what="cursor stored")
            return got

        assert await take(url(w0), "alice-token", 10) == list(range(1, 11))  # via w0
        assert await take(url(w1), "alice-token", 10) == list(range(11, 21))  # at the owner
        assert await take(url(w0), "alice-token", 5) == list(range(21, 26))  # via w0 again
        assert await take(url(w0), "bob-token", 3) == [1, 2, 3]  # bob's own cursor
        assert await take(url(w1), "bob-token", 3) == [4, 5, 6]


async def test_only_a_link_may_name_the_cursors_principal(tmp_path: Path) -> None:
    (topic,) = owned_by("w1", IDS, "named-")
    async with running_workers(tmp_path, data=True) as (_w0, w1):
        raw = await RawClient.connect(w1)
        await raw.handshake()
        await raw.send(
            BindTopic(topic), Subscribe(0, "reliable", {"cursor": "c", "cursor_principal": "a"})
        )
        await raw.read_until_eof()
        await raw.aclose()
        (goodbye,) = raw.goodbyes()
        assert goodbye.code == GoodbyeCode.PROTOCOL_ERROR
        assert "unknown subscribe option(s) ['cursor_principal']" in goodbye.reason


async def test_forwarded_subscriptions_past_the_owners_limit_wait_for_room(
    tmp_path: Path,
) -> None:
    """The owner funds a link's Subscribes up to its max_subscriptions: one
    beyond that used to be sent anyway and fail (NoGuarantees) inside the
    client connection that caused it (an internal error ending it). Now it
    waits until one ends; every client's connection goes on."""
    topics = owned_by("w1", IDS, "limit-", 6)
    got: dict[str, bytes] = {}

    async def subscriber(topic: str) -> None:
        async with (
            open_client(url(w0), name=f"s-{topic}") as client,
            client.subscribe(topic) as subscription,
        ):
            got[topic] = (await subscription.receive()).payload
        # (leaving ends its subscription: room for a waiting one)

    async with (
        running_workers(tmp_path, data=True, max_subscriptions=3) as (w0, w1),
        open_client(url(w1), name="pub") as publisher,
        trio.open_nursery() as nursery,
    ):
        with trio.fail_after(2 * TIMEOUT):
            for n, topic in enumerate(topics, 1):
                nursery.start_soon(subscriber, topic)
                await wait_until(
                    lambda n=n: sum(s.subscriptions_forwarded for s in w0.link_statistics()) == n,
                    what="the subscription at the forwarder",
                )
            while len(got) < len(topics):
                # (those made at the owner only now start from "latest":
                # publish until each has had one)
                for topic in topics:
                    if topic not in got:
                        await publisher.publish(topic, b"hello")
                await publisher.flush()
                await trio.sleep(0.05)
    assert set(got) == set(topics) and set(got.values()) == {b"hello"}
    assert w0.internal_errors == 0


async def test_a_graceful_shutdown_sends_what_a_forwarder_relayed_to_its_subscriber(
    tmp_path: Path,
) -> None:
    """Memory-only: the publisher saw every message confirmed, so each
    reaches a subscriber that keeps reading, also through a forwarder (the
    forwarder's shutdown did not wait for what it had relayed and queued for
    its client: a forwarded subscription pays for its own deliveries)."""
    (topic,) = owned_by("w1", IDS, "drain-", 1)
    received: list[int] = []
    ends: list[int | None] = []
    count = 2000

    async def read_slowly(w0: Broker, *, task_status: trio.TaskStatus[None]) -> None:
        async with (
            open_client(url(w0), name="sub") as client,
            client.subscribe(topic) as subscription,
        ):
            task_status.started()
            try:
                async for message in subscription:
                    received.append(int(message.payload))
                    if len(received) % 100 == 0:
                        await trio.sleep(0.05)
            except ConnectionLost as error:
                ends.append(error.code)

    async with trio.open_nursery() as nursery, running_workers(tmp_path) as (w0, w1):
        await nursery.start(read_slowly, w0)
        await wait_until(
            lambda: sum(s.subscriptions_forwarded for s in w0.link_statistics()) == 1,
            what="the forwarded subscription",
        )
        async with open_client(url(w1), name="pub") as publisher:
            for n in range(count):
                await publisher.publish(topic, b"%d" % n)
            await publisher.flush()
        assert len(received) < count  # (it is behind: the shutdown has to wait for it)
        # (both workers shut down gracefully, together)
    assert received == list(range(count))
    assert ends == [GoodbyeCode.SHUTTING_DOWN]
