"""Messages larger than the clients' default delivery window (256 KiB), on
a broker whose ``max_frame`` was raised for them: the window of a client
that did not choose one grows to the broker's largest Deliver. It used to
stay at 256 KiB, and such a message (and every one after it) never reached
any subscriber: no error anywhere, the subscription stuck for good."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from broker.client import BlockingClient, open_client
from broker.config import KiB, MiB
from broker.protocol import Policy

from .helpers import TIMEOUT, make_config, running_broker, url

BIG = b"q" * (300 * KiB)


def big_frames(**overrides: object) -> dict[str, object]:
    """Settings of a broker that takes 1 MiB frames."""
    return {
        "max_frame": MiB,
        "publish_capacity": MiB + 64,
        "connection_budget": 4 * MiB,
        **overrides,
    }


@pytest.mark.parametrize("logs", [False, True], ids=["memory-only", "topic-log"])
async def test_a_message_larger_than_the_default_window_is_delivered(
    tmp_path: Path, logs: bool
) -> None:
    where = {"data_dir": str(tmp_path)} if logs else {"memory_only": True}
    async with (
        running_broker(make_config(**big_frames(**where))) as broker,
        open_client(url(broker), name="sub") as subscriber,
        subscriber.subscribe("big") as subscription,
        open_client(url(broker), name="pub") as publisher,
    ):
        await publisher.publish("big", BIG)
        await publisher.publish("big", b"small")
        await publisher.flush()
        with trio.fail_after(TIMEOUT):
            assert (await subscription.receive()).payload == BIG
            assert (await subscription.receive()).payload == b"small"


async def test_the_blocking_client_takes_one_too() -> None:
    async with running_broker(make_config(**big_frames())) as broker:
        address = url(broker)

        def round_trip() -> list[bytes]:
            with BlockingClient(address, name="blocking") as client:
                subscription = client.subscribe("big")
                client.publish("big", BIG)
                client.flush()
                return [subscription.receive(timeout=TIMEOUT).payload]

        assert await trio.to_thread.run_sync(round_trip) == [BIG]


async def test_a_window_given_is_kept_as_given() -> None:
    """A client that sets its window keeps it (the tests of dropping
    subscriptions use small ones): the policy's number is the window."""
    async with (
        running_broker(make_config(**big_frames())) as broker,
        open_client(url(broker), policy=Policy(deliver_capacity=1024)) as client,
        client.subscribe("t") as subscription,
    ):
        (state,) = client._session.conn.statistics().receivers  # type: ignore[attr-defined]
        assert state.capacity == 1024
        await client.publish("t", b"fits")
        await client.flush()
        with trio.fail_after(TIMEOUT):
            assert (await subscription.receive()).payload == b"fits"
