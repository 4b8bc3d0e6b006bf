"""The peer benchmark's raw clients of this broker, run in a worker process
(``broker.bench._worker``, roles ``raw_pub`` and ``raw_sub``): the sans-IO
protocol (:class:`broker.protocol.Connection`) over a trio socket, with
nothing of the client library (no session, no reconnection, no inbox, no
writer task), built as the MQTT peer clients are (``_mqtt_worker.py``), so
that the two brokers are measured with clients of the same weight.

The publisher sends each publish as soon as it is due, its frame written at
once, and reads Confirms meanwhile; it finishes once every publish is
confirmed. The subscriber (single ``Deliver`` frames, as a minimal client
asks) times each delivery (the time of the read that completed it) and
releases the read's frames; it acknowledges by the client library's rule
(its ``HeldAcks`` and ``RELEASE_BATCH``): at once when 32 deliveries, 8 KiB
of frames or a quarter of the window are unacknowledged, else within the
policy's ``ack_delay`` of the first (one cumulative ``Ack`` covers what
trickles in meanwhile), and what is left before it leaves. Results have the shape of the
broker's own workers' results.
"""

from __future__ import annotations

import math
import time
from typing import Any

import trio

from broker.client._acks import HeldAcks
from broker.client._subscription import RELEASE_BATCH
from broker.protocol import (
    Channel,
    ChannelKind,
    Confirm,
    Connection,
    ConnectionClosed,
    DeliverReceived,
    Event,
    GuaranteesReceived,
    HandleType,
    NoGuarantees,
    Role,
    WelcomeReceived,
)

from ._open_loop import STAMP, Arrivals, filler_for, published, schedule


class _Raw:
    """One connection: the protocol, its socket, and events read so far."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.conn = Connection(Role.CLIENT)

    @classmethod
    async def open(cls, url: str, name: str) -> _Raw:
        host, port = url.rsplit(":", 1)
        raw = cls(await trio.open_tcp_stream(host, int(port)))
        raw.conn.hello(name)
        await raw.flush()
        await raw.until(WelcomeReceived)
        return raw

    async def flush(self) -> None:
        data = self.conn.data_to_send(trio.current_time())
        if data:
            await self.stream.send_all(data)

    async def read(self) -> list[Event]:
        """The events of the next read (answering pings and the like)."""
        data = await self.stream.receive_some(65536)
        if not data:
            raise RuntimeError("the broker closed the connection")
        events = self.conn.receive_data(data, trio.current_time())
        for event in events:
            if isinstance(event, ConnectionClosed):
                raise RuntimeError(f"the broker said goodbye: {event.reason}")
        return events

    async def until(self, kind: type) -> None:
        """Read until an event of ``kind`` (others are dropped: set-up only)."""
        while True:
            events = await self.read()
            await self.flush()
            if any(isinstance(event, kind) for event in events):
                return

    async def until_confirmed(self, handle_type: HandleType, handle: int) -> None:
        """Read until the broker confirmed ``handle`` (set-up only)."""
        await self.flush()
        while not self.conn.confirmed(handle_type, handle):
            await self.read()
            await self.flush()

    async def close(self) -> None:
        self.conn.goodbye()
        await self.flush()
        await self.stream.aclose()


async def raw_publish(spec: dict[str, Any]) -> dict[str, Any]:
    """Publish ``rate`` messages/s for ``duration`` s to ``topic``; with
    ``confirm_latency``, also time each publish from its scheduled send
    time to the read that brought the ``Confirm`` covering it
    (``confirm_latencies``, ns)."""
    topic_name: str = spec["topic"]
    rate: float = spec["rate"]
    total = int(rate * spec["duration"])
    filler = filler_for(spec.get("size", 100))
    lateness: list[int] = []
    raw = await _Raw.open(spec["url"], "bench-raw-pub")
    conn = raw.conn
    topic = conn.bind_topic(topic_name)
    await raw.until_confirmed(HandleType.TOPIC, topic)
    confirmed = 0
    room = trio.Event()
    timed = bool(spec.get("confirm_latency"))
    scheduled_at: list[int] = []
    confirm_latencies: list[int] = []
    start = time.perf_counter_ns()

    async def read_confirms() -> None:
        nonlocal confirmed, room
        while confirmed < total:
            events = await raw.read()
            now = time.perf_counter_ns()
            for event in events:
                if type(event) is Confirm:
                    if timed:
                        confirm_latencies.extend(
                            now - scheduled_at[n] for n in range(confirmed, event.count)
                        )
                    confirmed = event.count
                elif isinstance(event, GuaranteesReceived):
                    room.set()
            await raw.flush()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read_confirms)
        async for n, scheduled in schedule(rate, total, lateness):
            payload = STAMP.pack(scheduled, n) + filler
            if timed:
                scheduled_at.append(scheduled)
            while True:
                try:
                    conn.publish(topic, payload)
                    break
                except NoGuarantees:
                    room = trio.Event()
                    await room.wait()
            await raw.flush()
        done = time.perf_counter_ns()
    await raw.close()
    result = published(start, done, topic_name, total, lateness, confirmed=confirmed)
    if timed:
        result["confirm_latencies"] = confirm_latencies
    return result


async def raw_subscribe(spec: dict[str, Any]) -> dict[str, Any]:
    """Subscribe to ``topic``, print ``ready``, then time ``count``
    deliveries (or fewer if ``timeout`` seconds pass first)."""
    count: int = spec["count"]
    raw = await _Raw.open(spec["url"], "bench-raw-sub")
    conn = raw.conn
    topic = conn.bind_topic(spec["topic"])
    await raw.until_confirmed(HandleType.TOPIC, topic)
    handle = conn.subscribe(topic)
    await raw.until_confirmed(HandleType.SUBSCRIPTION, handle)
    print("ready", flush=True)
    arrivals = Arrivals()
    held = HeldAcks[int](conn.policy.ack_delay)  # (the library's rule of holding an Ack)
    window = conn.receiver(Channel(ChannelKind.DELIVER, handle)).capacity
    acked = seq = 0
    with trio.move_on_after(spec.get("timeout", math.inf)):
        while arrivals.received < count:
            events: list[Event] = []
            due = held.earliest()
            with trio.move_on_at(math.inf if due is None else due):
                events = await raw.read()
            now = time.perf_counter_ns()
            size = 0
            for event in events:
                if type(event) is DeliverReceived:
                    arrivals.arrived(event.message.payload, now)
                    seq = event.message.seq
                    size += event.size
                    conn.release(event)
            clock = trio.current_time()
            if size and (
                seq - acked >= RELEASE_BATCH or not held.hold(handle, size, clock, window)
            ):
                held.forget(handle)
                conn.ack(handle, seq)
                acked = seq
            if held.take_due(clock):  # (due, whether this read brought more or not)
                conn.ack(handle, seq)
                acked = seq
            await raw.flush()
    if seq > acked:
        conn.ack(handle, seq)
    await raw.close()
    return arrivals.result()
