"""A reliable subscription's loans: one per routed batch, split when only
part of a batch fits the subscriber's guarantees, repaid once acknowledged
whole; in all, exactly what a loan per delivery would charge."""

from __future__ import annotations

from broker.client import open_client
from broker.protocol import Ack, BindTopic, Channel, ChannelKind, Deliver, IssueGuarantee, Subscribe
from broker.protocol.frames import encode, encode_deliver_tail
from broker.server.topics._topic import DELIVER_HEAD_ESTIMATE

from .helpers import connection_named, raw_client, running_broker, url, wait_until

DELIVER_0 = Channel(ChannelKind.DELIVER, 0)
PAYLOAD = b"p" * 100
COUNT = 40


def _delivered(frames: list[object]) -> list[int]:
    return [m.seq for m in frames if isinstance(m, Deliver)]


async def test_a_batch_split_by_the_guarantees_is_charged_as_per_delivery_loans() -> None:
    frame = len(encode(Deliver(0, 1, PAYLOAD)))
    async with running_broker() as broker, raw_client(broker, background=True) as subscriber:
        await subscriber.handshake("sub")
        await subscriber.send(
            BindTopic("t"), Subscribe(0, "reliable", {}), IssueGuarantee(DELIVER_0, frame)
        )
        await wait_until(lambda: bool(broker.topics.get("t") and broker.topics["t"].subscriptions))
        subscription = broker.topics["t"].subscriptions[0]
        async with open_client(url(broker), name="pub") as publisher:
            # A first message binds the topic; once acknowledged, nothing is owed.
            await publisher.publish("t", PAYLOAD)
            await publisher.flush()
            account = connection_named(broker, "pub").channels[0].account
            await subscriber.wait_for(lambda m: isinstance(m, Deliver) and m.seq == 1)
            await subscriber.send(Ack(0, 1))
            await wait_until(lambda: account.debt == 0)
            per_delivery = (
                len(encode_deliver_tail(PAYLOAD, None, None))
                + DELIVER_HEAD_ESTIMATE
                + account.event_cost
            )

            # COUNT more in one write (one routed batch), room for ten of them.
            for _ in range(COUNT):
                publisher.publish_nowait("t", PAYLOAD)
            await publisher.flush()
            await subscriber.send(IssueGuarantee(DELIVER_0, 10 * frame))
            await subscriber.wait_for(lambda m: isinstance(m, Deliver) and m.seq == 11)
            assert _delivered(subscriber.frames) == list(range(1, 12))
            assert (subscription.unacked_deliveries, subscription.queued) == (10, COUNT - 10)
            assert len(subscription.unacked) == 1  # the part sent, split off the batch
            assert account.debt == COUNT * per_delivery

            # Half the sent part acknowledged: its loan is not repaid yet...
            await subscriber.send(Ack(0, 6))
            await wait_until(lambda: subscription.acked == 6)
            assert account.debt == COUNT * per_delivery
            # ...all of it: exactly ten deliveries' worth is.
            await subscriber.send(Ack(0, 11))
            await wait_until(lambda: subscription.acked == 11)
            assert account.debt == (COUNT - 10) * per_delivery

            # The rest, with room for all of it, then acknowledged: nothing owed.
            await subscriber.send(IssueGuarantee(DELIVER_0, COUNT * frame))
            await subscriber.wait_for(lambda m: isinstance(m, Deliver) and m.seq == COUNT + 1)
            assert _delivered(subscriber.frames) == list(range(1, COUNT + 2))
            await subscriber.send(Ack(0, COUNT + 1))
            await wait_until(lambda: account.debt == 0)
            assert subscription.unacked_deliveries == subscription.queued == 0
            assert account.statistics().loans == 0
