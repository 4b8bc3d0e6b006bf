"""The Throttled advisory: sent only when a publish channel stays withheld
longer than ``throttle_notice_after``, ended when it flows again, and shown by
the client (``throttled_topics``, a log line) and by ``/stat.json``."""

from __future__ import annotations

import logging

import pytest
import trio

from broker.client import open_client
from broker.metrics import stat_document
from broker.protocol import Goodbye
from broker.server import Broker

from .helpers import (
    DEAF_CONFIG,
    TIMEOUT,
    publish_until_throttled,
    raw_client,
    running_broker,
    subscribe_deaf,
    url,
    wait_subscribed,
    wait_until,
)


def advised(broker: Broker, client: str = "pub") -> list[bool]:
    """``throttle_advised`` of each publish channel of ``client``, from /stat.json."""
    return [
        channel["throttle_advised"]
        for connection in stat_document(broker)["connections"]
        if connection["client"] == client
        for channel in connection["channels"]
        if "throttle_advised" in channel
    ]


async def test_a_channel_withheld_past_the_threshold_is_announced_and_then_released(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="broker.client")
    async with (
        running_broker(**DEAF_CONFIG, throttle_notice_after=0.2) as broker,
        raw_client(broker) as deaf,
    ):
        await subscribe_deaf(deaf, grant=0)
        await wait_subscribed(broker, "busy")
        async with open_client(url(broker), name="pub") as publisher:
            started = trio.current_time()
            await publish_until_throttled(publisher, "busy", b"x" * 1000)
            assert trio.current_time() - started >= 0.2
            assert publisher.throttled_topics == {"busy"}
            assert advised(broker) == [True]
            assert "withholds guarantees on topic 'busy'" in caplog.text
            # The deaf subscriber leaves: its deliveries are repaid, the topic flows.
            await deaf.send(Goodbye(0, "bye"))  # its session ends with it
            await deaf.aclose()
            await wait_until(lambda: not publisher.throttled_topics, what="Throttled false")
            assert advised(broker) == [False]
            assert "topic 'busy' flows again" in caplog.text
            await publisher.publish("busy", b"after")
            await publisher.flush()


async def test_a_short_stall_is_not_announced(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="broker.client")
    async with (
        running_broker(**DEAF_CONFIG, throttle_notice_after=TIMEOUT) as broker,
        open_client(url(broker), name="sub") as subscriber,
        open_client(url(broker), name="pub") as publisher,
        subscriber.subscribe("busy") as subscription,
    ):
        await wait_subscribed(broker, "busy")
        (connection,) = [c for c in broker.connections.values() if c.client_name == "pub"]
        payload = b"y" * 1000
        with trio.fail_after(TIMEOUT):
            # Publish until the channel is withheld, without consuming. (The
            # broker may withhold the very guarantees the next publish needs:
            # a publish that would wait lets the broker catch up instead.)
            sent = 0
            while not any(state.waiting for state in connection.channels.values()):
                try:
                    publisher.publish_nowait("busy", payload)
                    sent += 1
                except trio.WouldBlock:
                    await trio.sleep(0.01)
                await trio.lowlevel.checkpoint()
            # ...then catch up at once: the stall ends long before the threshold.
            for _ in range(sent):
                await subscription.receive()
            await wait_until(
                lambda: not any(s.waiting for s in connection.channels.values()),
                what="the channel to flow again",
            )
        assert not any(advised(broker))
        assert publisher.throttled_topics == set()
        assert "withholds guarantees" not in caplog.text
