"""Messages larger than a frame with the broker's defaults (64 KiB frames):
sent in FramePart frames on their own channel and reassembled, up to the
broker's ``max_message`` (16 MiB by default), without raising ``max_frame``
and so without shrinking what a connection funds. On the base code a 1 MiB
publish raised "exceeds max_frame"."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from broker.client import open_client
from broker.config import KiB, MiB

from .helpers import TIMEOUT, make_config, running_broker, url


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
        await publisher.publish("big", b"before")
        await publisher.publish("big", ONE_MIB, key=b"k", headers=[("h", b"v")])
        await publisher.publish("big", b"after")
        await publisher.flush()
        with trio.fail_after(TIMEOUT):
            assert (await subscription.receive()).payload == b"before"
            message = await subscription.receive()
            assert message.payload == ONE_MIB
            assert message.key == b"k"
            assert message.headers == [("h", b"v")]
            assert (await subscription.receive()).payload == b"after"
