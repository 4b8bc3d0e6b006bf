"""The trio client: ``async with open_client(url) as client``."""

from __future__ import annotations

import contextlib
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import trio

from broker.errors import sole_exception
from broker.protocol import (
    SUBSCRIPTION_BINDS,
    Channel,
    ChannelKind,
    ClientSessionState,
    Connection,
    DeliverManyReceived,
    DeliverReceived,
    Event,
    GoodbyeCode,
    HandleType,
    Headers,
    LocalProtocolError,
    NoGuarantees,
    Options,
    Policy,
    Role,
    check_topic_name,
)

from ._common import (
    BACKOFF_FIRST,
    BACKOFF_MOST,
    BATCH_MOST,
    PEER_CLOSED,
    PUBLISHES_PER_YIELD,
    RECONNECT_CODES,
    RELEASE_BATCH,
    ClientError,
    ClientEvents,
    ConnectionLost,
    Message,
    client_policy,
    connection_target,
    log_session_lost,
    resume_state,
    show_address,
    subscription_limit,
    unconfirmed_publishes,
)
from ._inbox import Inbox
from ._topics import DEFAULT_MAX_TOPICS, TopicCache

log = logging.getLogger("broker.client")

RECEIVE_SIZE = 64 * 1024


class Subscription:
    """Messages of one subscription, in order: ``async for message in sub``.

    Each message consumed frees its space in the delivery channel's buffer,
    and the client promises that space to the broker again: the
    subscriber's consumption is the window, so a slow consumer slows the
    publishers feeding it instead of growing anybody's memory.
    """

    def __init__(self, client: Client, handle: int, topic: str) -> None:
        self._client = client
        self.handle = handle
        self.topic = topic
        self._inbox = Inbox(topic)
        self._closed = False
        self._since_yield = 0
        self.received = 0
        #: Deliveries the broker dropped (lossy and latest modes), per its Gap notices.
        self.missed = 0
        #: The options it was made with (to subscribe again if the session is lost).
        self.mode = "reliable"
        self.options: Options | None = None
        #: The sequence number of the last message consumed, and of the last acknowledged.
        self._consumed = 0
        self._acked = 0

    def _release(self) -> None:
        """Free the space of the messages consumed so far (guarantees follow)
        and acknowledge them (the broker holds their loans until then)."""
        size, count = self._inbox.collect()
        if count:
            client = self._client
            conn = client._conn
            if not conn.closed:
                conn.release_frames(Channel(ChannelKind.DELIVER, self.handle), size, count)
                if not self._closed and self._consumed > self._acked:
                    with contextlib.suppress(LocalProtocolError):  # being freed
                        conn.ack(self.handle, self._consumed)
                        self._acked = self._consumed
            client._wake_writer()

    def _reset(self) -> None:
        """The connection was replaced: what was received and not consumed
        will be delivered again (the broker resends after the last processed)."""
        self._inbox.clear()

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Message:
        try:
            return await self.receive()
        except ConnectionLost as error:
            if error.code == GoodbyeCode.NORMAL or self._closed:
                raise StopAsyncIteration from None
            raise

    def receive_nowait(self) -> Message:
        """The next message, or :class:`trio.WouldBlock` if none is here yet."""
        if not self._inbox:
            self._client._check_open()
            if self._closed:
                raise ClientError("the subscription is closed")
            raise trio.WouldBlock
        return self._take()

    def _take(self) -> Message:
        """The next queued message (there is one)."""
        inbox = self._inbox
        message = inbox.take()
        self._consumed = message.seq
        if inbox.done_count:  # (rare mid-frame: not worth a call per message)
            self._release_if_due()
        return message

    def _release_if_due(self) -> None:
        """Release what whole frames taken hold, once RELEASE_BATCH messages'
        worth is waiting or the application has taken everything received."""
        inbox = self._inbox
        done = inbox.done_count
        if done and (done >= RELEASE_BATCH or not inbox.messages):
            self._release()

    async def _wait_for_messages(self) -> None:
        """Until a message is here or the subscription is closed (raises
        :class:`ConnectionLost` if the connection ends first)."""
        while not self._inbox.messages and not self._closed:
            self._client._check_open()
            await self._client._changed.park()

    def receive_batch_nowait(self, max_messages: int = BATCH_MOST) -> list[Message]:
        """The messages here now, oldest first, at most ``max_messages`` (at
        least one), or :class:`trio.WouldBlock` if none is here yet."""
        if max_messages < 1:
            raise ValueError("max_messages must be at least 1")
        inbox = self._inbox
        if not inbox.messages:
            self.receive_nowait()  # raises why there is none
        messages = inbox.take_many(max_messages)
        self._consumed = messages[-1].seq
        self._release_if_due()
        return messages

    async def receive_batch(self, max_messages: int = BATCH_MOST) -> list[Message]:
        """The messages here now, oldest first, at most ``max_messages``;
        waits for at least one. A checkpoint on every call.

        For consumers that handle messages in bulk: it costs one call per
        batch instead of one per message. Messages are released and
        acknowledged as if taken one by one with :meth:`receive`.
        """
        if max_messages < 1:
            raise ValueError("max_messages must be at least 1")
        await trio.lowlevel.checkpoint()
        await self._wait_for_messages()
        return self.receive_batch_nowait(max_messages)  # (or why there is none)

    async def receive(self) -> Message:
        """The next message (waits for it).

        Always checks for cancellation; yields to other tasks when it waits,
        and otherwise at least once per ``PUBLISHES_PER_YIELD`` calls.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        if not self._inbox.messages:
            self._since_yield = 0
            await self._wait_for_messages()
            message = self.receive_nowait()  # (or why there is none)
        else:
            message = self._take()
        self._since_yield += 1
        if self._since_yield >= PUBLISHES_PER_YIELD:
            self._since_yield = 0
            await trio.lowlevel.cancel_shielded_checkpoint()
        return message


class Client(ClientEvents):
    """A connection to a broker; see :func:`open_client`."""

    def __init__(
        self,
        stream: trio.abc.Stream,
        name: str,
        policy: Policy | None,
        token: str | None = None,
        *,
        connect: Callable[[], Awaitable[trio.abc.Stream]] | None = None,
        reconnect: float = 0.0,
        on_session_lost: Callable[[], object] | None = None,
        max_topics: int = DEFAULT_MAX_TOPICS,
    ) -> None:
        super().__init__()
        self._stream = stream
        self.name = name
        self._token = token
        self._conn = Connection(Role.CLIENT, policy=policy, now=trio.current_time())
        self._optimistic = self._conn.policy.optimism > 0
        self._published: dict[int, int] = {}
        #: Topic handles (see ``_topics.py``): released when unused for longest.
        self._cache = TopicCache(max_topics, self._published, self._confirmed, trio.current_time)
        self._topics = self._cache.handles
        self._subscriptions: dict[int, Subscription] = {}
        self._changed = trio.lowlevel.ParkingLot()
        self._wakeup = trio.Event()
        self._error: ConnectionLost | None = None
        self._since_yield = 0
        self._closing = False
        self._writer_done = trio.Event()
        self._connect = connect
        self._reconnect = reconnect
        self._on_session_lost = on_session_lost
        self._nursery: trio.Nursery | None = None
        self._scope: trio.CancelScope | None = None
        #: A broken connection is being replaced (callers wait meanwhile).
        self._reconnecting = False
        self._attempt_error: ConnectionLost | None = None
        #: Streams of broken connections (closed soon, and for sure on exit).
        self._retired: list[trio.abc.Stream] = []

    # ---------------------------------------------------------------- running

    async def _run(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        self._conn.hello(self.name, token=self._token, deliver_many=True)
        nursery.start_soon(self._serve, self._stream, self._conn)
        self._wake_writer()
        await self._wait_for(lambda: self._conn.welcome_message is not None)

    async def _serve(self, stream: trio.abc.Stream, conn: Connection) -> None:
        """Run one connection's reader, writer and keepalive (until replaced)."""
        done = self._writer_done = trio.Event()
        with trio.CancelScope() as scope:
            self._scope = scope
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._reader, stream, conn)
                nursery.start_soon(self._writer, stream, conn, done)
                nursery.start_soon(self._keepalive, conn)

    def _fail(self, error: ConnectionLost) -> None:
        if self._reconnecting:
            self._attempt_error = error  # of a connection being tried
            self._changed.unpark_all()
            return
        if self._error is None and self._may_reconnect(error):
            self._start_reconnect(error)
            return
        if self._error is None:
            self._error = error
        self._changed.unpark_all()
        self._wakeup.set()

    def _may_reconnect(self, error: ConnectionLost) -> bool:
        return (
            self._reconnect > 0
            and self._connect is not None
            and self._nursery is not None
            and not self._closing
            and self._conn.welcome_message is not None
            and (error.code is None or error.code in RECONNECT_CODES)
        )

    def _ended(self, conn: Connection) -> bool:
        return conn.closed or self._error is not None

    def _check_open(self) -> None:
        if self._error is not None:
            raise self._error
        if self._conn.closed and not self._reconnecting:
            raise ConnectionLost("the client is closed")

    async def _wait_for(self, condition: Callable[[], bool]) -> None:
        while not condition():
            self._check_open()
            await self._changed.park()

    def _wake_writer(self) -> None:
        self._wakeup.set()

    async def _reader(self, stream: trio.abc.Stream, conn: Connection) -> None:
        try:
            while not conn.closed:
                data = await stream.receive_some(RECEIVE_SIZE)
                if stream in self._retired:
                    # Replaced while this read was under way (a read can
                    # return after its cancellation): what it brought belongs
                    # to the old connection, and the resume sends it again.
                    return
                if not data:
                    self._fail(ConnectionLost(PEER_CLOSED))
                    return
                if conn.welcome_message is None:
                    self._keep_answer(data)
                events = conn.receive_data(data, trio.current_time())
                self._handle_events(events)
                if conn.bytes_to_send:
                    self._wakeup.set()
        except (trio.BrokenResourceError, trio.ClosedResourceError) as error:
            self._fail(ConnectionLost(f"connection broken: {error}"))

    def _handle_events(self, events: list[Event]) -> None:
        self._apply_events(events)
        if not self._reconnecting and self._cache.pump(self._conn):
            self._wakeup.set()
        self._changed.unpark_all()

    def _release(self, event: DeliverReceived | DeliverManyReceived) -> None:
        self._conn.release(event)

    async def _writer(self, stream: trio.abc.Stream, conn: Connection, done: trio.Event) -> None:
        try:
            while True:
                await self._wakeup.wait()
                self._wakeup = trio.Event()
                data = conn.data_to_send(trio.current_time())
                if data:
                    await stream.send_all(data)
                if self._error is not None:
                    return
                if conn.closed:
                    if conn.bytes_to_send:  # the Goodbye came while we were sending
                        self._wakeup.set()
                        continue
                    return
        except (trio.BrokenResourceError, trio.ClosedResourceError) as error:
            self._fail(ConnectionLost(f"connection broken: {error}"))
        finally:
            done.set()

    async def _keepalive(self, conn: Connection) -> None:
        while not self._ended(conn):
            await trio.sleep_until(conn.next_deadline())
            if self._ended(conn):  # it ended while we slept
                return
            now = trio.current_time()
            if conn.peer_gone(now):
                conn.goodbye(GoodbyeCode.LEASE_EXPIRED, "broker silent")
                self._fail(ConnectionLost("the broker went silent (lease expired)"))
                return
            if conn.ping_due(now) and conn.welcome_message is not None:
                conn.ping()
                conn.liveness.on_sent(now)  # one Ping per heartbeat, however slow the send
                self._wake_writer()

    # ---------------------------------------------------------------- reconnecting

    def _start_reconnect(self, error: ConnectionLost) -> None:
        """Replace the broken connection, resuming the session (see :func:`open_client`)."""
        assert self._nursery is not None
        log.warning("%s: %s; reconnecting", self.name, error)
        self._reconnecting = True
        if self._scope is not None:
            self._scope.cancel()
        self._retired.append(self._stream)
        self._nursery.start_soon(trio.aclose_forcefully, self._stream)
        state = self._resume_state()
        for subscription in self._subscriptions.values():
            subscription._reset()
        self._nursery.start_soon(self._reconnect_loop, state, error)
        self._changed.unpark_all()

    def _resume_state(self) -> ClientSessionState:
        """The session as it stands, each open subscription processed up to
        what the application consumed (the rest is delivered again)."""
        return resume_state(self._conn, self._subscriptions)

    async def _reconnect_loop(self, state: ClientSessionState, error: ConnectionLost) -> None:
        """Connect again, with exponential backoff, for up to ``reconnect``
        seconds; then resume the session or, if the broker lost it, make the
        subscriptions again and resend what it never confirmed."""
        assert self._connect is not None and self._nursery is not None
        deadline = trio.current_time() + self._reconnect
        delay = BACKOFF_FIRST
        last: BaseException = error
        while trio.current_time() < deadline:
            conn = await self._attempt(state, deadline)
            if isinstance(conn, Connection):
                welcome = conn.welcome_message
                assert welcome is not None
                if welcome.resumed:
                    self._resumed(welcome.received)
                else:
                    await self._session_lost(state)
                self._reconnecting = False
                self._changed.unpark_all()
                self._wake_writer()
                return
            last = conn
            if isinstance(conn, ConnectionLost) and conn.code not in (None, *RECONNECT_CODES):
                break  # refused (not authorised, say): trying again will not help
            await trio.sleep(max(min(delay, deadline - trio.current_time()), 0))
            delay = min(delay * 2, BACKOFF_MOST)
        self._reconnecting = False
        self._error = ConnectionLost(f"could not reconnect within {self._reconnect} s: {last}")
        self._changed.unpark_all()
        self._wakeup.set()

    async def _attempt(self, state: ClientSessionState, deadline: float) -> Connection | Exception:
        """One connection attempt: the Connection once welcomed, else the error."""
        assert self._connect is not None and self._nursery is not None
        try:
            with trio.fail_after(max(deadline - trio.current_time(), 0)):
                stream = await self._connect()
        except (OSError, trio.TooSlowError, ConnectionLost) as error:
            return error
        conn = Connection(Role.CLIENT, policy=self._conn.policy, now=trio.current_time())
        conn.hello(self.name, token=self._token, resume=state, deliver_many=True)
        self._conn, self._stream = conn, stream
        self._attempt_error = None
        self._pong = 0  # Ping nonces start again
        self._nursery.start_soon(self._serve, stream, conn)
        self._wake_writer()
        with trio.move_on_after(max(deadline - trio.current_time(), 0)):
            while conn.welcome_message is None and self._attempt_error is None:
                await self._changed.park()
        if conn.welcome_message is not None and not conn.closed:
            return conn
        if self._scope is not None:
            self._scope.cancel()
        await trio.aclose_forcefully(stream)
        return self._attempt_error or ConnectionLost("no Welcome in time")

    async def _session_lost(self, state: ClientSessionState) -> None:
        """The broker does not know the session: subscribe again, publish again
        what it never confirmed (at least once), and tell the application."""
        self.sessions_lost += 1
        log_session_lost(self.name, state)
        self._cache.clear()
        self._published.clear()
        self._confirmed.clear()
        subscriptions = [self._subscriptions[h] for h in sorted(state.subscriptions)]
        self._subscriptions = {}
        for subscription in subscriptions:
            await self._open_subscription(subscription)
            await self._subscribed(subscription)
        for topic, _stage, message in unconfirmed_publishes(state):
            await self._publish(topic, message.payload, message.key, message.headers)
        if self._on_session_lost is not None:
            self._on_session_lost()

    # ---------------------------------------------------------------- topics

    def _topic_nowait(self, topic: str) -> int:
        handle = self._topics.get(topic)
        if handle is None:
            self._check_open()
            try:
                handle = self._cache.bind(self._conn, topic, topic)
            except NoGuarantees:
                raise trio.WouldBlock from None
            finally:
                self._wake_writer()  # (the bind, or a release making room)
        return handle

    async def _topic(self, topic: str) -> int:
        while True:
            try:
                return self._topic_nowait(topic)
            except trio.WouldBlock:
                await self._changed.park()

    # ---------------------------------------------------------------- publishing

    def publish_nowait(
        self,
        topic: str,
        payload: bytes,
        *,
        key: bytes | None = None,
        headers: Headers | None = None,
    ) -> None:
        """Publish if the topic's guarantees allow it now; else :class:`trio.WouldBlock`.

        Once it returns, the broker is certain to accept the message (with
        ``optimism``: once the client has resent it, if it was dropped).
        While the client reconnects (see :func:`open_client`) it waits. A bad
        ``topic`` name raises :class:`~broker.protocol.TopicNameError`.
        """
        if self._reconnecting:
            check_topic_name(topic)
            self._check_open()
            raise trio.WouldBlock
        self._publish_now(topic, payload, key, headers)

    def _publish_now(
        self, topic: str, payload: bytes, key: bytes | None, headers: Headers | None
    ) -> None:
        handle = self._topic_nowait(topic)
        self._check_open()
        try:
            self._cache.publish(self._conn, handle, payload, key, headers)
        except NoGuarantees:
            raise trio.WouldBlock from None
        self._wakeup.set()

    async def publish(
        self,
        topic: str,
        payload: bytes,
        *,
        key: bytes | None = None,
        headers: Headers | None = None,
    ) -> None:
        """Publish, waiting for the topic's guarantees: backpressure reaches the caller.

        Always checks for cancellation; yields to other tasks when it waits,
        and otherwise at least once per ``PUBLISHES_PER_YIELD`` calls (so a
        tight publishing loop lets the writer batch its frames). A bad
        ``topic`` name raises :class:`~broker.protocol.TopicNameError`.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        conn = self._conn
        handle = self._topics.get(topic)
        published = False
        if handle is not None and self._error is None and not self._reconnecting:
            # The usual case, in short: a bound topic on an open connection.
            try:
                if not conn.closed:
                    conn.publish(handle, payload, key=key, headers=headers)
                    self._published[handle] += 1
                    self._wakeup.set()
                    published = True
            except NoGuarantees:
                pass  # wait for guarantees below
        if not published:
            if handle is None:
                check_topic_name(topic)
            while True:
                try:
                    self.publish_nowait(topic, payload, key=key, headers=headers)
                    break
                except trio.WouldBlock:
                    self._since_yield = 0
                    await self._changed.park()
        self._since_yield += 1
        if self._since_yield >= PUBLISHES_PER_YIELD:
            self._since_yield = 0
            await trio.lowlevel.cancel_shielded_checkpoint()

    async def _publish(
        self, topic: str, payload: bytes, key: bytes | None, headers: Headers | None
    ) -> None:
        """Publish while reconnecting (the application's publishes wait meanwhile)."""
        while True:
            try:
                self._publish_now(topic, payload, key, headers)
                return
            except trio.WouldBlock:
                await self._changed.park()

    async def flush(self) -> None:
        """Wait until the broker has routed every message published so far.

        Raises :class:`ConnectionLost` if the connection has ended (even with
        nothing outstanding) or ends first, like ``BlockingClient.flush``.
        """
        await trio.lowlevel.checkpoint()
        self._check_open()
        self._wake_writer()
        targets = dict(self._published)
        await self._wait_for(  # (a handle released since had all its publishes confirmed)
            lambda: all(self._confirmed.get(h, n) >= n for h, n in targets.items())
        )

    # ---------------------------------------------------------------- subscribing

    @asynccontextmanager
    async def subscribe(
        self, topic: str, *, mode: str = "reliable", options: Options | None = None
    ) -> AsyncIterator[Subscription]:
        """Subscribe to ``topic`` for the duration of the block.

        Returns once the broker has processed the subscription: every message
        published after that is delivered (``mode="reliable"``). With
        ``"lossy"`` or ``"latest"`` the broker drops instead of slowing
        publishers (queue limits in ``options``: ``max_queued``,
        ``max_queued_bytes``); :attr:`Subscription.missed` counts the drops.
        A bad ``topic`` name raises :class:`~broker.protocol.TopicNameError`.
        """
        check_topic_name(topic)
        await self._wait_for(lambda: not self._reconnecting)
        subscription = Subscription(self, -1, topic)
        subscription.mode = mode
        subscription.options = options
        await self._open_subscription(subscription)
        try:
            await self._subscribed(subscription)
            yield subscription
        finally:
            subscription._closed = True
            with trio.CancelScope(shield=True):
                await self._unsubscribe(subscription)

    async def _open_subscription(self, subscription: Subscription) -> None:
        """Send the Subscribe for ``subscription`` (binding its topic first)."""
        conn = self._conn
        handle = await self._topic(subscription.topic)
        self._cache.pin(handle)  # kept bound until the Subscribe naming it is sent
        try:
            await self._wait_for(lambda: conn.confirmed(HandleType.TOPIC, handle))
            checked = False
            while True:
                self._check_open()
                try:
                    sub_handle = conn.subscribe(handle, subscription.mode, subscription.options)
                    break
                except NoGuarantees:
                    if SUBSCRIPTION_BINDS not in self.throttled:
                        await self._changed.park()
                    elif checked:  # at the broker's limit: no room after a round trip
                        raise subscription_limit(len(self._subscriptions)) from None
                    else:  # near it: the room for what it has processed comes first
                        await self._round_trip()
                        checked = True
        finally:
            self._cache.unpin(handle)
        subscription.handle = sub_handle
        subscription._consumed = subscription._acked = 0
        self._subscriptions[sub_handle] = subscription
        self._wake_writer()

    async def _subscribed(self, subscription: Subscription) -> None:
        """Wait until the broker has processed the Subscribe."""
        conn = self._conn
        handle = subscription.handle
        await self._wait_for(lambda: conn.confirmed(HandleType.SUBSCRIPTION, handle))
        await self._round_trip()

    async def _unsubscribe(self, subscription: Subscription) -> None:
        conn = self._conn
        size, count = subscription._inbox.clear()
        if count and not conn.closed:
            conn.release_frames(Channel(ChannelKind.DELIVER, subscription.handle), size, count)
        subscription._release()
        if self._reconnecting:
            # The session being resumed still holds the subscription: free it
            # on the connection that replaces this one.
            with trio.move_on_after(10):
                try:
                    await self._wait_for(lambda: not self._reconnecting)
                except ConnectionLost:
                    return
            conn = self._conn
        handle = subscription.handle  # (a new one if the session was made again)
        if self._error is not None or conn.closed or self._reconnecting:
            return
        if handle not in conn.subscriptions:
            return  # the session no longer has it (the broker ended it)
        with trio.move_on_after(10):
            await self._wait_for(lambda: conn.confirmed(HandleType.SUBSCRIPTION, handle))
            conn.free_handle(HandleType.SUBSCRIPTION, handle)
            self._wake_writer()

    async def _round_trip(self) -> None:
        """Wait until the broker has processed everything sent so far.

        The broker handles a connection's frames in order and answers a Ping
        after the frames before it, so its Pong proves they were processed.
        """
        nonce = self._conn.ping()
        self._wake_writer()
        await self._wait_for(lambda: self._pong >= nonce)

    # ---------------------------------------------------------------- closing

    async def aclose(self, *, flush: bool = True) -> None:
        """Flush (by default), say Goodbye and close the connection.

        With ``flush``, a connection that already broke raises
        :class:`ConnectionLost` if published messages were never confirmed;
        ``flush=False`` accepts that. Later calls do nothing.
        """
        if self._closing:
            return
        if self._reconnecting and flush:
            with contextlib.suppress(ConnectionLost):  # then raised below, if anything is lost
                await self._wait_for(lambda: not self._reconnecting)
        self._closing = True
        if self._error is None and not self._conn.closed:
            if flush:
                await self.flush()
            self._conn.goodbye(GoodbyeCode.NORMAL, "bye")
            self._wake_writer()
        elif flush and self._unconfirmed():
            # Never leave quietly with messages the broker may not have routed.
            raise self._error or ConnectionLost("the client is closed")

    def _unconfirmed(self) -> int:
        return sum(n - self._confirmed.get(h, 0) for h, n in self._published.items())

    def statistics(self) -> dict[str, int]:
        """Messages published/confirmed and subscriptions, for scripts and tests."""
        return {
            **self._cache.statistics(),
            "subscriptions": len(self._subscriptions),
            "bytes_sent": self._conn.bytes_sent,
            "bytes_received": self._conn.bytes_received,
            "frames_resent": self.frames_resent,
            "resumes": self.resumes,
            "frames_resent_on_resume": self.frames_resent_on_resume,
            "sessions_lost": self.sessions_lost,
        }


@asynccontextmanager
async def open_client(
    url: str = "127.0.0.1:7400",
    *,
    name: str = "trio-client",
    policy: Policy | None = None,
    connect_timeout: float = 10.0,
    token: str | None = None,
    ssl_context: ssl.SSLContext | None = None,
    optimism: int = 0,
    reconnect: float = 0.0,
    on_session_lost: Callable[[], object] | None = None,
    max_topics: int = DEFAULT_MAX_TOPICS,
) -> AsyncIterator[Client]:
    """Connect to a broker at ``url`` (``host:port``) for the duration of the block.

    TLS is used with ``ssl_context`` or a ``tls://host:port`` URL (then with
    the system's trust store; see :func:`broker.tls.client_context`); the
    broker's hostname is checked. ``token`` authenticates the client to a
    broker that requires it (a refusal raises :class:`ConnectionLost` with
    code 6).

    ``optimism`` (bytes, per topic) lets :meth:`Client.publish` send that
    much beyond the broker's guarantees instead of waiting for them. What the
    broker drops for lack of room it announces, and the client resends
    exactly those messages, in order, before anything newer: every message
    still arrives once, in order (``client.frames_resent`` counts the resent).

    ``reconnect`` (seconds, default 0: never) makes a client whose connection
    breaks (or whose broker goes silent or shuts down) connect again, with
    exponential backoff, for up to that long, and resume its session:
    subscriptions go on where the application left them and published
    messages the broker did not receive are sent again, so nothing is lost
    or delivered twice. Meanwhile publishing and flushing wait. If the broker
    no longer knows the session (it restarted, or the session outlived its
    lease), the client subscribes again, publishes again what was never
    confirmed, logs a warning and calls ``on_session_lost()``:
    ``client.sessions_lost`` counts these. Messages published to its topics
    while it had no session were not delivered to it.

    ``max_topics`` bounds the topic handles the client holds at once (any
    number of topics may be published to): past it, and whenever the broker
    has no room for another topic, the client releases the one it used least
    recently, once everything published to it is confirmed.

    Leaving the block normally flushes (waits until the broker has routed
    every published message), then says Goodbye. An exception raised in the
    block comes out as itself, not wrapped in an exception group.

    Connecting raises :class:`OSError` if nothing listens at ``url``, and
    :class:`ConnectionLost` if the connection (TCP and TLS) or the handshake
    takes longer than ``connect_timeout`` seconds, if the broker refuses the
    client (its Goodbye's code and reason), or if what answers is no broker:
    one line such as ``127.0.0.1:9400 did not answer as a broker (it looks
    like HTTP)``.
    """
    host, port, context = connection_target(url, ssl_context, token)
    policy = client_policy(policy, optimism)
    if reconnect < 0:
        raise ClientError("reconnect must be >= 0 seconds")
    if max_topics < 1:
        raise ClientError("max_topics must be at least 1")

    async def connect() -> trio.abc.Stream:
        stream: trio.abc.Stream = await trio.open_tcp_stream(host, port)
        if context is not None:
            try:
                stream = await _secure(stream, context, host)
            except BaseException:  # a timeout or cancellation: the socket goes too
                await trio.aclose_forcefully(stream)
                raise
        return stream

    address = show_address(host, port)
    try:
        with trio.fail_after(connect_timeout):
            stream = await connect()
    except trio.TooSlowError:
        raise ConnectionLost(f"cannot connect to {address} within {connect_timeout:g} s") from None
    failure: BaseException | None = None
    client: Client | None = None
    try:
        async with trio.open_nursery() as nursery:
            client = Client(
                stream,
                name,
                policy,
                token,
                connect=connect,
                reconnect=reconnect,
                on_session_lost=on_session_lost,
                max_topics=max_topics,
            )
            try:
                with trio.fail_after(connect_timeout):
                    await client._run(nursery)
            except (trio.TooSlowError, ConnectionLost) as error:
                lost = error if isinstance(error, ConnectionLost) else None
                tls = context is not None
                raise client._handshake_error(lost, address, connect_timeout, tls) from None
            try:
                yield client
                await client.aclose()
            except BaseException:
                await client.aclose(flush=False)
                raise
            finally:
                with trio.move_on_after(2) as scope:
                    scope.shield = True
                    # Let the writer send the Goodbye before the socket closes.
                    await client._writer_done.wait()
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        # The client's own tasks never raise: whatever the nursery gathered
        # came from the block (or the handshake). Hand it on as it was raised,
        # outside this handler so that its cause and context stay its own.
        failure = sole_exception(group)
        if failure is group:
            raise
    finally:
        if client is not None:
            with trio.CancelScope(shield=True):
                for retired in client._retired:
                    await trio.aclose_forcefully(retired)
        await _close(stream if client is None else client._stream)
    if failure is not None:
        raise failure


async def _close(stream: trio.abc.Stream) -> None:
    """Close ``stream`` (TLS: with close_notify, for up to a second), shielded:
    a cancellation around the client must not replace what is propagating."""
    with trio.CancelScope(shield=True):
        with trio.move_on_after(1):
            await stream.aclose()
            return
        await trio.aclose_forcefully(stream)


async def _secure(stream: trio.abc.Stream, context: ssl.SSLContext, host: str) -> trio.abc.Stream:
    """``stream`` wrapped in TLS, handshake done (or :class:`ConnectionLost`)."""
    secured = trio.SSLStream(stream, context, server_hostname=host)
    try:
        await secured.do_handshake()
    except trio.BrokenResourceError as error:
        cause = error.__cause__ or error
        raise ConnectionLost(f"TLS handshake with {host} failed: {cause}") from None
    return secured
