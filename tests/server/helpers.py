"""Helpers for the broker's integration tests: a broker on a loopback port
(or on in-memory streams: ``in_memory=True``, see ``memory``), a raw client
that speaks bytes, and checks that a broker is healthy.

Every wait has a deadline: a test that would hang fails instead.
"""

from __future__ import annotations

import itertools
import socket
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress
from typing import Any, TypeVar
from weakref import WeakKeyDictionary

import trio
import trio.lowlevel

from broker.client import Client, open_client
from broker.config import BrokerConfig, KiB
from broker.protocol import (
    DEFAULT_MAX_FRAME,
    PROTOCOL_VERSION,
    SUBSCRIPTION_BINDS,
    TOPIC_BINDS,
    AnnounceDropping,
    BindTopic,
    Channel,
    ChannelKind,
    Goodbye,
    Hello,
    IssueGuarantee,
    Message,
    ProtocolError,
    Subscribe,
    Welcome,
)
from broker.protocol.connection import DELIVER_SLACK
from broker.protocol.frames import FrameDecoder, encode
from broker.server import Broker, ServerConnection, serve_broker
from broker.server.sessions._cluster_records import RecordBucket
from broker.server.storage._kv_state import StateBuckets
from broker.server.storage._replication import RunStreams

from .memory import MemoryListener

#: The safety net of every wait in these tests (seconds).
TIMEOUT = 30.0
#: What one loan costs on top of its bytes (accounts.DEFAULT_EVENT_COST).
EVENT_COST = 128

M = TypeVar("M", bound=Message)


def make_config(**overrides: Any) -> BrokerConfig:
    """A config for tests: a free loopback port, no metrics endpoint, a short drain."""
    settings: dict[str, Any] = {
        "listen": "127.0.0.1:0",
        "metrics_listen": "",
        "shutdown_deadline": 2.0,
    }
    settings.update(overrides)
    return BrokerConfig(**settings)


def url(broker: Broker) -> str:
    host, port = broker.address
    return f"{host}:{port}"


#: The in-memory listener of each broker that serves one (``in_memory``).
_memory_listeners: WeakKeyDictionary[Broker, MemoryListener] = WeakKeyDictionary()


async def open_stream(broker: Broker) -> trio.abc.HalfCloseableStream:
    """A new connection to ``broker``: over its in-memory listener if it has
    one, else TCP to its address."""
    listener = _memory_listeners.get(broker)
    if listener is not None:
        return await listener.connect()
    return await trio.open_tcp_stream(*broker.address)


def connect_client(broker: Broker, **options: Any) -> AbstractAsyncContextManager[Client]:
    """``open_client`` to ``broker`` (``options`` are its own), over memory
    streams to a broker that serves them, else TCP."""
    listener = _memory_listeners.get(broker)
    if listener is not None:
        options.setdefault("open_stream", listener.connect)
    return open_client(url(broker), **options)


@asynccontextmanager
async def running_broker(
    config: BrokerConfig | None = None,
    /,
    *,
    in_memory: bool = False,
    streams: RunStreams | None = None,
    records: RecordBucket | None = None,
    state: StateBuckets | None = None,
    **overrides: Any,
) -> AsyncIterator[Broker]:
    """Serve a broker for the block; shut it down gracefully afterwards and
    fail unless :func:`serve_broker` returns by itself. ``in_memory``: it
    serves a :class:`MemoryListener` instead of a TCP port (connect with
    :func:`connect_client`, :class:`RawClient`). ``streams``: in cluster
    mode over them (see ``run_streams``), and ``records``: the sessions'
    records kept in that bucket too (``state``: the cursors and groups in those)."""
    if config is None:
        config = make_config(**overrides)
    returned = trio.Event()
    listener = MemoryListener() if in_memory else None

    async def serve(*, task_status: trio.TaskStatus[Broker]) -> None:
        listeners = None if listener is None else [listener]
        await serve_broker(
            config,
            listeners=listeners,
            streams=streams,
            records=records,
            state=state,
            task_status=task_status,
        )
        returned.set()

    async with trio.open_nursery() as nursery:
        broker: Broker = await nursery.start(serve)
        if listener is not None:
            _memory_listeners[broker] = listener
        yield broker
        with trio.fail_after(config.shutdown_deadline + TIMEOUT):
            await broker.shutdown()
            await returned.wait()


async def wait_until(condition: Callable[[], bool], *, what: str = "condition") -> None:
    """Poll ``condition`` until it holds; fail after :data:`TIMEOUT` seconds."""
    with trio.move_on_after(TIMEOUT):
        while True:
            if condition():
                return
            await trio.sleep(0.005)
    raise AssertionError(f"timed out after {TIMEOUT}s waiting for {what}")


async def wait_idle(broker: Broker) -> None:
    """Wait until the broker has no connection, no debt, no reserved buffers
    and no topics left: everything it lent or reserved came back."""

    def idle() -> bool:
        return (
            not broker.connections
            and broker.account.debt == 0
            and broker.buffer_reserved == 0
            and not broker.topics
        )

    with trio.move_on_after(TIMEOUT):
        while True:
            if idle():
                return
            await trio.sleep(0.005)
    raise AssertionError(
        f"broker not idle after {TIMEOUT}s: connections={list(broker.connections)} "
        f"debt={broker.account.debt} reserved={broker.buffer_reserved} "
        f"topics={sorted(broker.topics)[:5]}"
    )


async def wait_subscribed(broker: Broker, topic: str, count: int = 1) -> None:
    """Wait until the broker routes ``topic`` to ``count`` subscriptions.

    ``Client.subscribe`` returns once its Subscribe is certain to be
    processed, which can be before the broker has even read it; a test that
    publishes from another connection waits for the broker first.
    """

    def subscribed() -> bool:
        found = broker.topics.get(topic)
        return found is not None and len(found.subscriptions) == count

    await wait_until(subscribed, what=f"{count} subscription(s) to {topic!r}")


_probes = itertools.count()


async def assert_round_trip(broker: Broker, *, topic: str = "probe") -> None:
    """A fresh publisher and subscriber exchange a message through ``broker``."""
    payload = f"probe-{next(_probes)}".encode()
    with trio.fail_after(TIMEOUT):
        async with (
            open_client(url(broker), name="probe-sub") as subscriber,
            open_client(url(broker), name="probe-pub") as publisher,
            subscriber.subscribe(topic) as subscription,
        ):
            await wait_subscribed(broker, topic)
            await publisher.publish(topic, payload, key=b"k")
            message = await subscription.receive()
            assert message.payload == payload
            assert message.key == b"k"


def cut_links(owner: Broker) -> int:
    """Cut the owner's side of every link connection to it; how many."""
    cut = 0
    for connection in list(owner.connections.values()):
        if connection.peer == "link":
            stream = connection.stream
            assert isinstance(stream, trio.SocketStream)
            stream.socket.shutdown(socket.SHUT_RDWR)
            cut += 1
    return cut


def connection_named(broker: Broker, client: str) -> ServerConnection:
    """The broker's connection whose Hello named ``client``."""
    matches = [c for c in broker.connections.values() if c.client_name == client]
    assert len(matches) == 1, f"{len(matches)} connections from {client!r}"
    return matches[0]


def newest_connection(broker: Broker) -> ServerConnection:
    assert broker.connections, "the broker has no connection"
    return broker.connections[max(broker.connections)]


def numbered(index: int, size: int = 1000) -> bytes:
    """A payload of ``size`` bytes that starts with ``index``."""
    return index.to_bytes(4, "big") + b"p" * (size - 4)


def number_of(payload: bytes) -> int:
    return int.from_bytes(payload[:4], "big")


def frame_ends(frames: Iterable[bytes]) -> list[int]:
    """The end position of each frame in a channel's byte stream."""
    return list(itertools.accumulate(len(frame) for frame in frames))


class RawClient:
    """A connection (TCP, or in memory) that sends arbitrary bytes and
    decodes what comes back.

    Frames from the broker are collected in :attr:`frames`, in order. Reading
    happens on demand (:meth:`wait_for`, :meth:`read_until_eof`) or, after
    :meth:`start_reading`, in a background task.
    """

    def __init__(self, stream: trio.abc.HalfCloseableStream, *, max_frame: int) -> None:
        self.stream = stream
        self.decoder = FrameDecoder(max_frame=max_frame + DELIVER_SLACK)
        self.frames: list[Message] = []
        self.eof = False
        #: The connection was reset instead of closed (it still counts as EOF).
        self.reset = False
        #: A frame from the broker that does not decode (a broker bug).
        self.decode_error: ProtocolError | None = None
        self.bytes_sent = 0
        self._changed = trio.Event()
        self._background = False

    @classmethod
    async def connect(cls, broker: Broker, *, max_frame: int | None = None) -> RawClient:
        with trio.fail_after(TIMEOUT):
            stream = await open_stream(broker)
        return cls(stream, max_frame=max_frame or max(broker.config.max_frame, DEFAULT_MAX_FRAME))

    # ---------------------------------------------------------------- sending

    async def send(self, *items: Message | bytes) -> None:
        """Send messages (encoded) and raw bytes, in order, as one write."""
        data = b"".join(item if isinstance(item, bytes) else encode(item) for item in items)
        with trio.fail_after(TIMEOUT):
            await self.stream.send_all(data)
        self.bytes_sent += len(data)

    async def hello(self, name: str = "raw", *, session: bytes | None = None) -> None:
        await self.send(Hello(PROTOCOL_VERSION, name, session, {}))

    async def handshake(self, name: str = "raw") -> Welcome:
        """Hello, then wait for Welcome and the bind channels' first guarantees."""
        await self.hello(name)
        welcome = await self.wait_for_message(Welcome)
        await self.wait_for_guarantee(TOPIC_BINDS)
        await self.wait_for_guarantee(SUBSCRIPTION_BINDS)
        return welcome

    async def aclose(self) -> None:
        """Close at once (unread data makes the kernel reset the connection)."""
        with trio.CancelScope(shield=True):
            await self.stream.aclose()

    async def close_gracefully(self) -> None:
        """Half-close, read until the broker closes too, then close: no reset."""
        with trio.fail_after(TIMEOUT):
            with suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await self.stream.send_eof()
            while not self.eof:
                await self._more()
        await self.aclose()

    # ---------------------------------------------------------------- receiving

    async def _read_once(self) -> None:
        try:
            data = await self.stream.receive_some(1 << 16)
        except trio.BrokenResourceError:
            self.reset = True
            data = b""
        except trio.ClosedResourceError:
            data = b""
        if not data:
            self.eof = True
        else:
            self.decoder.feed(data)
            try:
                self.frames.extend(message for message, _ in self.decoder.messages())
            except ProtocolError as error:
                self.decode_error = error
                self.eof = True
        self._changed.set()
        self._changed = trio.Event()

    async def _reader(self) -> None:
        while not self.eof:
            await self._read_once()

    def start_reading(self, nursery: trio.Nursery) -> None:
        """Read in a background task from now on (until EOF)."""
        self._background = True
        nursery.start_soon(self._reader)

    async def _more(self) -> None:
        if self._background:
            await self._changed.wait()
        else:
            await self._read_once()

    async def wait_for(
        self,
        predicate: Callable[[Message], bool],
        *,
        what: str = "a frame",
    ) -> Message:
        """The first frame received so far or later that matches ``predicate``
        (fails after :data:`TIMEOUT` seconds)."""
        with trio.move_on_after(TIMEOUT):
            seen = 0
            while True:
                for message in self.frames[seen:]:
                    if predicate(message):
                        return message
                seen = len(self.frames)
                if self.eof:
                    break
                await self._more()
        raise AssertionError(f"no {what} after {TIMEOUT}s (eof={self.eof}): {self.summary()}")

    async def wait_for_message(self, kind: type[M]) -> M:
        message = await self.wait_for(lambda m: isinstance(m, kind), what=kind.__name__)
        assert isinstance(message, kind)
        return message

    async def wait_for_guarantee(self, channel: Channel) -> IssueGuarantee:
        """The first IssueGuarantee on ``channel`` (received so far or later)."""

        def on_channel(message: Message) -> bool:
            return isinstance(message, IssueGuarantee) and message.channel == channel

        message = await self.wait_for(on_channel, what=f"guarantees on {channel}")
        assert isinstance(message, IssueGuarantee)
        return message

    async def read_until_eof(self) -> list[Message]:
        """Everything the broker sends until it closes the connection (fails
        after :data:`TIMEOUT` seconds)."""
        with trio.move_on_after(TIMEOUT):
            while not self.eof:
                await self._more()
            return self.frames
        raise AssertionError(f"the broker did not close within {TIMEOUT}s: {self.summary()}")

    # ---------------------------------------------------------------- inspecting

    def goodbyes(self) -> list[Goodbye]:
        return [m for m in self.frames if isinstance(m, Goodbye)]

    def goodbye_code(self) -> int | None:
        """The code of the (only) Goodbye received, None if there was none."""
        goodbyes = self.goodbyes()
        assert len(goodbyes) <= 1, f"more than one Goodbye: {goodbyes}"
        return goodbyes[0].code if goodbyes else None

    def guarantees(self, channel: Channel, *, before: Message | None = None) -> int:
        """Guarantee bytes issued on ``channel`` (optionally: before frame ``before``)."""
        total = 0
        for message in self.frames:
            if message is before:
                break
            if isinstance(message, IssueGuarantee) and message.channel == channel:
                total += message.amount
        return total

    def announcements(self, channel: Channel) -> list[AnnounceDropping]:
        return [m for m in self.frames if isinstance(m, AnnounceDropping) and m.channel == channel]

    def summary(self, limit: int = 12) -> str:
        shown = [type(m).__name__ for m in self.frames[-limit:]]
        return f"{len(self.frames)} frames, last: {shown}"


@asynccontextmanager
async def raw_client(broker: Broker, *, background: bool = False) -> AsyncIterator[RawClient]:
    """A :class:`RawClient` for the block (reading in the background if asked)."""
    client = await RawClient.connect(broker)
    try:
        if background:
            async with trio.open_nursery() as nursery:
                client.start_reading(nursery)
                try:
                    yield client
                finally:
                    nursery.cancel_scope.cancel()
        else:
            yield client
    finally:
        await client.aclose()


# ==================================================================== slow consumers

#: Small budgets for a subscriber that never reads: the publisher's channel
#: blocks at 64 KiB of debt, long before the connection backstop.
DEAF_CONFIG: dict[str, Any] = {
    "max_frame": 4 * KiB,
    "publish_capacity": 16 * KiB,
    "channel_high_watermark": 64 * KiB,
    "channel_low_watermark": 32 * KiB,
    "connection_high_watermark": 256 * KiB,
    "connection_low_watermark": 128 * KiB,
    "max_unsent": 64 * KiB,
}


async def subscribe_deaf(client: RawClient, grant: int) -> None:
    """Hello, bind topic "busy" and subscribe to it (granting ``grant`` bytes
    of deliveries if not 0), then read nothing more."""
    await client.handshake("deaf")
    messages: list[Message] = [BindTopic("busy"), Subscribe(0, "reliable", {})]
    if grant:
        messages.append(IssueGuarantee(Channel(ChannelKind.DELIVER, 0), grant))
    await client.send(*messages)


async def publish_until_throttled(
    client: Client, topic: str, payload: bytes, *, limit: int = 20_000
) -> int:
    """Publish without waiting until the broker says it withholds guarantees
    on ``topic`` (the client's first topic), spend the guarantees left, then
    check that a publish waits. Returns how many publishes went through."""
    channel = Channel(ChannelKind.PUBLISH, 0)
    sent = 0
    with trio.fail_after(15):
        while channel not in client.throttled:
            assert sent < limit, "the publisher was never throttled"
            try:
                client.publish_nowait(topic, payload)
                sent += 1
            except trio.WouldBlock:
                await trio.sleep(0.001)
            if sent % 32 == 0:
                await trio.lowlevel.checkpoint()
        # What was granted before the throttle may still be spent...
        spare = 0
        while True:
            try:
                client.publish_nowait(topic, payload)
            except trio.WouldBlock:
                break
            spare += 1
            await trio.lowlevel.checkpoint()
    assert spare * len(payload) <= DEAF_CONFIG["publish_capacity"]
    # ...and then publishing waits: nothing more is granted.
    with trio.move_on_after(0.3) as waited:
        await client.publish(topic, payload)
    assert waited.cancelled_caught, "a publish got through to a throttled channel"
    return sent + spare


async def read_range(client: Client, topic: str, start: int, end: int) -> list[bytes]:
    """The records of ``topic`` from offset ``start`` up to ``end``."""
    got: list[bytes] = []
    if end <= start:
        return got
    async with client.subscribe(topic, start=start) as subscription:
        while True:
            message = await subscription.receive()
            got.append(message.payload)
            assert message.offset is not None
            if message.offset >= end - 1:
                return got
