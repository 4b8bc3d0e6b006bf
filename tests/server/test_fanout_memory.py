"""A large message fanned out to many subscriptions of a client that does not
read is held once, not once per subscription: the connection's writer used
to join everything queued into one buffer before writing it, a copy of the
shared tail per subscription (one 65 KB publish to 9,000 subscriptions of
three non-reading connections: RssAnon +560 MiB, reported nowhere)."""

from __future__ import annotations

import tracemalloc

import trio

from broker.client import open_client
from broker.protocol import BindTopic, Channel, ChannelKind, IssueGuarantee, Subscribe

from .helpers import TIMEOUT, RawClient, running_broker, url, wait_until

SUBSCRIPTIONS = 300
PAYLOAD = b"p" * 60_000  # x 300 = 18 MB if copied per subscription


async def test_a_large_fanned_out_message_is_not_copied_per_subscription() -> None:
    async with running_broker(max_subscriptions=1000) as broker:
        deaf = await RawClient.connect(broker)
        try:
            await deaf.handshake("deaf")
            await deaf.send(BindTopic("hot"))
            for _ in range(SUBSCRIPTIONS):
                await deaf.send(Subscribe(0, "reliable", {}))
            await wait_until(
                lambda: broker.statistics().subscriptions == SUBSCRIPTIONS, what="subscribed"
            )
            await deaf.send(
                *(
                    IssueGuarantee(Channel(ChannelKind.DELIVER, i), 1 << 30)
                    for i in range(SUBSCRIPTIONS)
                )
            )
            tracemalloc.start()
            try:
                before = tracemalloc.get_traced_memory()[0]
                async with open_client(url(broker), name="pub") as client:
                    await client.publish("hot", PAYLOAD)
                    with trio.fail_after(TIMEOUT):
                        await client.flush()
                # Every delivery taken by the deaf connection's writer (which
                # waits in a write the client never reads).
                await wait_until(
                    lambda: all(c.protocol.bytes_to_send == 0 for c in broker.connections.values()),
                    what="the deliveries taken for writing",
                )
                await trio.sleep(0.1)
                held = tracemalloc.get_traced_memory()[0] - before
            finally:
                tracemalloc.stop()
            assert held < 4_000_000, held  # not 18 MB
        finally:
            await deaf.aclose()
