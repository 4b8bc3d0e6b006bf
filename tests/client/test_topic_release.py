"""The clients release the topics they used least recently: when the broker
funds no more channels, or past ``max_topics``. Publishing to a released
topic binds it anew, and every message still arrives once, in order."""

from __future__ import annotations

from contextlib import AsyncExitStack

import pytest
import trio

from broker.client import BlockingClient, ClientError, open_client
from tests.server.helpers import TIMEOUT, connection_named, running_broker, url, wait_idle

#: Room for three publish channels of one frame: a fourth topic needs a release.
THREE_CHANNELS = {
    "max_frame": 1024,
    "publish_capacity": 1024 + 64,
    "bind_capacity": 1024,
    "connection_budget": 2 * 1024 + 3 * (1024 + 64),
}
TOPICS = [f"ring-{i}" for i in range(8)]
ROUNDS = 15


async def test_round_robin_over_more_topics_than_funded_keeps_order() -> None:
    """Eight topics, room for three channels: every publish may need a topic
    released and one bound anew, and each topic's messages still arrive in
    order, once."""
    async with running_broker(**THREE_CHANNELS) as broker:
        async with (
            open_client(url(broker), name="ring-sub") as subscriber,
            AsyncExitStack() as stack,
        ):
            subscriptions = [
                await stack.enter_async_context(subscriber.subscribe(topic)) for topic in TOPICS
            ]
            async with open_client(url(broker), name="ring-pub") as publisher:
                with trio.fail_after(TIMEOUT):
                    for index in range(ROUNDS):
                        for topic in TOPICS:
                            await publisher.publish(topic, b"%d" % index)
                    await publisher.flush()
                    funded = connection_named(broker, "ring-pub").channels
                    assert len(funded) <= len(TOPICS)
                statistics = publisher.statistics()
            assert statistics["published"] == statistics["confirmed"] == ROUNDS * len(TOPICS)
            assert statistics["topics"] <= 3 < statistics["topics_released"]
            for subscription in subscriptions:
                with trio.fail_after(TIMEOUT):
                    received = [int((await subscription.receive()).payload) for _ in range(ROUNDS)]
                assert received == list(range(ROUNDS))
        await wait_idle(broker)


def publish_rounds(address: str, max_topics: int) -> dict[str, int]:
    with BlockingClient(address, name="capped", max_topics=max_topics) as client:
        for index in range(ROUNDS):
            for topic in TOPICS:
                client.publish(topic, b"%d" % index, timeout=TIMEOUT)
                assert client.statistics()["topics"] <= max_topics
        client.flush(timeout=TIMEOUT)
        return client.statistics()


async def test_max_topics_bounds_the_handles_a_client_holds() -> None:
    async with running_broker() as broker:
        async with (
            open_client(url(broker), name="capped-sub") as subscriber,
            AsyncExitStack() as stack,
        ):
            subscriptions = [
                await stack.enter_async_context(subscriber.subscribe(topic)) for topic in TOPICS
            ]
            statistics = await trio.to_thread.run_sync(publish_rounds, url(broker), 3)
            assert statistics["published"] == statistics["confirmed"] == ROUNDS * len(TOPICS)
            assert statistics["topics_released"] >= ROUNDS * len(TOPICS) - 3
            for subscription in subscriptions:
                with trio.fail_after(TIMEOUT):
                    received = [int((await subscription.receive()).payload) for _ in range(ROUNDS)]
                assert received == list(range(ROUNDS))
        await wait_idle(broker)


async def test_max_topics_must_be_positive() -> None:
    with pytest.raises(ClientError, match="max_topics"):
        async with open_client("127.0.0.1:1", max_topics=0):
            pass  # pragma: no cover
    with pytest.raises(ClientError, match="max_topics"):
        BlockingClient("127.0.0.1:1", max_topics=0)
