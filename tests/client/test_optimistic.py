"""Optimistic publishing: a client that runs ahead of the broker's guarantees
into a saturated channel has its excess dropped and announced, resends exactly
that, in order, and every message arrives once, in order."""

from __future__ import annotations

import pytest
import trio

from broker.client import BlockingClient, ClientError, open_client
from broker.config import BrokerConfig
from broker.protocol import Policy
from tests.server.helpers import (
    TIMEOUT,
    connection_named,
    make_config,
    running_broker,
    url,
    wait_idle,
    wait_subscribed,
)

#: A broker whose publish channels fill quickly.
TIGHT = make_config(
    publish_capacity=128 * 1024, channel_high_watermark=64 * 1024, channel_low_watermark=32 * 1024
)
#: A subscriber that promises little room at a time.
SLOW = Policy(deliver_capacity=8 * 1024)
COUNT = 3000


def payload(i: int, size: int = 506) -> bytes:
    return b"%06d" % i + b"z" * (size - 6)


#: Small frames and budget: a broker that cuts off a client dropping more
#: than 512 KiB + 16 frames of 4 KiB beyond its guarantees.
SMALL_FRAMES = make_config(
    max_frame=4096,
    publish_capacity=128 * 1024,
    connection_budget=512 * 1024,
    channel_high_watermark=64 * 1024,
    channel_low_watermark=32 * 1024,
)


@pytest.mark.parametrize(
    ("config", "optimism", "size"),
    [
        (TIGHT, 256 * 1024, 506),
        # Asked for far more than the broker lets a client drop: the client
        # runs at most 16 frames of the broker's max_frame ahead (it used to
        # run 8 MiB ahead, and the broker then cut it off with Goodbye 3).
        (SMALL_FRAMES, 8 * 1024 * 1024, 4000),
    ],
    ids=["256KiB", "8MiB-capped"],
)
async def test_optimistic_publishing_into_a_saturated_channel_loses_and_repeats_nothing(
    config: BrokerConfig, optimism: int, size: int
) -> None:
    async with running_broker(config) as broker:
        async with (
            open_client(url(broker), name="sub", policy=SLOW) as subscriber,
            open_client(url(broker), name="pub", optimism=optimism) as publisher,
            subscriber.subscribe("t") as subscription,
        ):
            await wait_subscribed(broker, "t")
            received: list[int] = []

            async def consume() -> None:
                for _ in range(COUNT):
                    received.append(int((await subscription.receive()).payload[:6]))
                    if len(received) % 300 == 0:
                        await trio.sleep(0.02)  # fall behind now and then

            with trio.fail_after(TIMEOUT * 3):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(consume)
                    for i in range(COUNT):
                        await publisher.publish("t", payload(i, size))
                    await publisher.flush()
            assert received == list(range(COUNT))
            # It did run ahead: the broker dropped, the client resent.
            connection = connection_named(broker, "pub")
            dropped = sum(r.dropped_frames for r in connection.protocol.statistics().receivers)
            assert dropped > 0
            assert publisher.drops_announced > 0
            assert publisher.statistics()["frames_resent"] == publisher.frames_resent > 0
        await wait_idle(broker)


async def test_the_blocking_client_can_publish_optimistically_too() -> None:
    async with running_broker(TIGHT) as broker:
        async with (
            open_client(url(broker), name="sub", policy=SLOW) as subscriber,
            subscriber.subscribe("b") as subscription,
        ):
            await wait_subscribed(broker, "b")

            def publish() -> int:
                with BlockingClient(url(broker), optimism=256 * 1024) as client:
                    for i in range(COUNT):
                        client.publish("b", payload(i), timeout=TIMEOUT)
                    client.flush(timeout=TIMEOUT * 3)
                    return client.frames_resent

            async with trio.open_nursery() as nursery:
                resent: list[int] = []

                async def run() -> None:
                    resent.append(await trio.to_thread.run_sync(publish))

                nursery.start_soon(run)
                received = []
                with trio.fail_after(TIMEOUT * 3):
                    for _ in range(COUNT):
                        received.append(int((await subscription.receive()).payload[:6]))
                        if len(received) % 300 == 0:
                            await trio.sleep(0.02)
            assert received == list(range(COUNT))
            assert resent[0] > 0
        await wait_idle(broker)


def test_optimism_must_not_be_negative() -> None:
    with pytest.raises(ClientError, match="optimism"):
        BlockingClient("127.0.0.1:1", optimism=-1)
