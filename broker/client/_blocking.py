"""The blocking client, for plain threads: ``with BlockingClient(url) as client``.

It drives the same sans-IO :class:`~broker.protocol.Connection` as the trio
client, over a plain :class:`socket.socket`, and keeps the same promises:

- **Backpressure reaches the caller.** :meth:`BlockingClient.publish` returns
  only once the broker's guarantees cover the message; without room it sends
  what is pending and reads the socket until room appears. A slow broker (or
  a slow subscriber downstream of it) slows the publishing thread; memory
  never grows beyond what the broker has promised to buffer.
- **Consumption is the window.** A delivered message's buffer space is
  promised to the broker again only once the application has taken the
  message from its :class:`BlockingSubscription`.

Writes are batched: a publish does not write to the socket by itself. Output
goes out once ``SEND_THRESHOLD`` bytes are pending, whenever the client is
about to wait, on :meth:`BlockingClient.flush` and on close, and otherwise
within half a heartbeat (from the background heartbeat thread).

Threads: every public method takes the client's lock, so the client is safe
to share, but it is meant for one thread at a time: a call that waits holds
the lock while it waits (a ``timeout`` covers waiting for the lock too), so
another thread cannot interrupt it, not even with :meth:`BlockingClient.close`;
give such calls a timeout instead. A daemon heartbeat thread wakes every half
heartbeat interval and, if the lock is free, reads what the socket holds
(answering the broker's pings), pings the broker when this side has been
silent and sends pending output. It never waits for the lock: when the lock
is busy, the thread holding it does that work before it returns.

The socket is non-blocking and every wait is a readiness wait on both
directions, so the client always reads while it waits to write: a broker
that is itself waiting for us to read cannot deadlock it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import selectors
import socket
import ssl
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType

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
    Outcome,
    Policy,
    Role,
    Stage,
    check_topic_name,
)

from ._common import (
    BACKOFF_FIRST,
    BACKOFF_MOST,
    BATCH_MOST,
    PEER_CLOSED,
    RECONNECT_CODES,
    RELEASE_BATCH,
    ClientError,
    ClientEvents,
    ConnectionLost,
    Message,
    check_outcome,
    client_policy,
    connection_target,
    log_session_lost,
    resume_state,
    show_address,
    subscription_limit,
    unconfirmed_publishes,
)
from ._inbox import Inbox
from ._tls import TLSPipe
from ._topics import DEFAULT_MAX_TOPICS, TopicCache

__all__ = ["SEND_THRESHOLD", "BlockingClient", "BlockingSubscription", "connect"]

log = logging.getLogger("broker.client")

#: Bytes asked of the socket per ``recv``.
RECEIVE_SIZE = 64 * 1024
#: Pending output above this many bytes is written at once (without waiting);
#: below it, output waits for the next wait, flush, close or heartbeat.
SEND_THRESHOLD = 64 * 1024
#: How long :meth:`BlockingClient.close` waits for its Goodbye to be written
#: and for the broker to close its end.
LINGER_SECONDS = 1.0


def _deadline(timeout: float | None) -> float | None:
    """``timeout`` seconds from now on the monotonic clock (None: no deadline)."""
    if timeout is None:
        return None
    return time.monotonic() + max(timeout, 0.0)


def _heartbeat(
    client_ref: weakref.ref[BlockingClient], stop: threading.Event, interval: float
) -> None:
    """The heartbeat thread's loop; holds the client only weakly between ticks."""
    while not stop.wait(interval):
        client = client_ref()
        if client is None:
            return
        client._heartbeat_tick()
        del client


class BlockingSubscription:
    """Messages of one subscription, in order: ``for message in subscription``.

    Taking a message (:meth:`receive`, :meth:`receive_nowait` or iteration)
    releases its space in the delivery channel's buffer, which the client
    promises to the broker again: nothing is consumed on the application's
    behalf, so a slow consumer slows the publishers feeding it.

    Iteration ends (``StopIteration``) when the subscription or its client
    was closed by this side, or when the broker closed the connection
    normally (Goodbye code 0), once every message already received has been
    taken. Any other end of the connection raises :class:`ConnectionLost`.

    Use it as a context manager (or call :meth:`close`) to unsubscribe.
    """

    def __init__(self, client: BlockingClient, handle: int, topic: str) -> None:
        self._client = client
        #: The subscription handle (on the wire).
        self.handle = handle
        #: The topic subscribed to.
        self.topic = topic
        #: Deliveries received from the broker so far (taken or not).
        self.received = 0
        #: Deliveries the broker dropped (lossy and latest modes), per its Gap notices.
        self.missed = 0
        self._inbox = Inbox(topic)
        #: The options it was made with (to subscribe again if the session is lost).
        self.mode = "reliable"
        self.options: Options | None = None
        #: The sequence numbers of the last message taken and of the last acknowledged.
        self._consumed = 0
        self._acked = 0
        self._closed = False

    @property
    def closed(self) -> bool:
        """:meth:`close` was called (messages may still be queued: see :meth:`receive`)."""
        return self._closed

    @property
    def pending(self) -> int:
        """Messages received and not taken yet."""
        return len(self._inbox)

    def __iter__(self) -> Iterator[Message]:
        return self

    def __next__(self) -> Message:
        try:
            return self.receive()
        except ConnectionLost:
            if self._client._ended_normally():
                raise StopIteration from None
            raise
        except ClientError:
            if self._closed:
                raise StopIteration from None
            raise

    def __enter__(self) -> BlockingSubscription:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def receive(self, timeout: float | None = None) -> Message:
        """The next message, waiting up to ``timeout`` seconds (None: no limit) for it.

        Messages already received are returned even after the connection
        ended. Raises :class:`TimeoutError` when the time is up,
        :class:`ConnectionLost` once the connection has ended and nothing is
        queued, and :class:`ClientError` if the subscription is closed.
        """
        deadline = _deadline(timeout)
        client = self._client
        with client._locked(deadline):
            client._wait_until(lambda: bool(self._inbox) or self._closed, deadline, "receive")
            return self._take()

    def receive_batch(
        self, max_messages: int = BATCH_MOST, timeout: float | None = None
    ) -> list[Message]:
        """The messages here, oldest first, at most ``max_messages``, waiting
        up to ``timeout`` seconds for at least one; otherwise as :meth:`receive`.

        For consumers that handle messages in bulk: one call per batch
        instead of one per message.
        """
        if max_messages < 1:
            raise ValueError("max_messages must be at least 1")
        deadline = _deadline(timeout)
        client = self._client
        with client._locked(deadline):
            client._wait_until(lambda: bool(self._inbox) or self._closed, deadline, "receive")
            return self._take_batch(max_messages)

    def receive_nowait(self) -> Message:
        """The next message if one is here, reading what the socket holds without waiting.

        Raises :class:`BlockingIOError` (``errno.EAGAIN``) when no message is
        available now; otherwise as :meth:`receive`.
        """
        client = self._client
        with client._lock:
            if not self._inbox and not self._closed:
                client._check_open()
                client._service()
                if not self._inbox:
                    client._check_open()
                    raise BlockingIOError(errno.EAGAIN, f"no message on {self.topic!r} yet")
            return self._take()

    def _take(self) -> Message:
        """Pop a queued message and release its buffer space (lock held)."""
        return self._take_batch(1)[0]

    def _take_batch(self, limit: int) -> list[Message]:
        """Pop up to ``limit`` queued messages and release the space of the
        frames they complete (lock held)."""
        client = self._client
        inbox = self._inbox
        if not inbox:
            raise ClientError("the subscription is closed")
        messages = inbox.take_many(limit)
        size, count = inbox.collect()
        if count:  # frames all taken
            client._release_frames(self.handle, size, count)
        seq = messages[-1].seq
        self._consumed = seq
        # Acknowledge (the broker holds each delivery's loan until then) in
        # batches, and at once when everything received has been taken.
        if not inbox or seq - self._acked >= RELEASE_BATCH:
            client._ack(self.handle, seq)
            self._acked = seq
        client._after_operation(urgent=True)
        return messages

    def _reset(self) -> None:
        """The connection was replaced: what was received and not taken will be
        delivered again (the broker resends after the last one taken)."""
        self._inbox.clear()
        self._acked = self._consumed

    def close(self) -> None:
        """Unsubscribe, without waiting for the broker: free the subscription's handle.

        Idempotent. Messages received and not taken are dropped, and so are
        deliveries still in flight when they arrive (their buffer space is
        released either way). Iterating a closed subscription stops; calling
        :meth:`receive` raises :class:`ClientError`.
        """
        client = self._client
        with client._lock:
            if self._closed:
                return
            self._closed = True
            client._unsubscribe(self)


class BlockingClient(ClientEvents):
    """A connection to a broker for non-async code.

    ``BlockingClient(url)`` connects, says Hello and waits for the broker's
    Welcome (up to ``connect_timeout`` seconds), raising
    :class:`ConnectionLost` if it cannot: the broker's refusal, or one line
    that says what answered if it was no broker (see
    :func:`~broker.client.open_client`). As a context manager, leaving the
    block normally flushes (every message published is routed by the
    broker), then says Goodbye; leaving it with an exception closes at once.

    TLS is used with ``ssl_context`` or a ``tls://host:port`` URL (the
    system's trust store then), checking the broker's hostname; a failed
    handshake raises :class:`ConnectionLost`. ``token`` authenticates the
    client to a broker that requires it (refused: code 6). ``optimism``
    (bytes per topic) lets publishing run ahead of the guarantees; what the
    broker drops is resent, in order, before anything newer (see
    :func:`~broker.client.open_client`).

    ``reconnect`` (seconds, default 0: never) makes a client whose connection
    breaks (or whose broker goes silent or shuts down) connect again, with
    exponential backoff, for up to that long, and resume its session, exactly
    as :func:`~broker.client.open_client` does: nothing is lost or delivered
    twice. Calls made meanwhile wait (a connection attempt under way is
    finished first, so a ``timeout`` may be overrun by up to
    ``connect_timeout``); the heartbeat thread reconnects an idle client. If
    the broker no longer knows the session, the client subscribes again,
    publishes again what was never confirmed, logs a warning and calls
    ``on_session_lost()`` (from whichever thread was reconnecting).

    Every method that waits takes a ``timeout`` in seconds (None: no limit)
    and raises :class:`TimeoutError` when it is up. Once the connection has
    ended for good (broker Goodbye, end of stream, broken socket, lease
    expired, reconnection given up, or :meth:`close`), every operation
    raises :class:`ConnectionLost`, whose ``code`` is the Goodbye code when
    there was one.
    """

    def __init__(
        self,
        url: str = "127.0.0.1:7400",
        *,
        name: str = "blocking-client",
        connect_timeout: float = 10.0,
        policy: Policy | None = None,
        token: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        optimism: int = 0,
        reconnect: float = 0.0,
        on_session_lost: Callable[[], object] | None = None,
        max_topics: int = DEFAULT_MAX_TOPICS,
    ) -> None:
        if reconnect < 0:
            raise ClientError("reconnect must be >= 0 seconds")
        if max_topics < 1:
            raise ClientError("max_topics must be at least 1")
        self._host, self._port, self._context = connection_target(url, ssl_context, token)
        self._policy = client_policy(policy, optimism)
        self._token = token
        self._connect_timeout = connect_timeout
        self.name = name
        self._lock = threading.RLock()
        super().__init__()
        self._published: dict[int, int] = {}
        #: Topic handles by name, and by (name, stage) for staged ones (see
        #: ``_topics.py``): released when unused for longest.
        self._cache = TopicCache(max_topics, self._published, self._confirmed, time.monotonic)
        self._topics = self._cache.handles
        #: Publishes made per stage (see ``publish``).
        self._stage_counts: dict[Stage, int] = {}
        self._subscriptions: dict[int, BlockingSubscription] = {}
        #: Subscription handles closed before their Subscribe was confirmed.
        self._pending_frees: set[int] = set()
        self._error: ConnectionLost | None = None
        self._closed_here = False
        self._service_requested = False
        self._wbuf = bytearray()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._conn: Connection
        self._sock: socket.socket | None = None
        self._tls: TLSPipe | None = None
        self._selector = selectors.DefaultSelector()
        self._mask = selectors.EVENT_READ

        self._reconnect = reconnect
        self._on_session_lost = on_session_lost
        #: Why the connection broke while it is being replaced (None: it is not).
        self._broken: ConnectionLost | None = None
        #: The session to resume, as it stood when the connection broke, and
        #: its open subscriptions by handle.
        self._resume: ClientSessionState | None = None
        self._resuming: dict[int, BlockingSubscription] = {}
        self._reconnect_deadline = 0.0
        self._next_attempt = 0.0
        self._backoff = BACKOFF_FIRST
        #: A connection attempt is under way; how it failed, if it did.
        self._attempting = False
        self._attempt_error: ConnectionLost | None = None
        #: Connections welcomed so far (a round trip started on an older one is redone).
        self._generation = 0

        with self._lock:
            self._open(time.monotonic() + connect_timeout, None)
        welcome = self._conn.welcome_message
        assert welcome is not None
        self._thread = threading.Thread(
            target=_heartbeat,
            args=(weakref.ref(self), self._stop, welcome.heartbeat_ms / 2000),
            name=f"broker-heartbeat:{name}",
            daemon=True,
        )
        self._thread.start()

    def _open(self, deadline: float, resume: ClientSessionState | None) -> None:
        """Connect, say Hello (resuming ``resume``) and wait for the Welcome (lock held).

        Raises :class:`ConnectionLost` if that fails by ``deadline``.
        """
        host, port = self._host, self._port
        self._answer = b""
        waited = round(deadline - time.monotonic(), 1)
        try:
            sock = socket.create_connection(
                (host, port), timeout=max(deadline - time.monotonic(), 0.001)
            )
        except OSError as error:
            raise ConnectionLost(f"cannot connect to {host}:{port}: {error}") from error
        self._sock = sock
        #: TLS between the write buffer and the protocol (None: plain TCP).
        self._tls = TLSPipe(self._context, host) if self._context is not None else None
        self._selector = selectors.DefaultSelector()
        self._mask = selectors.EVENT_READ
        self._wbuf.clear()
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setblocking(False)
            self._selector.register(sock, self._mask)
            policy = self._policy if resume is None else self._conn.policy
            conn = Connection(Role.CLIENT, policy=policy, now=time.monotonic())
            self._conn = conn
            self._optimistic = conn.policy.optimism > 0
            self._pong = 0  # Ping nonces start again
            self._outcomes.clear()  # and request numbers
            conn.hello(self.name, token=self._token, resume=resume, deliver_many=True)
            self._wait_until(lambda: conn.welcome_message is not None, deadline, "handshake")
        except (TimeoutError, ConnectionLost) as error:
            self._close_socket()
            lost = error if isinstance(error, ConnectionLost) else None
            tls = self._context is not None
            raise self._handshake_error(lost, show_address(host, port), waited, tls) from None
        except BaseException:
            self._close_socket()
            raise
        self._generation += 1

    # ---------------------------------------------------------------- context manager

    def __enter__(self) -> BlockingClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(flush=exc_type is None)

    # ---------------------------------------------------------------- state

    @property
    def closed(self) -> bool:
        """The connection has ended for good (by either side); operations raise
        :class:`ConnectionLost`. A connection being replaced is not closed."""
        if self._error is not None:
            return True
        return self._conn.closed and self._broken is None

    @property
    def reconnecting(self) -> bool:
        """The connection broke and is being replaced (see ``reconnect``)."""
        return self._broken is not None and self._error is None

    def _check_open(self) -> None:
        """Raise :class:`ConnectionLost` (a fresh one each time) if the connection
        ended (or, while reconnecting, if the attempt under way failed)."""
        error = self._error
        if error is None and self._attempting:
            error = self._attempt_error
        if error is not None:
            raise ConnectionLost(error.reason, error.code)
        if self._conn.closed and self._broken is None:
            raise ConnectionLost("the client is closed")

    def _ended_normally(self) -> bool:
        """The connection ended by our own close or by the broker's Goodbye 0."""
        if self._closed_here:
            return True
        return self._goodbye_by_peer and self._goodbye_code == GoodbyeCode.NORMAL

    def _fail(self, error: ConnectionLost) -> None:
        """The connection is over: remember why, write what we can, close the
        socket; then replace it (``reconnect``) or end the client."""
        if self._sock is not None:
            self._collect_output()
            self._send_some()
        self._close_socket()
        if self._attempting:
            self._attempt_error = self._attempt_error or error
        elif self._error is not None or self._broken is not None:
            return  # it ended, or is being replaced, already
        elif self._may_reconnect(error):
            self._start_reconnect(error)
        else:
            self._error = error
            self._stop.set()

    def _may_reconnect(self, error: ConnectionLost) -> bool:
        return (
            self._reconnect > 0
            and not self._closed_here
            and self._generation > 0
            and (error.code is None or error.code in RECONNECT_CODES)
        )

    def _close_socket(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(sock)
            sock.close()
            self._selector.close()
        self._wbuf.clear()

    # ---------------------------------------------------------------- reconnecting

    def _start_reconnect(self, error: ConnectionLost) -> None:
        """Remember the session as it stands; the next wait replaces the connection."""
        log.warning("%s: %s; reconnecting", self.name, error)
        self._broken = error
        self._resume = resume_state(self._conn, self._subscriptions)
        self._resuming = {handle: self._subscriptions[handle] for handle in self._resume.processed}
        for subscription in self._subscriptions.values():
            subscription._reset()
        self._pending_frees.clear()  # given up: the resumed session drops them
        now = time.monotonic()
        self._reconnect_deadline = now + self._reconnect
        self._next_attempt = now
        self._backoff = BACKOFF_FIRST

    def _reconnect_step(self, deadline: float | None) -> None:
        """While reconnecting: wait for the next attempt (no later than
        ``deadline``), or make it; give up once ``reconnect`` seconds passed."""
        assert self._broken is not None
        now = time.monotonic()
        if now < self._next_attempt:
            until = self._next_attempt if deadline is None else min(deadline, self._next_attempt)
            time.sleep(max(until - now, 0.0))
            return
        error = self._reconnect_attempt()
        if error is None:
            return
        self._broken = error
        refused = error.code not in (None, *RECONNECT_CODES)
        if refused or time.monotonic() + self._backoff >= self._reconnect_deadline:
            self._broken = self._resume = None
            self._error = ConnectionLost(
                f"could not reconnect within {self._reconnect} s: {error}", error.code
            )
            self._stop.set()
            return
        self._next_attempt = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, BACKOFF_MOST)

    def _reconnect_attempt(self) -> ConnectionLost | None:
        """Connect once and resume the session (or restore a lost one); the error if not."""
        state = self._resume
        assert state is not None
        deadline = min(self._reconnect_deadline, time.monotonic() + self._connect_timeout)
        self._attempting = True
        self._attempt_error = None
        try:
            self._open(deadline, state)
            welcome = self._conn.welcome_message
            assert welcome is not None
            self._check_open()  # it may have broken right after the Welcome
            if welcome.resumed:
                self._resumed(welcome.received)
            else:
                self._restore_lost_session(state, deadline)
        except (ConnectionLost, TimeoutError) as error:
            self._close_socket()
            if isinstance(error, ConnectionLost):
                return error
            return ConnectionLost(f"restoring the session timed out: {error}")
        finally:
            self._attempting = False
        self._broken = self._resume = None
        if self._sock is None:  # it broke again once the session was restored
            self._start_reconnect(self._attempt_error or ConnectionLost("connection broken"))
        if not welcome.resumed and self._on_session_lost is not None:
            self._on_session_lost()
        return None

    def _restore_lost_session(self, state: ClientSessionState, deadline: float) -> None:
        """The broker does not know the session: subscribe again and publish
        again what it never confirmed (at least once)."""
        self.sessions_lost += 1
        log_session_lost(self.name, state)
        self._cache.clear()
        self._published.clear()
        self._confirmed.clear()
        self._subscriptions = {}
        for handle in sorted(state.subscriptions):
            subscription = self._resuming[handle]
            self._open_subscription(subscription, deadline, "restoring the session")
        for topic, stage, message in unconfirmed_publishes(state):
            self._publish(topic, message.payload, message.key, message.headers, deadline, stage)

    # ---------------------------------------------------------------- I/O

    def _collect_output(self) -> None:
        """Move what the protocol has queued into the write buffer (through
        TLS, once its handshake is done)."""
        tls = self._tls
        if tls is None:
            if self._conn.bytes_to_send:
                self._wbuf += self._conn.data_to_send(time.monotonic())
            return
        try:
            if tls.established and self._conn.bytes_to_send:
                tls.send(self._conn.data_to_send(time.monotonic()))
        except ssl.SSLError as error:
            self._close_socket()
            self._fail(ConnectionLost(f"TLS error: {error}"))
            return
        self._wbuf += tls.take_output()

    def _send_some(self) -> None:
        """Write as much of the write buffer as the socket takes now (never waits)."""
        sock = self._sock
        wbuf = self._wbuf
        while wbuf and sock is not None:
            try:
                sent = sock.send(wbuf)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:
                self._close_socket()
                self._fail(ConnectionLost(f"connection broken: {error}"))
                return
            del wbuf[:sent]

    def _read_available(self) -> None:
        """Read and process everything the socket holds now (never waits)."""
        while self._sock is not None:
            try:
                data = self._sock.recv(RECEIVE_SIZE)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:
                self._fail(ConnectionLost(f"connection broken: {error}"))
                return
            if not data:
                self._fail(ConnectionLost(PEER_CLOSED))
                return
            tls = self._tls
            if tls is not None:
                try:
                    data = tls.receive(data)
                except ssl.SSLError as error:
                    self._fail(ConnectionLost(f"TLS error: {error}"))
                    return
                self._collect_output()  # handshake replies; the Hello once it is done
                if tls.closed:
                    self._handle_events(self._conn.receive_data(data, time.monotonic()))
                    self._fail(ConnectionLost(PEER_CLOSED))
                    return
                if not data:
                    continue  # records without plaintext (yet): read on
            if self._conn.welcome_message is None:
                self._keep_answer(data)
            self._handle_events(self._conn.receive_data(data, time.monotonic()))

    def _handle_events(self, events: list[Event]) -> None:
        conn = self._conn
        self._apply_events(events)
        if self._ready():
            self._cache.pump(conn)
        if self._pending_frees and not conn.closed:
            for handle in list(self._pending_frees):
                if conn.confirmed(HandleType.SUBSCRIPTION, handle):
                    self._pending_frees.discard(handle)
                    conn.free_handle(HandleType.SUBSCRIPTION, handle)

    def _keepalive(self) -> None:
        """Ping when this side has been silent; give up on a silent broker."""
        conn = self._conn
        if conn.closed or conn.welcome_message is None or self._sock is None:
            return
        now = time.monotonic()
        if conn.peer_gone(now):
            conn.goodbye(GoodbyeCode.LEASE_EXPIRED, "broker silent")
            self._fail(ConnectionLost("the broker went silent (lease expired)"))
        elif conn.ping_due(now):
            conn.ping()

    def _service(self) -> None:
        """Without waiting: read what is readable, keep alive, write what is pending."""
        self._service_requested = False
        if self._sock is None:
            return
        self._read_available()
        self._keepalive()
        self._collect_output()
        self._send_some()

    def _heartbeat_tick(self) -> None:
        """Called by the heartbeat thread: service now (or reconnect, when an
        attempt is due), or ask the lock's holder to.

        Never raises: an unexpected error ends the connection (and is logged),
        so the application sees it as :class:`ConnectionLost` on its next call.
        """
        if not self._lock.acquire(blocking=False):
            self._service_requested = True
            return
        try:
            if self._broken is not None and self._error is None:
                if time.monotonic() >= self._next_attempt:
                    self._reconnect_step(time.monotonic())
            else:
                self._service()
        except Exception as error:
            log.exception("%s: heartbeat failed", self.name)
            self._broken = None
            self._fail(ConnectionLost(f"heartbeat failed: {error!r}"))
        finally:
            self._lock.release()

    @contextlib.contextmanager
    def _locked(self, deadline: float | None) -> Iterator[None]:
        """Hold the client's lock, waiting for it no later than ``deadline``.

        Raises :class:`TimeoutError` if another thread holds it until then.
        """
        if deadline is None:
            acquired = self._lock.acquire()
        else:
            acquired = self._lock.acquire(timeout=max(deadline - time.monotonic(), 0.0))
        if not acquired:
            raise TimeoutError("another thread kept the client busy")
        try:
            yield
        finally:
            self._lock.release()

    def _after_operation(self, *, urgent: bool = False) -> None:
        """End of a call that may have queued output: write it if it is due.

        Publishes are batched (written once ``SEND_THRESHOLD`` bytes are
        pending); ``urgent`` output (guarantees after a release, frees) is
        written at once, without waiting.
        """
        pending = self._conn.bytes_to_send
        if pending >= SEND_THRESHOLD or (urgent and pending):
            self._collect_output()
            self._send_some()
        if self._service_requested:
            self._service()

    def _step(self, deadline: float | None) -> bool:
        """Wait once for the socket, the next heartbeat or ``deadline``, and process it.

        Pending output is written while waiting; the socket is read whenever
        it is readable; a broken connection is replaced (``reconnect``).
        Returns whether ``deadline`` has passed.
        """
        if self._broken is not None and not self._attempting:
            self._reconnect_step(deadline)
            return deadline is not None and time.monotonic() >= deadline
        self._collect_output()
        self._send_some()
        sock = self._sock
        if sock is None:
            self._check_open()
            if self._broken is not None and not self._attempting:
                return False  # it broke just now: reconnect on the next step
            raise ConnectionLost("the connection is closed")
        now = time.monotonic()
        timeout = None if deadline is None else max(deadline - now, 0.0)
        conn = self._conn
        if conn.welcome_message is not None and not conn.closed:
            until_keepalive = max(conn.next_deadline() - now, 0.0)
            timeout = until_keepalive if timeout is None else min(timeout, until_keepalive)
        mask = selectors.EVENT_READ | (selectors.EVENT_WRITE if self._wbuf else 0)
        if mask != self._mask:
            self._selector.modify(sock, mask)
            self._mask = mask
        ready = self._selector.select(timeout)
        if ready:
            events = ready[0][1]
            if events & selectors.EVENT_WRITE:
                self._send_some()
            if events & selectors.EVENT_READ:
                self._read_available()
        self._keepalive()
        return deadline is not None and time.monotonic() >= deadline

    def _wait_until(self, condition: Callable[[], bool], deadline: float | None, what: str) -> None:
        """Do I/O until ``condition()`` holds (lock held).

        ``condition`` is checked before each wait and once more after the
        deadline has passed (so a zero timeout still processes what the
        socket holds). Raises :class:`ConnectionLost` if the connection ends
        first and :class:`TimeoutError` if ``deadline`` passes first.
        """
        expired = False
        while not condition():
            self._check_open()
            if expired:
                raise TimeoutError(f"{what} timed out")
            expired = self._step(deadline)

    def _ready(self) -> bool:
        """The connection takes new frames now (it is not being replaced)."""
        return self._broken is None or self._attempting

    def _attempt(self, action: Callable[[], object]) -> bool:
        """Run ``action`` if the connection is open; False if it lacked
        guarantees or is being replaced."""
        self._check_open()
        if not self._ready():
            return False
        try:
            action()
        except NoGuarantees:
            return False
        return True

    def _round_trip(self, deadline: float | None, what: str) -> None:
        """Wait until the broker has processed everything sent so far (a Ping's
        Pong; done again on the new connection if this one is replaced)."""
        while True:
            self._wait_until(self._ready, deadline, what)
            generation = self._generation
            nonce = self._conn.ping()

            def answered(nonce: int = nonce, generation: int = generation) -> bool:
                return self._pong >= nonce or self._generation != generation

            self._wait_until(answered, deadline, what)
            if self._generation == generation:
                return

    def _release(self, event: DeliverReceived | DeliverManyReceived) -> None:
        """A delivery is done with: free its space (promised again per policy)."""
        if not self._conn.closed:
            self._conn.release(event)

    def _release_frames(self, handle: int, size: int, count: int) -> None:
        """``count`` messages in frames of ``size`` bytes on subscription
        ``handle`` are done with: free their space."""
        if not self._conn.closed:
            self._conn.release_frames(Channel(ChannelKind.DELIVER, handle), size, count)

    def _ack(self, handle: int, seq: int) -> None:
        """Tell the broker every delivery up to ``seq`` on ``handle`` is processed."""
        if not self._conn.closed and self._ready():
            with contextlib.suppress(LocalProtocolError):  # the subscription is being freed
                self._conn.ack(handle, seq)

    # ---------------------------------------------------------------- topics

    def _topic_nowait(self, topic: str, stage: Stage | None = None) -> int:
        """The topic's handle (staged in ``stage``, if given), binding it on
        first use; :class:`NoGuarantees` if no room (or the handle is being
        released: it is bound anew once it is)."""
        key = topic if stage is None else (topic, stage)
        handle = self._topics.get(key)
        if handle is None:
            self._check_open()
            handle = self._cache.bind(self._conn, key, topic, stage)
        return handle

    def _bound(self, topic: str, deadline: float | None, what: str) -> int:
        """The topic's handle once the broker confirmed it, binding it (waiting
        for room) if needed."""
        handles: list[int] = []
        self._wait_until(
            lambda: self._attempt(lambda: handles.append(self._topic_nowait(topic))),
            deadline,
            what,
        )
        self._cache.pin(handles[0])  # the caller unpins it once its Subscribe is sent
        try:
            self._wait_until(
                lambda: self._conn.confirmed(HandleType.TOPIC, handles[0]), deadline, what
            )
        except BaseException:
            self._cache.unpin(handles[0])
            raise
        return handles[0]

    # ---------------------------------------------------------------- publishing

    def publish(
        self,
        topic: str,
        payload: bytes,
        *,
        key: bytes | None = None,
        headers: Headers | None = None,
        timeout: float | None = None,
        stage: Stage | None = None,
    ) -> None:
        """Publish one message, waiting up to ``timeout`` seconds for the broker's guarantees.

        With a ``stage``, the broker holds the message (staged) instead of
        routing it, until a :meth:`commit` of the stage's batch lists its
        member; see :meth:`finish_stage`.

        Once it returns, the broker is certain to accept the message (it is
        queued for the socket; :meth:`flush` waits until it is routed); with
        ``optimism``, the broker may drop it, and the client then resends it. While
        there is no room it writes what is pending and reads the socket, so
        backpressure from the broker slows the caller. Raises
        :class:`TimeoutError` (nothing published) when the time is up and
        :class:`ConnectionLost` if the connection ends. A message too large
        for the broker's ``max_frame`` raises
        :class:`~broker.protocol.LocalProtocolError`, a bad ``topic`` name
        :class:`~broker.protocol.TopicNameError`.
        """
        check_topic_name(topic)
        deadline = _deadline(timeout)
        with self._locked(deadline):
            self._publish(topic, payload, key, headers, deadline, stage)
            if stage is not None:
                self._stage_counts[stage] = self._stage_counts.get(stage, 0) + 1
            self._after_operation()

    def _publish(
        self,
        topic: str,
        payload: bytes,
        key: bytes | None,
        headers: Headers | None,
        deadline: float | None,
        stage: Stage | None = None,
    ) -> None:
        """Publish, waiting for room (lock held)."""

        def publish_now() -> None:
            handle = self._topic_nowait(topic, stage)
            self._cache.publish(self._conn, handle, payload, key, headers)

        self._wait_until(lambda: self._attempt(publish_now), deadline, "publish")

    def publish_nowait(
        self,
        topic: str,
        payload: bytes,
        *,
        key: bytes | None = None,
        headers: Headers | None = None,
    ) -> None:
        """Publish if the guarantees allow it now; else :class:`BlockingIOError`.

        Before giving up it processes what the socket already holds (which
        may bring guarantees), without waiting. ``BlockingIOError`` (errno
        ``EAGAIN``) means nothing was published; retry later, or use
        :meth:`publish`; so does a connection being replaced. Once it
        returns, the broker is certain to accept the message (with
        ``optimism``: once the client has resent it, if it was dropped). A
        bad ``topic`` name raises :class:`~broker.protocol.TopicNameError`.
        """
        check_topic_name(topic)
        with self._lock:
            for attempt in range(2):
                self._check_open()
                if not self._ready():
                    raise BlockingIOError(errno.EAGAIN, "reconnecting to the broker")
                try:
                    handle = self._topic_nowait(topic)
                    self._cache.publish(self._conn, handle, payload, key, headers)
                except NoGuarantees:
                    if attempt == 0:
                        self._service()
                        continue
                    self._after_operation(urgent=True)  # (releases that make room)
                    raise BlockingIOError(
                        errno.EAGAIN, f"no guarantees to publish on {topic!r} now"
                    ) from None
                self._after_operation()
                return

    def flush(self, timeout: float | None = None) -> None:
        """Write everything pending and wait until the broker has routed every
        message published so far (its ``Confirm`` counts cover them).

        Raises :class:`TimeoutError` when ``timeout`` seconds pass first and
        :class:`ConnectionLost` if the connection has ended or ends first.
        """
        deadline = _deadline(timeout)
        with self._locked(deadline):
            self._check_open()
            self._wait_until(
                lambda: (
                    self._broken is None
                    and not (self._wbuf or self._conn.bytes_to_send)
                    and self._all_confirmed(self._published)
                ),
                deadline,
                "flush",
            )

    # ---------------------------------------------------------------- staging

    def finish_stage(self, stage: Stage, timeout: float | None = None) -> int:
        """Wait until the broker holds every message published with ``stage``
        (a :meth:`flush`), let go of the stage's topic handles, and return
        how many messages were published with it: the count its batch's
        :meth:`commit` must list for ``stage.member``."""
        deadline = _deadline(timeout)
        with self._locked(deadline):
            self.flush(timeout=None if deadline is None else max(deadline - time.monotonic(), 0))
            conn = self._conn
            for key, handle in list(self._topics.items()):
                if not isinstance(key, tuple) or key[1] != stage:
                    continue
                del self._topics[key]
                self._published.pop(handle, None)
                self._confirmed.pop(handle, None)
                if not conn.closed and self._ready():
                    with contextlib.suppress(LocalProtocolError):  # already being freed
                        conn.free_handle(HandleType.TOPIC, handle)
            self._after_operation(urgent=True)
            return self._stage_counts.pop(stage, 0)

    def commit(
        self, batch: str, members: Iterable[tuple[str, int]], *, timeout: float | None = None
    ) -> Outcome:
        """Make the listed members of ``batch`` visible (each with the number
        of messages it staged, as :meth:`finish_stage` returned it), in this
        order, and discard the batch's other members; returns once the
        broker has routed them.

        Idempotent: a batch committed before is answered ``DUPLICATE`` and
        nothing more is routed (a commit cut off by a broken connection is
        sent again after the reconnection). Raises
        :class:`~broker.client.StagingRefused` if the broker refuses (a
        member's count differs from what it staged: something was lost, so
        nothing is made visible; or the batch was aborted).
        """
        listed = list(members)
        outcome = self._request(lambda: self._conn.commit(batch, listed), timeout, "commit")
        return check_outcome(batch, outcome)

    def abort(self, batch: str, *, timeout: float | None = None) -> Outcome:
        """Discard what ``batch`` staged so far (``outcome.messages``: how
        many); the batch may be staged and committed afresh afterwards.
        Raises :class:`~broker.client.StagingRefused` if the batch was
        committed."""
        outcome = self._request(lambda: self._conn.abort(batch), timeout, "abort")
        return check_outcome(batch, outcome)

    def _request(self, send: Callable[[], int], timeout: float | None, what: str) -> Outcome:
        """Send a Commit or Abort (``send()`` queues it and returns its number)
        and wait for its Outcome; sent again on a new connection if the
        connection is replaced first (both are idempotent)."""
        deadline = _deadline(timeout)
        with self._locked(deadline):
            while True:
                self._wait_until(self._ready, deadline, what)
                generation = self._generation
                request = send()

                def answered(request: int = request, generation: int = generation) -> bool:
                    return request in self._outcomes or self._generation != generation

                self._wait_until(answered, deadline, what)
                if self._generation == generation:
                    return self._outcomes.pop(request)

    def _all_confirmed(self, targets: dict[int, int]) -> bool:
        """The broker's Confirm counts cover ``targets`` (publishes per topic
        handle; a handle released since had all its publishes confirmed)."""
        return all(self._confirmed.get(h, n) >= n for h, n in targets.items())

    # ---------------------------------------------------------------- subscribing

    def subscribe(
        self,
        topic: str,
        *,
        mode: str = "reliable",
        options: Options | None = None,
        timeout: float | None = None,
    ) -> BlockingSubscription:
        """Subscribe to ``topic``; returns once the broker has processed the subscription.

        Every message the broker routes on ``topic`` after it returns is
        delivered (``mode`` ``"reliable"``); in particular every message
        published, by any client, after it returns. With ``mode="lossy"`` or
        ``"latest"`` the broker drops instead of slowing publishers (queue
        limits in ``options``: ``max_queued``, ``max_queued_bytes``); the
        subscription's :attr:`~BlockingSubscription.missed` counts what was
        dropped.

        It binds the topic if needed, waits until the topic's handle is
        confirmed, subscribes, and waits until the subscription's handle is
        confirmed. A confirmed handle is only *certain* to be processed, so
        it then sends a Ping and waits for its Pong: the broker handles
        frames in order (and binds on arrival), so the Pong proves the
        Subscribe was processed. Waits up to ``timeout`` seconds in all
        (None: no limit). Raises :class:`TimeoutError` or
        :class:`ConnectionLost`; either way the subscription is closed again.
        A bad ``topic`` name raises :class:`~broker.protocol.TopicNameError`.
        """
        check_topic_name(topic)
        deadline = _deadline(timeout)
        with self._locked(deadline):
            subscription = BlockingSubscription(self, -1, topic)
            subscription.mode = mode
            subscription.options = options
            self._open_subscription(subscription, deadline, "subscribe")
            self._after_operation()
            return subscription

    def _open_subscription(
        self, subscription: BlockingSubscription, deadline: float | None, what: str
    ) -> None:
        """Subscribe ``subscription`` (binding its topic first) and wait until
        the broker has processed it; on failure it is closed (lock held)."""
        handle = self._bound(subscription.topic, deadline, what)
        handles: list[int] = []

        def subscribe_now() -> bool:
            return self._attempt(
                lambda: handles.append(
                    self._conn.subscribe(handle, subscription.mode, subscription.options)
                )
            )

        try:
            self._wait_until(
                lambda: subscribe_now() or self._subscribe_near_limit(subscribe_now, deadline),
                deadline,
                what,
            )
        finally:
            self._cache.unpin(handle)
        subscription.handle = handles[0]
        subscription._consumed = subscription._acked = 0
        self._subscriptions[subscription.handle] = subscription
        try:
            self._wait_until(
                lambda: self._conn.confirmed(HandleType.SUBSCRIPTION, subscription.handle),
                deadline,
                what,
            )
            self._round_trip(deadline, what)
        except BaseException:
            subscription.close()
            raise

    def _subscribe_near_limit(self, subscribe: Callable[[], bool], deadline: float | None) -> bool:
        """``subscribe()`` found no room: if the broker says it is near its
        limit, try again after a round trip (the room for what it processed
        comes first), and raise :class:`LimitReached` if there is still none."""
        if SUBSCRIPTION_BINDS not in self.throttled:
            return False
        self._round_trip(deadline, "subscribe")
        if subscribe():
            return True
        if SUBSCRIPTION_BINDS in self.throttled:
            raise subscription_limit(len(self._subscriptions))
        return False

    def _unsubscribe(self, subscription: BlockingSubscription) -> None:
        """Free the subscription's handle and release its queue (lock held)."""
        conn = self._conn
        handle = subscription.handle
        self._subscriptions.pop(handle, None)
        if not self._ready() and self._resume is not None:
            # Being replaced: the resumed session leaves it out (the broker drops it).
            state = self._resume
            subscriptions = {h: v for h, v in state.subscriptions.items() if h != handle}
            self._resume = dataclasses.replace(state, subscriptions=subscriptions)
            self._resuming.pop(handle, None)
        elif not conn.closed:
            if conn.confirmed(HandleType.SUBSCRIPTION, handle):
                conn.free_handle(HandleType.SUBSCRIPTION, handle)
            else:
                self._pending_frees.add(handle)  # freed once the Subscribe is confirmed
        size, count = subscription._inbox.clear()
        if count:
            self._release_frames(handle, size, count)
        if self._sock is not None:
            self._collect_output()
            self._send_some()

    # ---------------------------------------------------------------- closing

    def close(self, *, flush: bool = True, timeout: float | None = None) -> None:
        """Flush (by default, up to ``timeout`` seconds), say Goodbye and close the socket.

        Idempotent. On a connection that already ended it is quiet unless
        ``flush`` is asked for and some published message was never
        confirmed (then :class:`ConnectionLost`: those messages may be lost).
        A connection being replaced is waited for when flushing. The socket
        is closed even if flushing fails; the flush's :class:`TimeoutError`
        or :class:`ConnectionLost` is raised afterwards.
        """
        with self._lock:
            try:
                if flush and not self._closed_here:
                    if not self.closed:
                        self.flush(timeout)
                    elif not self._all_confirmed(self._published):
                        self._check_open()
            finally:
                self._closed_here = True
                self._stop.set()
                if self._sock is not None and self._ready():
                    self._say_goodbye()
                self._close_socket()
                self._broken = self._resume = None
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(LINGER_SECONDS)

    def _say_goodbye(self) -> None:
        """Goodbye 0, written within the linger time; then wait for the broker's EOF."""
        conn = self._conn
        conn.goodbye(GoodbyeCode.NORMAL, "bye")
        deadline = time.monotonic() + LINGER_SECONDS
        self._collect_output()
        if self._tls is not None and self._tls.established:
            self._tls.close()  # close_notify after the Goodbye
            self._collect_output()
        while self._wbuf and self._sock is not None:
            self._send_some()
            if self._wbuf and not self._wait_socket(selectors.EVENT_WRITE, deadline):
                return
        sock = self._sock
        if sock is None:
            return
        try:
            sock.shutdown(socket.SHUT_WR)
            # Read (and ignore) until the broker closes, so that closing does not
            # reset the connection before the broker has read our Goodbye.
            while self._wait_socket(selectors.EVENT_READ, deadline):
                if not sock.recv(RECEIVE_SIZE):
                    return
        except OSError:
            return  # the connection is going away anyway (or nothing to read yet)

    def _wait_socket(self, mask: int, deadline: float) -> bool:
        """Wait for readiness ``mask`` until ``deadline``; False if it did not come."""
        sock = self._sock
        if sock is None:
            return False
        if mask != self._mask:
            self._selector.modify(sock, mask)
            self._mask = mask
        timeout = deadline - time.monotonic()
        return timeout > 0 and bool(self._selector.select(timeout))

    def statistics(self) -> dict[str, int]:
        """Messages published/confirmed, live subscriptions, bytes, resumes, for
        scripts and tests (bytes count the current connection)."""
        with self._lock:
            return {
                **self._cache.statistics(),
                "subscriptions": len(self._subscriptions),
                "bytes_sent": self._conn.bytes_sent,
                "bytes_received": self._conn.bytes_received,
                "frames_resent": self.frames_resent,
                "bytes_unsent": len(self._wbuf) + self._conn.bytes_to_send,
                "resumes": self.resumes,
                "frames_resent_on_resume": self.frames_resent_on_resume,
                "sessions_lost": self.sessions_lost,
            }


def connect(
    url: str = "127.0.0.1:7400",
    *,
    name: str = "blocking-client",
    connect_timeout: float = 10.0,
    policy: Policy | None = None,
    token: str | None = None,
    ssl_context: ssl.SSLContext | None = None,
    optimism: int = 0,
    reconnect: float = 0.0,
    on_session_lost: Callable[[], object] | None = None,
) -> BlockingClient:
    """Connect a :class:`BlockingClient` to ``url`` (see its constructor)."""
    return BlockingClient(
        url,
        name=name,
        connect_timeout=connect_timeout,
        policy=policy,
        token=token,
        ssl_context=ssl_context,
        optimism=optimism,
        reconnect=reconnect,
        on_session_lost=on_session_lost,
    )
