"""What a peer can hold before it has said Hello: one small frame, for a
bounded time, whatever it sends meanwhile."""

from __future__ import annotations

import trio

from broker.client import open_client
from broker.protocol import GoodbyeCode
from broker.protocol.connection import MAX_HELLO_FRAME
from tests.server.helpers import (
    TIMEOUT,
    RawClient,
    running_broker,
    url,
    wait_idle,
    wait_subscribed,
)


async def test_a_peer_that_never_completes_its_hello_is_closed_at_the_hello_timeout() -> None:
    # A long lease: trickling bytes would keep it alive forever; the Hello deadline does not.
    async with running_broker(hello_timeout=0.5, heartbeat=5.0, lease=60.0) as broker:
        client = await RawClient.connect(broker)
        started = trio.current_time()
        await client.send((100).to_bytes(4, "big") + b"\x83")  # the start of a Hello
        with trio.fail_after(TIMEOUT):
            while not client.eof:
                await client.send(b"\x00")  # one more byte, never the whole frame
                with trio.move_on_after(0.05):
                    await client._more()
        assert client.goodbye_code() == GoodbyeCode.LEASE_EXPIRED
        assert client.goodbyes()[0].reason == "no Hello in time"
        assert 0.5 <= trio.current_time() - started < 0.5 + TIMEOUT / 2
        await client.aclose()
        assert broker.security.lease_expirations == 0  # it never had a lease
        await wait_idle(broker)


async def test_before_the_hello_only_small_frames_are_accepted() -> None:
    async with running_broker(max_frame=256 * 1024, publish_capacity=1024 * 1024) as broker:
        client = await RawClient.connect(broker)
        await client.send((MAX_HELLO_FRAME + 1).to_bytes(4, "big"))
        await client.read_until_eof()
        assert client.goodbye_code() == GoodbyeCode.FRAME_TOO_LARGE
        await client.aclose()
        # After the Hello the broker's own max_frame applies.
        big = b"x" * (100 * 1024)
        with trio.fail_after(TIMEOUT):
            async with (
                open_client(url(broker)) as client,
                client.subscribe("big") as subscription,
            ):
                await wait_subscribed(broker, "big")
                await client.publish("big", big)
                assert (await subscription.receive()).payload == big
        await wait_idle(broker)
