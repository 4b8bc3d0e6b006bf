"""Every client checks a topic name against the rule before anything is sent:
a bad name raises TopicNameError (a ValueError) at once, the connection
stays usable, and the broker never hears of it."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import pytest
import trio

from broker.client import (
    BlockingClient,
    BlockingClusterClient,
    TopicNameError,
    open_client,
    open_cluster_client,
)
from broker.server import Broker
from tests.server.helpers import TIMEOUT, connection_named, running_broker, url, wait_subscribed

#: Generous: only reached when something hangs.
SAFETY = 10.0

BAD_NAMES = {
    "empty": "",
    "NUL": "a\x00b",
    "newline": "a\nb",
    "bidi override": "abc\u202edef",
    "space": "two words",
    "not NFC": "cafe\u0301",
    "surrogate": "a\ud800",
    "256 bytes": "x" * 256,
    "20 KB": "x" * 20_000,
}
#: 255 bytes of UTF-8: the longest name there is.
LONGEST = "é" * 127 + "x"


def broker_topic_handles(broker: Broker, client_name: str) -> int:
    """Topic handles the broker has bound for the client named ``client_name``."""
    return connection_named(broker, client_name).protocol.topics.next_handle


@pytest.mark.parametrize("name", BAD_NAMES.values(), ids=list(BAD_NAMES))
async def test_the_async_client_refuses_a_bad_name_before_sending(name: str) -> None:
    async with running_broker() as broker, open_client(url(broker), name="pub") as client:
        with trio.fail_after(TIMEOUT):
            with pytest.raises(TopicNameError):
                await client.publish(name, b"x")
            with pytest.raises(TopicNameError):
                client.publish_nowait(name, b"x")
            with pytest.raises(TopicNameError):
                async with client.subscribe(name):
                    pass  # pragma: no cover
            # Nothing was bound on either side, and the connection still works.
            assert client._conn.topics.next_handle == 0
            await client.publish("fine", b"x")
            await client.flush()
            assert broker_topic_handles(broker, "pub") == 1
            assert set(broker.topics) <= {"fine"}


async def test_the_async_client_publishes_and_subscribes_at_the_limit() -> None:
    async with (
        running_broker() as broker,
        open_client(url(broker)) as subscriber,
        open_client(url(broker)) as publisher,
        subscriber.subscribe(LONGEST) as subscription,
    ):
        with trio.fail_after(TIMEOUT):
            await wait_subscribed(broker, LONGEST)
            await publisher.publish(LONGEST, b"longest")
            message = await subscription.receive()
        assert (message.topic, message.payload) == (LONGEST, b"longest")


def blocking_calls(client: BlockingClient | BlockingClusterClient) -> list[Callable[[str], object]]:
    calls: list[Callable[[str], object]] = [
        lambda name: client.publish(name, b"x", timeout=SAFETY),
        lambda name: client.subscribe(name, timeout=SAFETY),
    ]
    if isinstance(client, BlockingClient):
        calls.append(lambda name: client.publish_nowait(name, b"x"))
    return calls


async def test_the_blocking_client_refuses_a_bad_name_before_sending() -> None:
    async with running_broker() as broker:

        def run() -> None:
            with BlockingClient(url(broker), name="blocking") as client:
                for name in BAD_NAMES.values():
                    for call in blocking_calls(client):
                        with pytest.raises(TopicNameError):
                            call(name)
                assert client._conn.topics.next_handle == 0
                client.publish("fine", b"x", timeout=SAFETY)
                client.flush(timeout=SAFETY)
                assert trio.from_thread.run_sync(broker_topic_handles, broker, "blocking") == 1
                with client.subscribe(LONGEST, timeout=SAFETY) as subscription:
                    client.publish(LONGEST, b"longest", timeout=SAFETY)
                    message = subscription.receive(timeout=SAFETY)
                    assert (message.topic, message.payload) == (LONGEST, b"longest")

        await trio.to_thread.run_sync(run)


async def test_the_cluster_clients_refuse_a_bad_name_before_routing() -> None:
    """``route`` hashes the name's UTF-8: a surrogate used to escape as a
    UnicodeEncodeError; every bad name is now a TopicNameError."""
    async with running_broker() as first, running_broker() as second:
        servers = [url(first), url(second)]
        async with open_cluster_client(servers) as cluster:
            for name in BAD_NAMES.values():
                with pytest.raises(TopicNameError):
                    cluster.client_for(name)
                with pytest.raises(TopicNameError):
                    await cluster.publish(name, b"x")
                with pytest.raises(TopicNameError):
                    cluster.publish_nowait(name, b"x")
                with pytest.raises(TopicNameError):
                    async with cluster.subscribe(name):
                        pass  # pragma: no cover
            await cluster.publish("fine", b"x")
            await cluster.flush()

        def run() -> None:
            with BlockingClusterClient(servers) as blocking:
                for name in BAD_NAMES.values():
                    for call in blocking_calls(blocking):
                        with pytest.raises(TopicNameError):
                            call(name)
                blocking.publish("fine", b"x", timeout=SAFETY)

        await trio.to_thread.run_sync(partial(run))
