"""``subscribe(start=, cursor=)`` and ``Message.offset`` through every
client (trio, blocking, and the cluster clients over them), against the
fake broker of ``fake_log_broker.py`` on a real socket. No broker process is
needed, so this holds whatever the server does with the options."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
import trio

from broker.client import (
    BlockingClient,
    BlockingClusterClient,
    ClientError,
    Message,
    open_client,
    open_cluster_client,
)
from tests.server.helpers import TIMEOUT

from .fake_log_broker import FIRST, fake_broker

WHEN = datetime.datetime(2026, 11, 25, 10, 0, tzinfo=datetime.UTC)


def received(messages: list[Message]) -> list[tuple[int, int | None]]:
    return [(message.seq, message.offset) for message in messages]


async def test_async_client() -> None:
    with trio.fail_after(TIMEOUT):
        async with fake_broker(True) as (address, seen), open_client(address) as client:
            async with client.subscribe("t", start="earliest", cursor="c1") as subscription:
                messages = [await subscription.receive() for _ in range(3)]
            with pytest.raises(ValueError, match="needs mode='reliable'"):
                async with client.subscribe("t", mode="lossy", start=5):
                    pass  # pragma: no cover
    assert seen.options == [{"from": "earliest", "cursor": "c1"}]
    assert received(messages) == [(seq, seq) for seq in range(FIRST, FIRST + 3)]


async def test_async_client_of_a_broker_without_logs() -> None:
    """No offsets; a start is refused before anything is sent, and the
    connection goes on."""
    with trio.fail_after(TIMEOUT):
        async with fake_broker(False) as (address, seen), open_client(address) as client:
            with pytest.raises(ClientError, match="keeps no topic log"):
                async with client.subscribe("t", start="earliest"):
                    pass  # pragma: no cover
            async with client.subscribe("t") as subscription:
                messages = [await subscription.receive() for _ in range(3)]
    assert seen.options == [{}]
    assert received(messages) == [(seq, None) for seq in range(FIRST, FIRST + 3)]


async def test_async_cluster_client() -> None:
    with trio.fail_after(TIMEOUT):
        async with (
            fake_broker(True) as (address, seen),
            open_cluster_client(address) as cluster,
            cluster.subscribe("t", start=WHEN) as subscription,
        ):
            message = await subscription.receive()
    assert seen.options == [{"from_time": 1795600800000}]
    assert message.offset == FIRST


@pytest.mark.parametrize("cluster", [False, True], ids=["client", "cluster"])
async def test_blocking_clients(cluster: bool) -> None:
    def consume(address: str) -> list[Message]:
        client: Any = BlockingClusterClient(address) if cluster else BlockingClient(address)
        with client:
            with pytest.raises(ValueError, match="say the same thing"):
                client.subscribe("t", options={"cursor": "a"}, cursor="b")
            with client.subscribe("t", start=7, cursor="c2", timeout=TIMEOUT) as subscription:
                return [subscription.receive(timeout=TIMEOUT) for _ in range(3)]

    with trio.fail_after(TIMEOUT):
        async with fake_broker(True) as (address, seen):
            messages = await trio.to_thread.run_sync(consume, address)
    assert seen.options == [{"from": 7, "cursor": "c2"}]
    assert received(messages) == [(seq, seq) for seq in range(FIRST, FIRST + 3)]


async def test_leaving_acknowledges_what_was_taken_and_no_more() -> None:
    """Taken messages are acknowledged in batches; leaving a subscription (or
    closing the client with it open) acknowledges the rest of what was taken,
    even mid-batch, so that a durable cursor stands right after it."""
    with trio.fail_after(TIMEOUT):
        async with (
            fake_broker(True) as (address, seen),
            open_client(address) as client,
            client.subscribe("t", cursor="c") as subscription,
        ):
            # (the fake broker delivers before it answers the Ping of subscribe())
            assert subscription.received == 3
            taken = [await subscription.receive() for _ in range(2)]
            assert not seen.acks  # (not a batch yet)
    assert [message.offset for message in taken] == [FIRST, FIRST + 1]
    assert [ack.seq for ack in seen.acks] == [FIRST + 1]

    def take_two_and_close(address: str) -> None:
        client = BlockingClient(address)
        subscription = client.subscribe("t", cursor="c", timeout=TIMEOUT)
        assert subscription.pending == 3
        subscription.receive(timeout=TIMEOUT)
        subscription.receive(timeout=TIMEOUT)
        client.close()  # the subscription still open

    with trio.fail_after(TIMEOUT):
        async with fake_broker(True) as (address, seen):
            await trio.to_thread.run_sync(take_two_and_close, address)
    assert [ack.seq for ack in seen.acks] == [FIRST + 1]
