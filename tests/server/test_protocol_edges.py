"""Protocol edges over real TCP (issue 18): a client that never reads costs
about ``max_unsent``, a topic freed while throttled hears nothing more about
itself, and a resume after the broker ended a subscription keeps the
connection."""

from __future__ import annotations

import contextlib
import dataclasses
import socket
import threading
import tracemalloc
from collections.abc import Mapping
from functools import partial

import pytest
import trio

from broker.client import BlockingClient, ClientError, open_client
from broker.config import MiB
from broker.protocol import (
    BindTopic,
    Channel,
    ChannelKind,
    Confirm,
    FreeHandle,
    Goodbye,
    IssueGuarantee,
    Message,
    Ping,
    Pong,
    Publish,
    Throttled,
)
from broker.protocol.connection import BrokerSessionState
from broker.protocol.frames import encode
from broker.server import Broker
from tests.proxy import proxied

from .helpers import (
    DEAF_CONFIG,
    TIMEOUT,
    RawClient,
    connection_named,
    raw_client,
    running_broker,
    subscribe_deaf,
    url,
    wait_subscribed,
    wait_until,
)

# ==================================================================== item 5

MAX_UNSENT = 1 * MiB


async def flood_until_stalled(broker: Broker, client: RawClient) -> None:
    """Send Pings and read nothing until the broker has stopped reading
    them: its reader paused on what it queued for us, which its writer,
    stuck on our full socket, cannot send."""
    connection = connection_named(broker, "flooder")
    pings = encode(Ping(1)) * 10_000

    async def flood() -> None:
        while True:
            await client.stream.send_all(pings)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(flood)
        with trio.fail_after(3 * TIMEOUT):
            read = stable = 0
            while stable < 20 or not connection.counters.reader_pauses:
                await trio.sleep(0.01)  # (20 looks without reading: it stopped)
                stable = stable + 1 if connection.counters.bytes_in == read else 0
                read = connection.counters.bytes_in
        nursery.cancel_scope.cancel()


async def test_a_client_that_never_reads_costs_about_max_unsent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Ping flood from a client that reads nothing makes the broker queue a
    7-byte Pong per Ping, each costing some 56 bytes of memory. The queue is
    bounded by that memory, not its bytes: at its fullest (when the writer
    takes it) the broker holds about ``max_unsent`` (before: about eight
    times that)."""
    async with running_broker(max_unsent=MAX_UNSENT) as broker:
        client = await RawClient.connect(broker)
        try:
            client.stream.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            await client.handshake("flooder")
            protocol = connection_named(broker, "flooder").protocol
            fullest = 0
            take = protocol.data_to_send

            def measured_take(now: float | None = None) -> bytes:
                nonlocal fullest
                fullest = max(fullest, tracemalloc.get_traced_memory()[0])
                return take(now)

            monkeypatch.setattr(protocol, "data_to_send", measured_take)
            tracemalloc.start()
            try:
                before, _ = tracemalloc.get_traced_memory()
                await flood_until_stalled(broker, client)
                held = max(fullest, tracemalloc.get_traced_memory()[0]) - before
            finally:
                tracemalloc.stop()
            assert held < 2 * MAX_UNSENT, f"{held / MiB:.1f} MiB held"
            assert held > MAX_UNSENT / 2  # (it did fill up)
            assert not protocol.closed
        finally:
            await client.aclose()


# ==================================================================== item 13


def about_topic(message: Message, topic: int) -> bool:
    channel = Channel(ChannelKind.PUBLISH, topic)
    if isinstance(message, Throttled | IssueGuarantee):
        return message.channel == channel
    return isinstance(message, Confirm) and message.topic == topic


async def test_a_topic_freed_while_throttled_hears_nothing_more_about_itself() -> None:
    """A client frees a topic whose publishes the broker still holds (the
    channel's account is blocked by a subscriber that reads nothing). After
    its own FreeHandle the broker sends neither the Throttled notice nor the
    Confirm of the publishes it routes later (the client deleted the handle:
    either would be a protocol error), and the connection lives on."""
    config = {**DEAF_CONFIG, "publish_capacity": 64 * 1024, "throttle_notice_after": 0.2}
    async with (
        running_broker(**config) as broker,
        raw_client(broker) as deaf,
        raw_client(broker, background=True) as client,
    ):
        await subscribe_deaf(deaf, grant=0)
        await wait_subscribed(broker, "busy")
        await client.handshake("pub")
        await client.send(BindTopic("busy"))
        channel = Channel(ChannelKind.PUBLISH, 0)
        await client.wait_for_guarantee(channel)
        connection = connection_named(broker, "pub")
        state = connection.channels[0]
        frame = encode(Publish(0, b"x" * 10))
        sent = 0
        with trio.fail_after(TIMEOUT):
            # Publish within the guarantees until the broker holds many (more
            # than two forwarding slices) waiting for the account to clear.
            while not (state.account.blocked and len(state.buffer) > 512):
                count = (client.guarantees(channel) - sent) // len(frame)
                if count:
                    await client.send(frame * count)
                    sent += count * len(frame)
                await trio.sleep(0.01)
        await client.send(FreeHandle(0, 0, True))
        answer = await client.wait_for(lambda m: isinstance(m, FreeHandle))
        await wait_until(lambda: state.advised, what="the throttle notice to be due")
        # The subscriber leaves: the held publishes are forwarded and routed.
        await deaf.send(Goodbye(0, "bye"))
        await deaf.aclose()
        await wait_until(lambda: 0 not in connection.channels, what="the topic to drain")
        await client.send(Ping(7))
        await client.wait_for(lambda m: isinstance(m, Pong) and m.nonce == 7)
        after = client.frames[client.frames.index(answer) + 1 :]
        assert [m for m in after if about_topic(m, 0)] == []
        assert client.goodbye_code() is None
        assert broker.internal_errors == 0


# ==================================================================== item 16


def end_subscriptions_to_gone_on_resume(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the broker's sessions lose their subscriptions to topic "gone"
    when they are resumed, as if the broker had ended them meanwhile."""
    for_resume = BrokerSessionState.for_resume

    def ending_gone(
        self: BrokerSessionState, processed: Mapping[int, int]
    ) -> tuple[BrokerSessionState, list[int]]:
        restore, dropped = for_resume(self, processed)
        gone = [h for h, (info, _) in restore.subscriptions.items() if info.topic_name == "gone"]
        kept = {h: v for h, v in restore.subscriptions.items() if h not in gone}
        return dataclasses.replace(restore, subscriptions=kept), dropped + gone

    monkeypatch.setattr(BrokerSessionState, "for_resume", ending_gone)


async def test_a_resume_after_the_broker_ended_a_subscription_keeps_the_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The broker no longer has one of the session's subscriptions when the
    client resumes (as after the broker freed it while the client was away):
    its Welcome says which survive, the client ends that one (receiving from
    it raises ClientError) and goes on with the rest on the same connection.
    Before, the client restored it and the broker closed with Goodbye 1."""
    end_subscriptions_to_gone_on_resume(monkeypatch)
    async with (
        running_broker() as broker,
        proxied(broker.address) as proxy,
        open_client(proxy.url, name="sub", reconnect=TIMEOUT) as client,
        open_client(url(broker), name="pub") as publisher,
        client.subscribe("kept") as kept,
    ):
        async with contextlib.AsyncExitStack() as stack:
            gone = await stack.enter_async_context(client.subscribe("gone"))
            await publisher.publish("kept", b"before")
            assert (await kept.receive()).payload == b"before"
            proxy.cut()
            await wait_until(lambda: client.resumes == 1, what="the resume")
            with trio.fail_after(TIMEOUT), pytest.raises(ClientError, match="closed"):
                await gone.receive()
            await publisher.publish("gone", b"nobody hears this")
            await publisher.publish("kept", b"after")
            with trio.fail_after(TIMEOUT):
                assert (await kept.receive()).payload == b"after"
            with trio.fail_after(TIMEOUT / 2):  # leaving it frees nothing: no wait
                await stack.aclose()
        assert client.resumes == 1 and client.sessions_lost == 0
        assert broker.sessions.resumed_total == 1
        assert broker.internal_errors == 0


async def test_a_blocking_client_too_ends_that_subscription_and_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same with the blocking client: iterating the ended subscription
    stops, closing it returns at once, the other one goes on."""
    end_subscriptions_to_gone_on_resume(monkeypatch)
    subscribed, cut = threading.Event(), threading.Event()
    seen: dict[str, object] = {}
    async with (
        running_broker() as broker,
        proxied(broker.address) as proxy,
        open_client(url(broker), name="pub") as publisher,
    ):

        def subscriber() -> None:
            with BlockingClient(proxy.url, name="sub", reconnect=TIMEOUT) as client:
                kept = client.subscribe("kept", timeout=TIMEOUT)
                gone = client.subscribe("gone", timeout=TIMEOUT)
                subscribed.set()
                assert cut.wait(TIMEOUT)
                seen["after"] = kept.receive(timeout=TIMEOUT).payload  # (resumes first)
                seen["gone"] = list(gone)
                gone.close()
                seen["resumes"] = client.resumes

        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.to_thread.run_sync, subscriber)
            await trio.to_thread.run_sync(partial(subscribed.wait, TIMEOUT))
            proxy.cut()
            cut.set()
            await publisher.publish("kept", b"after")
        assert seen == {"after": b"after", "gone": [], "resumes": 1}
        assert broker.internal_errors == 0
