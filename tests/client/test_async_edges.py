"""Edges of the async client that a review of DeliverMany found (they were
older than it): a read that returns after the connection was replaced, a
subscription closed while the connection is being replaced, and receive()
on a closed subscription."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from broker.client import Client, ClientError, open_client
from tests.proxy import proxied
from tests.server.helpers import TIMEOUT, running_broker, url, wait_until

COUNT = 200


class LateRead(trio.abc.Stream):
    """A stream whose first large read comes back only after the writer has
    failed (and the client started replacing the connection): a read can
    return after its cancellation, trio's reads end on a shielded checkpoint."""

    def __init__(self, inner: trio.abc.Stream, control: dict[str, Any]) -> None:
        self.inner = inner
        self.control = control

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self.control.get("break") is self:
            raise trio.BrokenResourceError("simulated")
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        data = await self.inner.receive_some(max_bytes)
        control = self.control
        if control.get("armed") and len(data) > 1000 and control["first"] is self:
            control["armed"] = False
            control["break"] = self
            client: Client = control["client"]
            client._conn.ping()  # something for the writer to fail on
            client._wake_writer()
            await trio.lowlevel.cancel_shielded_checkpoint()
            await trio.lowlevel.cancel_shielded_checkpoint()
            control["replacing"] = client._reconnecting
        return data

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_a_read_returning_after_the_connection_was_replaced_is_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    control: dict[str, Any] = {}
    real = trio.open_tcp_stream

    async def open_late(host: str, port: int, **kwargs: Any) -> trio.abc.Stream:
        stream = LateRead(await real(host, port, **kwargs), control)
        control.setdefault("first", stream)
        return stream

    monkeypatch.setattr(trio, "open_tcp_stream", open_late)
    async with (
        running_broker(heartbeat=0.5, lease=5.0) as broker,
        open_client(url(broker), name="sub", reconnect=TIMEOUT) as client,
        client.subscribe("t") as sub,
    ):
        control["client"] = client
        control["armed"] = True
        async with open_client(url(broker), name="pub") as publisher:
            for i in range(COUNT):
                await publisher.publish("t", b"%04d" % i + b"." * 40)
        got: list[int] = []
        with trio.fail_after(TIMEOUT):
            while len(got) < COUNT:
                got += [int(m.payload[:4]) for m in await sub.receive_batch()]
        assert control["replacing"] is True  # the late read did happen
        assert client.resumes == 1
        # Nothing lost, nothing twice: the old read's messages came again
        # through the resumed session, and no room was released on the wrong
        # connection (that raised LocalProtocolError here).
        assert got == list(range(COUNT))


async def test_a_subscription_closed_while_reconnecting_is_freed_on_the_new_connection() -> None:
    async with (
        running_broker(heartbeat=0.5, lease=5.0) as broker,
        proxied(broker.address) as proxy,
        open_client(proxy.url, name="sub", reconnect=TIMEOUT) as client,
    ):
        async with client.subscribe("t"):
            await wait_until(lambda: broker.statistics().subscriptions == 1, what="subscribed")
            proxy.cut()
            with trio.fail_after(TIMEOUT):
                while not client._reconnecting:  # (it is quick: no polling interval)
                    await trio.lowlevel.checkpoint()
        # Left the block while reconnecting: freed once the session is resumed.
        assert client.resumes == 1
        await wait_until(lambda: broker.statistics().subscriptions == 0, what="the free")
        await client.publish("other", b"round trip")
        await client.flush()
        assert client._conn.statistics().subscriptions_bound == 0


@pytest.mark.parametrize("call", ["receive", "receive_batch"])
async def test_receiving_on_a_closed_subscription_raises_instead_of_waiting(call: str) -> None:
    async with running_broker() as broker, open_client(url(broker), name="c") as client:
        outcome: list[str] = []

        async def receiver(sub: Any) -> None:
            with pytest.raises(ClientError, match="closed"):
                await getattr(sub, call)()
            outcome.append("raised")

        with trio.fail_after(TIMEOUT):
            async with trio.open_nursery() as nursery, client.subscribe("t") as sub:
                nursery.start_soon(receiver, sub)
                await trio.testing.wait_all_tasks_blocked()
            assert outcome == ["raised"]  # the one parked when it closed
            with pytest.raises(ClientError, match="closed"):
                await getattr(sub, call)()  # and a call after
