"""The trio driver of the NATS protocol: :func:`open_nats` and :class:`NatsClient`.

One sans-IO :class:`~broker.nats._protocol.NatsConnection` lives as long as
the client; each transport is served by three tasks: a reader (bytes to
events, events to subscriptions and waiting requests), a writer that sends
everything queued meanwhile in one ``send_all`` (publishing only appends
to a buffer and wakes it), and a keepalive at the protocol's deadline.
When the transport breaks, a supervisor task connects again across the
server list (those given, then those the servers' INFO named), waiting as
:class:`~broker.backoff.Backoff` says (full jitter), and the protocol sends
every subscription again before the output that waited.

Bounds. The output the application queued and the writer has not taken
(publishes and requests) is at most ``max_pending_bytes`` plus one
message: past it :meth:`NatsClient.publish` and :meth:`NatsClient.request`
wait (while connected, for the writer; while reconnecting, for the
reconnection) and :meth:`NatsClient.publish_nowait` and
:meth:`NatsClient.start_request` raise ``trio.WouldBlock``. What was queued
while disconnected is sent after the next handshake, in order. A subscription buffers at most
``max_pending_msgs`` messages and ``max_pending_bytes`` bytes; past them
new messages are dropped and counted (NATS's slow-consumer rule: the
reader never waits for one subscriber, so one slow subscriber cannot stall
the others or the replies), and the subscription's next receive raises
:class:`~broker.nats.SlowConsumer` once, with the count, before going on.

Requests share one subscription, ``<inbox_prefix>.<random>.*``; each gets a
token of its own. A request whose connection breaks before its reply fails
with :class:`~broker.nats.ConnectionLost` (retryable); a 503 gives
:class:`~broker.nats.NoResponders`.

Why not :class:`broker.pump.Pump`: it is typed to and reads the state of
:class:`broker.protocol.Connection` (``closed``, ``bytes_to_send``,
``next_deadline``, ``frames_waiting``); its fast socket path comes from the
server's transport package, which a client may not import. The NATS driver
keeps its three loops (a few lines each) and uses the pump's :class:`Signal`.
"""

from __future__ import annotations

import contextlib
import secrets
import ssl
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import trio

from broker.backoff import Backoff
from broker.errors import sole_exception
from broker.pump import Signal

from ._errors import (
    ConnectError,
    ConnectionClosed,
    ConnectionLost,
    NatsError,
    NoResponders,
    RequestTimeout,
    SlowConsumer,
)
from ._headers import Headers
from ._protocol import (
    Connected,
    ConnectOptions,
    Event,
    InfoReceived,
    Msg,
    NatsConnection,
    Pong,
    ProtocolViolation,
    ServerError,
    StaleConnection,
    State,
)

__all__ = [
    "DEFAULT_PORT",
    "NatsClient",
    "NatsStatistics",
    "PendingReply",
    "Subscription",
    "SubscriptionStatistics",
    "open_nats",
]

DEFAULT_PORT = 4222
#: Bytes asked of the stream per read.
RECEIVE_SIZE = 64 * 1024
#: publish() yields at least once per this many calls that did not wait.
PUBLISHES_PER_YIELD = 64


# ===================================================================== servers


@dataclass(frozen=True, slots=True)
class _Server:
    host: str
    port: int
    tls: bool = False
    user: str | None = None
    password: str | None = None
    token: str | None = None

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'tls' if self.tls else 'nats'}://{host}:{self.port}"


def _parse_server(url: str) -> _Server:
    """``nats://[user:pass@|token@]host[:port]``, ``tls://...`` or ``host[:port]``."""
    text = url.strip()
    if "://" not in text:
        text = "nats://" + text
    parts = urlsplit(text)
    if parts.scheme not in ("nats", "tls") or not parts.hostname:
        raise ValueError(f"not a NATS server address: {url!r} (nats://HOST:PORT or tls://...)")
    try:
        port = parts.port or DEFAULT_PORT
    except ValueError:
        raise ValueError(f"not a NATS server address: {url!r} (a bad port)") from None
    user = password = token = None
    if parts.username is not None:
        if parts.password is not None:
            user, password = unquote(parts.username), unquote(parts.password)
        else:
            token = unquote(parts.username)
    return _Server(parts.hostname, port, parts.scheme == "tls", user, password, token)


class _Pool:
    """The servers to try, in turn: those given, then those INFO named."""

    def __init__(self, servers: list[_Server]) -> None:
        self.servers = servers
        self.next_index = 0

    def take(self) -> _Server:
        server = self.servers[self.next_index % len(self.servers)]
        self.next_index = (self.next_index + 1) % len(self.servers)
        return server

    def learn(self, urls: object, like: _Server) -> None:
        if not isinstance(urls, list):
            return
        known = {(server.host, server.port) for server in self.servers}
        for url in urls:
            if not isinstance(url, str):
                continue
            try:
                found = _parse_server(url)
            except ValueError:
                continue
            if (found.host, found.port) not in known:
                known.add((found.host, found.port))
                self.servers.append(
                    _Server(found.host, found.port, like.tls, like.user, like.password, like.token)
                )


# ============================================================= subscriptions


@dataclass(slots=True)
class SubscriptionStatistics:
    """A subscription's counts: messages and bytes waiting to be received,
    messages received in all, and dropped because it did not keep up."""

    pending_msgs: int
    pending_bytes: int
    delivered: int
    dropped: int


class Subscription:
    """The messages of one subscription, in order, bounded (see the module):
    ``async for msg in sub``, :meth:`receive`, :meth:`receive_nowait`.
    Ends (``trio.EndOfChannel`` from :meth:`receive`) once unsubscribed, or
    once ``max_msgs`` came, and its buffer is empty."""

    def __init__(
        self,
        client: NatsClient,
        sid: int,
        subject: str,
        queue: str | None,
        max_pending_msgs: int,
        max_pending_bytes: int,
    ) -> None:
        self.subject = subject
        self.queue = queue
        self.sid = sid
        self._client = client
        self._messages: deque[Msg] = deque()
        self._bytes = 0
        self._max_msgs = max_pending_msgs
        self._max_bytes = max_pending_bytes
        self._lot = trio.lowlevel.ParkingLot()
        self._delivered = 0
        self._dropped = 0
        self._unreported = 0
        self._limit: int | None = None
        self._ended = False

    def _deliver(self, msg: Msg) -> None:
        """(the reader) Keep ``msg``, or drop it if the buffer is full."""
        self._delivered += 1
        size = len(msg.payload)
        if len(self._messages) >= self._max_msgs or self._bytes + size > self._max_bytes:
            self._dropped += 1
            self._unreported += 1
        else:
            self._messages.append(msg)
            self._bytes += size
        if self._limit is not None and self._delivered >= self._limit:
            self._end()
        if self._lot:
            self._lot.unpark()

    def _end(self) -> None:
        self._ended = True
        self._client._subs.pop(self.sid, None)
        self._lot.unpark_all()

    def receive_nowait(self) -> Msg:
        """The next message; ``trio.WouldBlock`` if none is waiting,
        ``trio.EndOfChannel`` once the subscription ended and all were
        received, :class:`SlowConsumer` once after messages were dropped."""
        if self._unreported:
            dropped, self._unreported = self._unreported, 0
            raise SlowConsumer(self.subject, dropped)
        if self._messages:
            msg = self._messages.popleft()
            self._bytes -= len(msg.payload)
            return msg
        if self._ended:
            raise trio.EndOfChannel
        if self._client._closed:
            raise ConnectionClosed("the NATS client is closed")
        raise trio.WouldBlock

    async def receive(self) -> Msg:
        """The next message, waiting for it (see :meth:`receive_nowait`)."""
        await trio.lowlevel.checkpoint_if_cancelled()
        while True:
            try:
                msg = self.receive_nowait()
            except trio.WouldBlock:
                await self._lot.park()
            else:
                await trio.lowlevel.cancel_shielded_checkpoint()
                return msg

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Msg:
        try:
            return await self.receive()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None

    def unsubscribe(self, max_msgs: int | None = None) -> None:
        """Stop now (what is buffered can still be received), or once
        ``max_msgs`` messages came in all."""
        if self._ended:
            return
        client = self._client
        if max_msgs is not None and self._delivered < max_msgs:
            self._limit = max_msgs
            client._core.unsubscribe(self.sid, max_msgs)
        else:
            client._core.unsubscribe(self.sid)
            self._end()
        client._wake.set()

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.unsubscribe()

    def statistics(self) -> SubscriptionStatistics:
        """Its counts now."""
        return SubscriptionStatistics(
            len(self._messages), self._bytes, self._delivered, self._dropped
        )


# ================================================================ replies


class _Waiter:
    """What a reply token is waiting for: one reply (a request), or more."""

    __slots__ = ("error", "event", "generation", "msg")

    def __init__(self) -> None:
        self.event = trio.Event()
        self.msg: Msg | None = None
        self.error: NatsError | None = None
        #: The connection it was sent on (numbered; set when sent).
        self.generation = 0

    def deliver(self, msg: Msg) -> bool:
        """Take a reply; True when nothing more is awaited."""
        self.msg = msg
        self.event.set()
        return True

    def fail(self, error: NatsError) -> None:
        if self.error is None:
            self.error = error
        self.event.set()


class PendingReply:
    """A request in flight (from :meth:`NatsClient.start_request`): many can
    be in flight at once; :meth:`wait` for the reply."""

    __slots__ = ("_client", "_key", "_waiter", "subject")

    def __init__(self, client: NatsClient, subject: str, key: str | int, waiter: _Waiter) -> None:
        self._client = client
        self.subject = subject
        self._key = key
        self._waiter = waiter

    def done(self) -> bool:
        """Whether the reply (or a failure) came."""
        return self._waiter.event.is_set()

    async def wait(self, timeout: float) -> Msg:  # noqa: ASYNC109 (a NATS answer, below)
        """The reply; :class:`RequestTimeout` after ``timeout`` seconds (from
        this call), :class:`NoResponders` on a 503, :class:`ConnectionLost`
        if the connection broke first. The token is released in any case."""
        waiter = self._waiter
        try:
            if waiter.event.is_set():  # (no cancel scope for an answer already in)
                await trio.lowlevel.checkpoint()
            else:
                with trio.move_on_after(timeout):
                    await waiter.event.wait()
        finally:
            self.cancel()
        if waiter.error is not None:
            raise waiter.error
        msg = waiter.msg
        if msg is None:
            raise RequestTimeout(self.subject, timeout)
        if msg.headers is not None and msg.headers.status == 503 and not msg.payload:
            raise NoResponders(self.subject)
        return msg

    def cancel(self) -> None:
        """Stop waiting: a reply that comes later is dropped."""
        self._client._release(self._key)


class _Flush:
    __slots__ = ("error", "event")

    def __init__(self) -> None:
        self.event = trio.Event()
        self.error: NatsError | None = None


# =================================================================== client


@dataclass(slots=True)
class NatsStatistics:
    """The client's counts: messages and bytes in and out, reconnections,
    output waiting, subscriptions, requests in flight, where it is connected
    (``""`` while not) and the last error the server or a connection attempt gave."""

    in_msgs: int
    out_msgs: int
    in_bytes: int
    out_bytes: int
    reconnects: int
    pending_bytes: int
    subscriptions: int
    requests_in_flight: int
    connected_url: str
    state: str
    last_error: str


class NatsClient:
    """A NATS client on trio (see :func:`open_nats`)."""

    def __init__(
        self,
        servers: list[_Server],
        *,
        name: str | None,
        user: str | None,
        password: str | None,
        token: str | None,
        tls: ssl.SSLContext | None,
        tls_hostname: str | None,
        connect_timeout: float,
        reconnect: bool,
        max_reconnect_attempts: int | None,
        backoff: Backoff,
        ping_interval: float,
        max_outstanding_pings: int,
        max_pending_bytes: int,
        inbox_prefix: str,
    ) -> None:
        self._pool = _Pool(servers)
        self._name = name
        self._user = user
        self._password = password
        self._token = token
        self._tls = tls
        self._tls_hostname = tls_hostname
        self._connect_timeout = connect_timeout
        self._reconnect = reconnect
        self._max_reconnect_attempts = max_reconnect_attempts
        self._backoff = backoff
        self._max_pending = max_pending_bytes
        self._core = NatsConnection(
            ping_interval=ping_interval, max_outstanding_pings=max_outstanding_pings
        )
        self._wake = Signal()
        #: Publishers waiting for room, callers waiting for the connection.
        self._room = trio.lowlevel.ParkingLot()
        self._subs: dict[int, Subscription] = {}
        self._inbox = f"{inbox_prefix}.{_nuid()}."
        self._inbox_sid = 0
        #: Requests waiting on the shared inbox, by token.
        self._replies: dict[str, _Waiter] = {}
        #: Requests with an inbox of their own (more than one reply), by sid.
        self._collectors: dict[int, _Waiter] = {}
        self._next_token = 0
        self._generation = 0
        self._closed = False
        self._since_yield = 0
        self._server: _Server | None = None
        self._in_msgs = 0
        self._out_msgs = 0
        self._in_bytes = 0
        self._out_bytes = 0
        self._reconnects = 0
        self._last_error = ""

    # ------------------------------------------------------------ the API

    @property
    def connected(self) -> bool:
        """Whether a connection is up and past its handshake."""
        return self._core.state is State.CONNECTED

    @property
    def server_info(self) -> dict[str, Any]:
        """The last INFO of the server (``max_payload``, ``version``, ``jetstream``, ...)."""
        return self._core.info

    @property
    def max_payload(self) -> int:
        """The largest message (headers included) the server takes."""
        return self._core.max_payload

    def publish_nowait(
        self,
        subject: str,
        payload: bytes | bytearray | memoryview = b"",
        headers: Headers | None = None,
        reply: str | None = None,
    ) -> None:
        """Queue a message for the writer (the next write sends it with all
        that was queued meanwhile). ``trio.WouldBlock`` if the output holds
        ``max_pending_bytes`` already; :class:`ConnectionClosed` once closed;
        :class:`PayloadTooLarge` or a ValueError (a bad subject) send nothing."""
        if self._closed:
            raise ConnectionClosed("the NATS client is closed")
        core = self._core
        if core.pending_bytes >= self._max_pending:
            raise trio.WouldBlock
        core.publish(subject, payload, reply, headers)
        self._out_msgs += 1
        self._wake.set()

    async def publish(
        self,
        subject: str,
        payload: bytes | bytearray | memoryview = b"",
        headers: Headers | None = None,
        reply: str | None = None,
    ) -> None:
        """Queue a message, waiting while the output is full (see the
        module); yields at least once per ``PUBLISHES_PER_YIELD`` calls so
        that the writer can send them together. NATS core publishes are
        at most once: :meth:`flush` says when the server has them."""
        await trio.lowlevel.checkpoint_if_cancelled()
        if self._core.pending_bytes >= self._max_pending:
            await self.wait_for_room()
        self.publish_nowait(subject, payload, headers, reply)
        self._since_yield += 1
        if self._since_yield >= PUBLISHES_PER_YIELD:
            self._since_yield = 0
            await trio.lowlevel.cancel_shielded_checkpoint()

    async def wait_for_room(self) -> None:
        """Until the output is below ``max_pending_bytes`` (or the client closed)."""
        await trio.lowlevel.checkpoint_if_cancelled()
        while self._core.pending_bytes >= self._max_pending and not self._closed:
            self._since_yield = 0
            await self._room.park()

    def subscribe(
        self,
        subject: str,
        queue: str | None = None,
        *,
        max_pending_msgs: int = 65536,
        max_pending_bytes: int = 64 * 1024 * 1024,
    ) -> Subscription:
        """Subscribe to ``subject`` (wildcards allowed), in queue group
        ``queue`` if given; kept across reconnections. The server has it once
        a :meth:`flush` after this returned. Use as a context manager (or
        call ``unsubscribe``) to end it."""
        if self._closed:
            raise ConnectionClosed("the NATS client is closed")
        sid = self._core.subscribe(subject, queue)
        sub = Subscription(self, sid, subject, queue, max_pending_msgs, max_pending_bytes)
        self._subs[sid] = sub
        self._wake.set()
        return sub

    def new_inbox(self) -> str:
        """A subject nobody else uses (for replies of one's own subscription)."""
        return "_INBOX." + _nuid()

    def start_request(
        self,
        subject: str,
        payload: bytes | bytearray | memoryview = b"",
        headers: Headers | None = None,
    ) -> PendingReply:
        """Publish a request now and return its :class:`PendingReply`;
        ``trio.WouldBlock`` if the output is full (as :meth:`publish_nowait`)."""
        if self._closed:
            raise ConnectionClosed("the NATS client is closed")
        core = self._core
        if core.pending_bytes >= self._max_pending:
            raise trio.WouldBlock
        if not self._inbox_sid:
            self._inbox_sid = core.subscribe(self._inbox + "*")
        self._next_token += 1
        token = str(self._next_token)
        core.publish(subject, payload, self._inbox + token, headers)
        self._out_msgs += 1
        waiter = _Waiter()
        waiter.generation = self._generation
        self._replies[token] = waiter
        self._wake.set()
        return PendingReply(self, subject, token, waiter)

    def start_collect(
        self,
        subject: str,
        payload: bytes | bytearray | memoryview,
        waiter: _Waiter,
    ) -> PendingReply:
        """Publish a request whose replies go to an inbox of its own (they
        may come under other subjects, as a pull consumer's do), each given
        to ``waiter`` until it says it is done; ``trio.WouldBlock`` if the
        output is full."""
        if self._closed:
            raise ConnectionClosed("the NATS client is closed")
        core = self._core
        if core.pending_bytes >= self._max_pending:
            raise trio.WouldBlock
        inbox = self.new_inbox()
        sid = core.subscribe(inbox)
        try:
            core.publish(subject, payload, inbox)
        except BaseException:
            core.unsubscribe(sid)
            raise
        self._out_msgs += 1
        waiter.generation = self._generation
        self._collectors[sid] = waiter
        self._wake.set()
        return PendingReply(self, subject, sid, waiter)

    async def request(
        self,
        subject: str,
        payload: bytes | bytearray | memoryview = b"",
        headers: Headers | None = None,
        *,
        timeout: float = 5.0,  # noqa: ASYNC109 (a NATS answer, below)
    ) -> Msg:
        """Publish a request and return its first reply (see
        :meth:`PendingReply.wait` for the errors). A request's ``timeout`` is
        one of its answers (:class:`RequestTimeout`, handled like
        :class:`NoResponders`), not a cancellation: hence a parameter."""
        await self.wait_for_room()
        return await self.start_request(subject, payload, headers).wait(timeout)

    async def flush(self) -> None:
        """Until the server has handled everything queued before this call
        (a PING's PONG; across a reconnection, on the new connection).
        :class:`ConnectionLost` if the connection broke after sending it.
        Bound the wait with ``trio.fail_after``."""
        if self._closed:
            raise ConnectionClosed("the NATS client is closed")
        flush = _Flush()
        self._core.ping(flush)
        self._wake.set()
        await flush.event.wait()
        if flush.error is not None:
            raise flush.error

    def statistics(self) -> NatsStatistics:
        """The client's counts now."""
        server = self._server
        return NatsStatistics(
            in_msgs=self._in_msgs,
            out_msgs=self._out_msgs,
            in_bytes=self._in_bytes,
            out_bytes=self._out_bytes,
            reconnects=self._reconnects,
            pending_bytes=self._core.pending_bytes,
            subscriptions=len(self._subs),
            requests_in_flight=len(self._replies) + len(self._collectors),
            connected_url=server.address if server is not None and self.connected else "",
            state=self._core.state.value,
            last_error=self._last_error,
        )

    @property
    def servers(self) -> list[str]:
        """The servers it may connect to: those given, then those learned."""
        return [server.address for server in self._pool.servers]

    # ------------------------------------------------------------ events

    def _handle(self, events: list[Event]) -> str | None:
        """Dispatch ``events``; why the connection must end, if it must."""
        subs = self._subs
        inbox_sid = self._inbox_sid
        for event in events:
            if type(event) is Msg:
                self._in_msgs += 1
                if event.sid == inbox_sid:
                    self._reply(event)
                else:
                    sub = subs.get(event.sid)
                    if sub is not None:
                        sub._deliver(event)
                    elif self._collectors:
                        waiter = self._collectors.get(event.sid)
                        if waiter is not None and waiter.deliver(event):
                            self._release(event.sid)
            elif isinstance(event, Pong):
                token = event.token
                if isinstance(token, _Flush):
                    token.event.set()
            elif isinstance(event, InfoReceived):
                if self._server is not None:
                    self._pool.learn(event.info.get("connect_urls"), self._server)
            elif isinstance(event, Connected):
                self._room.unpark_all()
            elif isinstance(event, ServerError):
                self._last_error = f"server error: {event.message}"
                if event.fatal:
                    return self._last_error
            elif isinstance(event, ProtocolViolation):
                self._last_error = f"protocol violation: {event.reason}"
                return self._last_error
            elif isinstance(event, StaleConnection):
                self._last_error = f"stale connection: {event.outstanding} PINGs unanswered"
                return self._last_error
        return None

    def _release(self, key: str | int) -> None:
        """Forget a request (and end its own inbox's subscription)."""
        if isinstance(key, str):
            self._replies.pop(key, None)
        elif self._collectors.pop(key, None) is not None:
            self._core.unsubscribe(key)
            self._wake.set()

    def _reply(self, msg: Msg) -> None:
        token = msg.subject[len(self._inbox) :]
        waiter = self._replies.get(token)
        if waiter is not None and waiter.deliver(msg):
            del self._replies[token]

    # ------------------------------------------------------------ connecting

    async def _open(self, server: _Server) -> trio.abc.Stream:
        """A connection to ``server`` past its handshake (a
        ``trio.TooSlowError`` after ``connect_timeout``, OSError, or
        :class:`ConnectError` if the server refused the CONNECT)."""
        core = self._core
        with trio.fail_after(self._connect_timeout):
            stream: trio.abc.Stream = await trio.open_tcp_stream(server.host, server.port)
            try:
                self._server = server
                core.connection_made()
                await self._read_until(stream, lambda: core.state is State.HANDSHAKE)
                tls = self._tls is not None or server.tls or bool(core.info.get("tls_required"))
                if tls:
                    context = self._tls or ssl.create_default_context()
                    secure = trio.SSLStream(
                        stream, context, server_hostname=self._tls_hostname or server.host
                    )
                    stream = secure
                    await secure.do_handshake()
                options = ConnectOptions(
                    name=self._name,
                    user=self._user if self._user is not None else server.user,
                    password=self._password if self._password is not None else server.password,
                    token=self._token if self._token is not None else server.token,
                    tls_required=tls,
                )
                core.connect(options, trio.current_time())
                await self._read_until(stream, lambda: core.state is State.CONNECTED)
            except BaseException:
                core.connection_lost()
                await trio.aclose_forcefully(stream)
                raise
        return stream

    async def _read_until(self, stream: trio.abc.Stream, done: Callable[[], bool]) -> None:
        core = self._core
        while not done():
            data = core.data_to_send()
            if data:
                await stream.send_all(data)
            received = await stream.receive_some(RECEIVE_SIZE)
            if not received:
                raise ConnectError("the server closed the connection during the handshake")
            self._in_bytes += len(received)
            why = self._handle(core.receive_data(received))
            if why is not None:
                raise ConnectError(why)

    async def _first_connect(self) -> trio.abc.Stream:
        """A connection to the first server of the list that takes one
        (each tried once), else :class:`ConnectError` naming why each failed."""
        failures = []
        for server in list(self._pool.servers):
            try:
                stream = await self._open(server)
            except (OSError, trio.TooSlowError, trio.BrokenResourceError, ConnectError) as error:
                failures.append(f"{server.address}: {_why(error, self._connect_timeout)}")
                continue
            self._pool.next_index = self._pool.servers.index(server) + 1
            return stream
        raise ConnectError("cannot connect to NATS: " + "; ".join(failures))

    async def _reconnect_loop(self) -> trio.abc.Stream | None:
        """A new connection, trying the servers in turn with backoff; None if
        the client is closing or ``max_reconnect_attempts`` failed."""
        attempts = 0
        while not self._closed:
            most = self._max_reconnect_attempts
            if most is not None and attempts >= most:
                return None
            await trio.sleep(self._backoff.next())
            server = self._pool.take()
            attempts += 1
            try:
                stream = await self._open(server)
            except (OSError, trio.TooSlowError, trio.BrokenResourceError, ConnectError) as error:
                self._last_error = f"{server.address}: {_why(error, self._connect_timeout)}"
                continue
            self._backoff.reset()
            self._reconnects += 1
            return stream
        return None

    # ------------------------------------------------------------ running

    async def _supervise(self, stream: trio.abc.Stream) -> None:
        """Serve connections until the client closes or gives up."""
        current: trio.abc.Stream | None = stream
        try:
            while current is not None:
                self._wake.set()  # (what waited for the connection)
                self._room.unpark_all()
                why = await self._serve(current)
                await trio.aclose_forcefully(current)
                current = None
                self._lost(ConnectionLost(f"connection to NATS lost: {why}"))
                if self._closed or not self._reconnect:
                    break
                current = await self._reconnect_loop()
        finally:
            if current is not None:
                await trio.aclose_forcefully(current)
            self._close(ConnectionClosed(f"NATS client closed: {self._last_error or 'closed'}"))

    def _lost(self, error: NatsError) -> None:
        """The connection is gone: fail what was sent on it and awaits an answer."""
        for token in self._core.connection_lost():
            if isinstance(token, _Flush):
                token.error = error
                token.event.set()
        generation = self._generation
        self._generation += 1
        for key, waiter in list(self._replies.items()):
            if waiter.generation <= generation:
                del self._replies[key]
                waiter.fail(error)
        for sid, waiter in list(self._collectors.items()):
            if waiter.generation <= generation:
                self._release(sid)
                waiter.fail(error)

    def _close(self, error: NatsError) -> None:
        """No more connections: everything waiting fails with ``error``."""
        self._closed = True
        for token in self._core.close():
            if isinstance(token, _Flush):
                token.error = error
                token.event.set()
        for waiter in [*self._replies.values(), *self._collectors.values()]:
            waiter.fail(error)
        self._replies.clear()
        self._collectors.clear()
        for sub in list(self._subs.values()):
            sub._lot.unpark_all()
        self._room.unpark_all()

    async def _serve(self, stream: trio.abc.Stream) -> str:
        """Run one connection's reader, writer and keepalive; why it ended."""
        reason = ""

        async def run(task: Callable[[trio.abc.Stream], Any], scope: trio.CancelScope) -> None:
            nonlocal reason
            why = await task(stream)
            if not reason:
                reason = why
            scope.cancel()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run, self._reader, nursery.cancel_scope)
            nursery.start_soon(run, self._writer, nursery.cancel_scope)
            nursery.start_soon(run, self._keepalive, nursery.cancel_scope)
        return reason or "closed"

    async def _reader(self, stream: trio.abc.Stream) -> str:
        core = self._core
        wake = self._wake
        while True:
            try:
                data = await stream.receive_some(RECEIVE_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as error:
                return f"read failed: {_why(error, 0)}"
            if not data:
                return "the server closed the connection"
            self._in_bytes += len(data)
            why = self._handle(core.receive_data(data))
            if core.bytes_to_send:
                wake.set()
            if why is not None:
                return why

    async def _writer(self, stream: trio.abc.Stream) -> str:
        core = self._core
        wake = self._wake
        room = self._room
        while True:
            await wake.wait()
            data = core.data_to_send()
            if room:
                room.unpark_all()
            if data:
                try:
                    await stream.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError) as error:
                    return f"write failed: {_why(error, 0)}"
                self._out_bytes += len(data)

    async def _keepalive(self, stream: trio.abc.Stream) -> str:
        core = self._core
        while True:
            await trio.sleep_until(core.next_deadline())
            why = self._handle(core.handle_timer(trio.current_time()))
            if why is not None:
                return why
            if core.bytes_to_send:
                self._wake.set()


def _nuid() -> str:
    """A random token of 22 letters and digits (a subject token)."""
    return secrets.token_urlsafe(16).replace("-", "A").replace("_", "B")


def _why(error: BaseException, timeout: float) -> str:
    if isinstance(error, trio.TooSlowError):
        return f"no answer within {timeout:g} s"
    if isinstance(error, OSError):
        return error.strerror or str(error)
    cause = error.__cause__ or error.__context__
    if isinstance(error, trio.BrokenResourceError) and cause is not None:
        return _why(cause, timeout)
    return str(error) or type(error).__name__


@asynccontextmanager
async def open_nats(
    servers: Sequence[str] | str,
    *,
    name: str | None = None,
    user: str | None = None,
    password: str | None = None,
    token: str | None = None,
    tls: ssl.SSLContext | None = None,
    tls_hostname: str | None = None,
    connect_timeout: float = 5.0,
    reconnect: bool = True,
    max_reconnect_attempts: int | None = None,
    reconnect_wait_first: float = 0.05,
    reconnect_wait_most: float = 2.0,
    ping_interval: float = 120.0,
    max_outstanding_pings: int = 2,
    max_pending_bytes: int = 8 * 1024 * 1024,
    inbox_prefix: str = "_INBOX",
    drain_timeout: float = 5.0,
) -> AsyncIterator[NatsClient]:
    """A NATS client for the block, connected to the first of ``servers``
    (``nats://HOST:PORT``, ``tls://HOST:PORT``, ``HOST:PORT``; credentials
    may be in the URL) that answers, each tried once: else
    :class:`ConnectError`, one line per server.

    Credentials: ``user`` and ``password``, or ``token`` (they win over the
    URL's). TLS: with ``tls`` (a client context), with a ``tls://`` URL
    (the default context) or when the server requires it; ``tls_hostname``
    is the name checked (the URL's host by default).

    When the connection breaks it reconnects (unless ``reconnect`` is
    False) across the servers, waiting a random time below a ceiling that
    doubles from ``reconnect_wait_first`` to ``reconnect_wait_most``
    seconds, ``max_reconnect_attempts`` times (None: until closed); then
    every call raises :class:`ConnectionClosed`. A PING every
    ``ping_interval`` seconds; ``max_outstanding_pings`` unanswered end the
    connection. At most ``max_pending_bytes`` of output wait (see the module).

    On leaving the block without an error, what was queued is flushed (at
    most ``drain_timeout`` seconds). An exception raised in the block comes
    out as itself, not in an exception group.
    """
    urls = [servers] if isinstance(servers, str) else list(servers)
    if not urls:
        raise ValueError("open_nats needs at least one server address")
    client = NatsClient(
        [_parse_server(url) for url in urls],
        name=name,
        user=user,
        password=password,
        token=token,
        tls=tls,
        tls_hostname=tls_hostname,
        connect_timeout=connect_timeout,
        reconnect=reconnect,
        max_reconnect_attempts=max_reconnect_attempts,
        backoff=Backoff(reconnect_wait_first, reconnect_wait_most),
        ping_interval=ping_interval,
        max_outstanding_pings=max_outstanding_pings,
        max_pending_bytes=max_pending_bytes,
        inbox_prefix=inbox_prefix,
    )
    stream = await client._first_connect()
    failure: BaseException | None = None
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client._supervise, stream)
            try:
                yield client
                if not client._closed:
                    with trio.move_on_after(drain_timeout), contextlib.suppress(NatsError):
                        await client.flush()  # (best effort: NATS publishes are at most once)
            finally:
                client._close(ConnectionClosed("the NATS client is closed"))
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        failure = sole_exception(group)
        if failure is group:
            raise
    if failure is not None:
        raise failure
