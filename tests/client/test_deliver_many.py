"""Both clients read DeliverMany frames from a real broker over loopback:
every message in order, and a subscription closed in the middle of a frame
gives back the whole frame (the broker frees the subscription, the client's
handle is deleted, and the connection goes on)."""

from __future__ import annotations

from functools import partial

import pytest
import trio

from broker.client import ClientError, open_client
from broker.protocol import Policy
from tests.server.helpers import wait_until

from .test_blocking import SAFETY, blocking_client, bound_after_round_trip, running_broker

COUNT = 3000
#: Messages the blocking subscriber leaves untaken when it closes.
TAKEN = 5


async def publish(url: str, topic: str, count: int) -> None:
    async with open_client(url, name="publisher") as publisher:
        for i in range(count):
            await publisher.publish(topic, b"%08d" % i + b"." * 92)
        await publisher.flush()


async def test_an_async_subscriber_reads_deliver_many_frames_in_order() -> None:
    async with (
        running_broker() as (_broker, url),
        open_client(url, name="reader") as reader,
        reader.subscribe("t") as sub,
    ):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(publish, url, "t", COUNT)
            with trio.fail_after(SAFETY):
                seqs = []
                for i in range(COUNT):
                    message = await sub.receive()
                    assert message.payload[:8] == b"%08d" % i
                    seqs.append(message.seq)
        assert seqs == list(range(1, COUNT + 1))
        # Many messages came per frame: fewer frames than messages arrived.
        assert reader._conn.frames_received < COUNT // 2


async def test_an_async_subscription_closed_mid_frame_gives_the_frame_back() -> None:
    async with (
        running_broker() as (broker, url),
        open_client(url, name="reader", policy=Policy(deliver_capacity=64 * 1024)) as reader,
        trio.open_nursery() as nursery,
    ):
        async with reader.subscribe("t") as sub:
            nursery.start_soon(publish, url, "t", COUNT)
            inbox = sub._inbox

            def mid_frame() -> bool:
                # The first frame queued is a DeliverMany partly taken.
                if not inbox._ends:
                    return False
                last, _size, count = inbox._ends[0]
                return last - count < sub._consumed < last

            await wait_until(lambda: len(inbox) > 100, what="deliveries")
            with trio.fail_after(SAFETY):
                taken = 0
                while not mid_frame():
                    assert (await sub.receive()).payload[:8] == b"%08d" % taken
                    taken += 1
            assert taken < 100
        # Left the block: unsubscribed with the frame half taken.
        await wait_until(lambda: not broker.statistics().subscriptions, what="the unsubscribe")
        await reader.publish("other", b"round trip")
        await reader.flush()
        await wait_until(
            lambda: not reader._conn.statistics().subscriptions_bound,
            what="the client to delete the handle",
        )
        # Nothing held on the delivery channel, and the connection goes on.
        async with reader.subscribe("again") as again:
            await publish(url, "again", 10)
            with trio.fail_after(SAFETY):
                assert [(await again.receive()).seq for _ in range(10)] == list(range(1, 11))


async def test_a_blocking_subscriber_reads_deliver_many_and_closes_mid_frame() -> None:
    async with (
        running_broker() as (broker, url),
        blocking_client(url, name="reader") as reader,
    ):
        sub = await trio.to_thread.run_sync(partial(reader.subscribe, "t", timeout=SAFETY))
        await publish(url, "t", COUNT)

        def take_most_then_close() -> list[int]:
            seqs = [sub.receive(timeout=SAFETY).seq for _ in range(COUNT - TAKEN)]
            assert sub.pending > 0
            sub.close()
            return seqs

        seqs = await trio.to_thread.run_sync(take_most_then_close)
        assert seqs == list(range(1, COUNT - TAKEN + 1))
        assert reader._conn.frames_received < COUNT // 2

        assert await trio.to_thread.run_sync(bound_after_round_trip, reader) == 0
        assert broker.statistics().subscriptions == 0


async def test_receive_batch_takes_what_is_here_in_order_and_frees_the_window() -> None:
    window = 4096  # far less than COUNT messages: batches must reopen it
    async with (
        running_broker() as (_broker, url),
        open_client(url, name="reader", policy=Policy(deliver_capacity=window)) as reader,
        reader.subscribe("t") as sub,
    ):
        with pytest.raises(trio.WouldBlock):
            sub.receive_batch_nowait()
        with pytest.raises(ValueError, match="at least 1"):
            await sub.receive_batch(0)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(publish, url, "t", COUNT)
            seqs: list[int] = []
            sizes: list[int] = []
            with trio.fail_after(SAFETY):
                while len(seqs) < COUNT:
                    batch = await sub.receive_batch(20)
                    sizes.append(len(batch))
                    for message in batch:
                        assert message.payload[:8] == b"%08d" % len(seqs)
                        seqs.append(message.seq)
        assert seqs == list(range(1, COUNT + 1))
        assert max(sizes) == 20  # at most what was asked for, and more than one at once
        assert not sub._inbox


async def test_a_blocking_receive_batch_takes_what_is_here_in_order() -> None:
    async with (
        running_broker() as (_broker, url),
        blocking_client(url, name="reader", policy=Policy(deliver_capacity=4096)) as reader,
    ):
        sub = await trio.to_thread.run_sync(partial(reader.subscribe, "t", timeout=SAFETY))

        def take_all() -> tuple[list[int], int]:
            with pytest.raises(ValueError, match="at least 1"):
                sub.receive_batch(0)
            seqs: list[int] = []
            most = 0
            while len(seqs) < COUNT:
                batch = sub.receive_batch(15, timeout=SAFETY)
                most = max(most, len(batch))
                seqs += [message.seq for message in batch]
            with pytest.raises(TimeoutError):
                sub.receive_batch(timeout=0.01)
            sub.close()
            with pytest.raises(ClientError):
                sub.receive_batch(timeout=SAFETY)
            return seqs, most

        async with trio.open_nursery() as nursery:
            nursery.start_soon(publish, url, "t", COUNT)
            seqs, most = await trio.to_thread.run_sync(take_all)
        assert seqs == list(range(1, COUNT + 1))
        assert most == 15
