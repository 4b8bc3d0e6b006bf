"""Messages larger than a frame with the broker's defaults (64 KiB frames):
sent in FramePart frames on their own channel and reassembled, up to the
broker's ``max_message`` (16 MiB by default), without raising ``max_frame``
and so without shrinking what a connection funds. On the base code a 1 MiB
publish raised "exceeds max_frame"."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

from broker.client import BlockingClient, open_client
from broker.config import KiB, MiB
from broker.protocol import (
    PROTOCOL_VERSION,
    TOPIC_BINDS,
    BindTopic,
    Channel,
    ChannelKind,
    Deliver,
    FramePart,
    Gap,
    Goodbye,
    Hello,
    IssueGuarantee,
    LocalProtocolError,
    Publish,
    Stage,
    Subscribe,
    Welcome,
)
from broker.server import Broker

from .helpers import (
    TIMEOUT,
    RawClient,
    assert_round_trip,
    make_config,
    running_broker,
    url,
    wait_subscribed,
    wait_until,
)


def payload(size: int, seed: int = 0) -> bytes:
    """``size`` bytes that differ along the message (a misplaced part shows)."""
    pattern = bytes((seed + i * 7) % 251 for i in range(4096))
    return (pattern * (size // len(pattern) + 1))[:size]


ONE_MIB = payload(MiB)


@pytest.mark.parametrize("logs", [False, True], ids=["memory-only", "topic-log"])
async def test_a_1_mib_message_goes_through_with_the_defaults(tmp_path: Path, logs: bool) -> None:
    where = {"data_dir": str(tmp_path)} if logs else {"memory_only": True}
    config = make_config(**where)
    assert config.max_frame == 64 * KiB  # the defaults
    async with (
        running_broker(config) as broker,
        open_client(url(broker), name="sub") as subscriber,
        subscriber.subscribe("big") as subscription,
        open_client(url(broker), name="pub") as publisher,
    ):
        with trio.fail_after(TIMEOUT):
            await publisher.publish("big", b"before")
            await publisher.publish("big", ONE_MIB, key=b"k", headers=[("h", b"v")])
            await publisher.publish("big", b"after")
            await publisher.flush()
            assert (await subscription.receive()).payload == b"before"
            message = await subscription.receive()
            assert message.payload == ONE_MIB
            assert message.key == b"k"
            assert message.headers == [("h", b"v")]
            assert (await subscription.receive()).payload == b"after"


async def test_the_blocking_client_sends_and_takes_a_1_mib_message() -> None:
    async with running_broker(make_config(memory_only=True)) as broker:
        address = url(broker)

        def round_trip() -> list[bytes]:
            with BlockingClient(address, name="blocking") as client:
                subscription = client.subscribe("big")
                client.publish("big", ONE_MIB)
                client.publish("big", b"small")
                # Taken before the flush: the 1 MiB delivery queued for this
                # same client is charged to its own publish channel (past the
                # channel's watermark) until it is taken, so a flush first
                # could wait for guarantees only its own reading gives back.
                got = [subscription.receive(timeout=TIMEOUT).payload for _ in range(2)]
                client.flush(timeout=TIMEOUT)
                return got

        assert await trio.to_thread.run_sync(round_trip) == [ONE_MIB, b"small"]


LIMIT = 4 * MiB


async def test_a_message_near_the_configured_limit_goes_and_one_over_it_is_refused() -> None:
    """The limit counts the Publish body: a payload a few bytes under it goes
    (in 65+ parts); one byte more than the broker takes is refused by the
    client before anything is sent, in one line, and the client goes on."""
    near = payload(LIMIT - 16, seed=3)
    async with (
        running_broker(make_config(memory_only=True, max_message=LIMIT)) as broker,
        open_client(url(broker), name="sub") as subscriber,
        subscriber.subscribe("big") as subscription,
        open_client(url(broker), name="pub") as publisher,
    ):
        with trio.fail_after(TIMEOUT):
            await publisher.publish("big", near)
            with pytest.raises(LocalProtocolError) as refused:
                await publisher.publish("big", payload(LIMIT))
            assert "\n" not in str(refused.value)
            assert f"max_message ({LIMIT} bytes)" in str(refused.value)
            await publisher.publish("big", b"still here")
            await publisher.flush()
            assert (await subscription.receive()).payload == near
            assert (await subscription.receive()).payload == b"still here"


async def test_a_large_record_is_replayed_from_the_log_after_a_restart(tmp_path: Path) -> None:
    config = make_config(data_dir=str(tmp_path))
    big = payload(3 * MiB, seed=5)
    async with (
        running_broker(config) as broker,
        open_client(url(broker), name="pub") as publisher,
    ):
        with trio.fail_after(TIMEOUT):
            await publisher.publish("logged", b"first")
            await publisher.publish("logged", big)
            await publisher.publish("logged", b"last")
            await publisher.flush()
    async with (
        running_broker(config) as broker,
        open_client(url(broker), name="reader") as reader,
        reader.subscribe("logged", start="earliest") as subscription,
    ):
        with trio.fail_after(TIMEOUT):
            got = [await subscription.receive() for _ in range(3)]
        assert [m.payload for m in got] == [b"first", big, b"last"]
        assert [m.seq for m in got] == [1, 2, 3]  # one record, one offset


@pytest.mark.parametrize("mode", ["lossy", "latest"])
@pytest.mark.parametrize("bound", [None, 4 * MiB], ids=["default-bound", "4-MiB-bound"])
async def test_lossy_and_latest_subscriptions_take_large_messages_within_their_bound(
    mode: str, bound: int | None
) -> None:
    """A dropping subscription's ``max_queued_bytes`` (1 MiB by default)
    holds for a large message too: one over it is dropped and reported as a
    Gap (its parts sent so far are abandoned); a bound that holds it lets
    it through."""
    options = {} if bound is None else {"max_queued_bytes": bound}
    async with (
        running_broker(make_config(memory_only=True)) as broker,
        open_client(url(broker), name="sub") as subscriber,
        subscriber.subscribe("big", mode=mode, options=options) as subscription,
        open_client(url(broker), name="pub") as publisher,
    ):
        with trio.fail_after(TIMEOUT):
            await publisher.publish("big", ONE_MIB, key=b"k")
            await publisher.publish("big", b"small", key=b"other")
            await publisher.flush()
            got = [(await subscription.receive()).payload]
            if bound is not None:
                got.append((await subscription.receive()).payload)
        if bound is None:
            assert got == [b"small"] and subscription.missed == 1
        else:
            assert got == [ONE_MIB, b"small"] and subscription.missed == 0


async def test_a_staged_large_message_is_committed_whole() -> None:
    async with (
        running_broker(make_config(memory_only=True)) as broker,
        open_client(url(broker), name="sub") as subscriber,
        subscriber.subscribe("big") as subscription,
        open_client(url(broker), name="pub") as publisher,
    ):
        stage = Stage("batch-1", "member-0")
        await publisher.publish("big", ONE_MIB, stage=stage)
        await publisher.publish("big", b"small", stage=stage)
        count = await publisher.finish_stage(stage)
        assert count == 2
        outcome = await publisher.commit("batch-1", [("member-0", count)])
        assert outcome.messages == 2
        with trio.fail_after(TIMEOUT):
            assert (await subscription.receive()).payload == ONE_MIB
            assert (await subscription.receive()).payload == b"small"


async def test_a_client_that_takes_no_parts_is_told_of_a_large_message_by_a_gap() -> None:
    """An older client (its Hello gives no max_message) is never sent a part:
    a message larger than its frames is reported as a Gap, and the ones
    after it come as before."""
    async with (
        running_broker(make_config(memory_only=True)) as broker,
        open_client(url(broker), name="pub") as publisher,
    ):
        raw = await RawClient.connect(broker)
        welcome = await raw.handshake("old")
        assert welcome.max_message == 0  # not offered to a Hello without it
        await raw.send(
            BindTopic("big"),
            Subscribe(0, "reliable", {}),
            IssueGuarantee(Channel(ChannelKind.DELIVER, 0), 256 * KiB),
        )
        await wait_subscribed(broker, "big")
        await publisher.publish("big", ONE_MIB)
        await publisher.publish("big", b"small")
        await publisher.flush()
        deliver = await raw.wait_for_message(Deliver)
        assert deliver.payload == b"small"
        gaps = [m for m in raw.frames if isinstance(m, Gap)]
        assert [(g.first_seq, g.count) for g in gaps] == [(1, 1)]
        assert not any(isinstance(m, FramePart) for m in raw.frames)
        await raw.aclose()


PUBLISH_0 = Channel(ChannelKind.PUBLISH, 0)


async def _large_client(broker: Broker) -> RawClient:
    """A raw client whose Hello takes parts, with topic handle 0 bound."""
    raw = await RawClient.connect(broker)
    await raw.send(Hello(PROTOCOL_VERSION, "raw", None, {}, max_message=MiB))
    welcome = await raw.wait_for_message(Welcome)
    assert welcome.max_message == broker.config.max_message
    await raw.wait_for_guarantee(TOPIC_BINDS)
    await raw.send(BindTopic("t"))
    await raw.wait_for_guarantee(PUBLISH_0)
    return raw


@pytest.mark.parametrize(
    ("parts", "code"),
    [
        # A part that continues nothing (no 'begin' first).
        ([FramePart(PUBLISH_0, 0, b"x"), FramePart(PUBLISH_0, 0x40, b"y")], 1),
        # Unknown flags.
        ([FramePart(PUBLISH_0, 0x81, b"x")], 1),
        # Parts whose bytes make no Publish on their channel.
        ([FramePart(PUBLISH_0, 0x80, b"\x82\x02"), FramePart(PUBLISH_0, 0x40, b"\x00")], 1),
        # On a channel the client does not send parts on.
        ([FramePart(Channel(ChannelKind.DELIVER, 0), 0xC0, b"x")], 1),
        # More than max_message bytes, in parts that each fit a frame.
        (
            [FramePart(PUBLISH_0, 0x80, bytes(60_000))]
            + [FramePart(PUBLISH_0, 0, bytes(60_000))] * 3,
            2,
        ),
    ],
    ids=["no-begin", "flags", "not-a-publish", "wrong-channel", "over-max-message"],
)
async def test_bad_parts_end_the_connection_with_a_goodbye(
    parts: list[FramePart], code: int
) -> None:
    async with running_broker(make_config(memory_only=True, max_message=128 * KiB)) as broker:
        raw = await _large_client(broker)
        await raw.send(*parts)
        frames = await raw.read_until_eof()
        goodbyes = [m for m in frames if isinstance(m, Goodbye)]
        assert [g.code for g in goodbyes] == [code], goodbyes
        assert "\n" not in goodbyes[0].reason
        assert raw.decode_error is None and not raw.reset  # a clean close
        await raw.aclose()
        await assert_round_trip(broker)  # the broker goes on


async def test_parts_from_a_client_that_did_not_ask_are_refused() -> None:
    async with running_broker(make_config(memory_only=True)) as broker:
        raw = await RawClient.connect(broker)
        await raw.handshake("old")
        await raw.send(BindTopic("t"))
        await raw.wait_for_guarantee(PUBLISH_0)
        await raw.send(FramePart(PUBLISH_0, 0xC0, b"x"))
        frames = await raw.read_until_eof()
        assert [m.code for m in frames if isinstance(m, Goodbye)] == [1]
        await raw.aclose()


async def test_only_so_many_connections_hold_messages_in_parts_at_once() -> None:
    """An incomplete message is not charged to its connection (charged, its
    last part could never be read), so the broker bounds how many
    connections hold one at once (``_reassembly``): with one slot, a second
    client that starts a message in parts is not read on until the first
    client's message is whole; then it goes on and both messages arrive.
    (Before: every connection could hold ``max_message`` bytes at once.)"""
    from broker.protocol.frames import encode_body
    from broker.server.connection._reassembly import ReassemblyRoom

    async with (
        running_broker(make_config(memory_only=True)) as broker,
        open_client(url(broker), name="sub") as subscriber,
        subscriber.subscribe("t") as subscription,
    ):
        broker.reassembly = ReassemblyRoom(1)
        first = await _large_client(broker)
        (holder,) = [c for c in broker.connections.values() if c.client_name == "raw"]
        second = await _large_client(broker)
        (other,) = [
            c for c in broker.connections.values() if c.client_name == "raw" and c is not holder
        ]
        one, two = (encode_body(Publish(0, payload(50_000, seed))) for seed in (1, 2))
        await first.send(FramePart(PUBLISH_0, 0x80, one[:20_000]))
        await wait_until(lambda: broker.reassembly.holders == {holder}, what="the first's slot")
        await second.send(FramePart(PUBLISH_0, 0x80, two[:20_000]))
        await wait_until(lambda: other.protocol.reassembling == 20_000, what="the second's part")
        # The second waits for the slot: what it sends now is not read.
        await second.send(FramePart(PUBLISH_0, 0, two[20_000:40_000]))
        await trio.testing.wait_all_tasks_blocked()
        assert other.protocol.reassembling == 20_000
        assert broker.reassembly.holders == {holder}
        # The first's message ends: the slot goes to the second, which reads on.
        await first.send(FramePart(PUBLISH_0, 0x40, one[20_000:]))
        await second.send(FramePart(PUBLISH_0, 0x40, two[40_000:]))
        with trio.fail_after(TIMEOUT):
            got = sorted([(await subscription.receive()).payload for _ in range(2)])
        assert got == sorted([payload(50_000, 1), payload(50_000, 2)])
        assert broker.reassembly.holders == set()
        await first.aclose()
        await second.aclose()


def test_a_connection_funds_as_many_topics_as_before() -> None:
    """Large messages cost small ones nothing: max_frame, and so the room a
    publish channel is funded with at least, stay as they were, and a
    connection funds (4 MiB - 2 x 16 KiB) // (64 KiB + 64) = 63 topics."""
    config = make_config()
    assert config.max_frame == 64 * KiB
    assert config.min_publish_capacity == 64 * KiB + 64
    funded = (config.connection_budget - 2 * config.bind_capacity) // config.min_publish_capacity
    assert funded == 63
    assert config.max_message == 8 * MiB
