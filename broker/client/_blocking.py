"""The blocking client, for plain threads: ``with BlockingClient(url) as client``.

A thin driver of the same sans-IO session as the trio client
(:class:`~broker.client._core.ClientSession`), over a plain socket
(``_socket.py``), and it keeps the same promises:

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
import errno
import logging
import ssl
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType
from typing import TypeVar

from broker.protocol import (
    ClientSessionState,
    Headers,
    Options,
    Outcome,
    Policy,
    Stage,
    check_topic_name,
)

from . import _flows as flows
from ._common import (
    PEER_CLOSED,
    ClientError,
    ConnectionLost,
    Message,
    check_outcome,
    client_policy,
    connection_target,
    show_address,
)
from ._core import ClientSession, Ending, SessionView
from ._socket import SocketPipe
from ._subscription import BATCH_MOST, SubscriptionState
from ._topics import DEFAULT_MAX_TOPICS

__all__ = ["SEND_THRESHOLD", "BlockingClient", "BlockingSubscription", "connect"]

log = logging.getLogger("broker.client")

#: Pending output above this many bytes is written at once (without waiting);
#: below it, output waits for the next wait, flush, close or heartbeat.
SEND_THRESHOLD = 64 * 1024
#: How long :meth:`BlockingClient.close` waits for its Goodbye to be written
#: and for the broker to close its end.
LINGER_SECONDS = 1.0

T = TypeVar("T")


def _deadline(timeout: float | None) -> float | None:
    """``timeout`` seconds from now on the monotonic clock (None: no deadline)."""
    if timeout is None:
        return None
    return time.monotonic() + max(timeout, 0.0)


def _remaining(deadline: float | None) -> float | None:
    """Seconds left until ``deadline`` (None: no limit)."""
    return None if deadline is None else max(deadline - time.monotonic(), 0.0)


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


class BlockingSubscription(SubscriptionState):
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

    def __init__(self, client: BlockingClient, topic: str) -> None:
        super().__init__(client._session, -1, topic)
        self._client = client

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
            if self._client._session.ended_normally():
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
            return self._take_batch(1)[0]

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
            return self._take_batch(1)[0]

    def _take_batch(self, limit: int) -> list[Message]:
        """Pop up to ``limit`` queued messages, releasing the room of the
        frames they complete as due (lock held)."""
        if not self._inbox:
            raise ClientError("the subscription is closed")
        messages = self._take_many(limit) if limit > 1 else [self._take()]
        self._client._after_operation(urgent=True)
        return messages

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
            client._session.unsubscribe(self)
            client._write_now()


class BlockingClient(SessionView):
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
        self._session = ClientSession(
            name,
            client_policy(policy, optimism),
            token,
            max_topics=max_topics,
            reconnect=reconnect,
            clock=time.monotonic,
        )
        self._connect_timeout = connect_timeout
        self._on_session_lost = on_session_lost
        self._lock = threading.RLock()
        self._service_requested = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pipe: SocketPipe | None = None
        with self._lock:
            self._open(time.monotonic() + connect_timeout, None)
        welcome = self._session.conn.welcome_message
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
        waited = round(deadline - time.monotonic(), 1)
        try:
            self._pipe = SocketPipe(host, port, deadline, self._context)
        except OSError as error:
            raise ConnectionLost(f"cannot connect to {host}:{port}: {error}") from error
        session = self._session
        try:
            conn = session.start(time.monotonic(), resume)
            self._wait_until(lambda: conn.welcome_message is not None, deadline, "handshake")
        except (TimeoutError, ConnectionLost) as error:
            self._close_pipe()
            lost = error if isinstance(error, ConnectionLost) else None
            tls = self._context is not None
            raise session.handshake_error(lost, show_address(host, port), waited, tls) from None
        except BaseException:
            self._close_pipe()
            raise

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
        return self._session.closed

    @property
    def reconnecting(self) -> bool:
        """The connection broke and is being replaced (see ``reconnect``)."""
        session = self._session
        return session.broken is not None and session.error is None

    @property
    def _sock(self) -> object | None:
        """The socket of the current connection (None: none is open)."""
        return None if self._pipe is None else self._pipe.sock

    def _check_open(self) -> None:
        self._session.check_open()

    def _fail(self, error: ConnectionLost) -> None:
        """The connection is over: write what we can, close the socket; then
        replace it (``reconnect``) or end the client."""
        pipe = self._pipe
        if pipe is not None:
            with contextlib.suppress(ConnectionLost):
                pipe.collect(self._session.conn)
                pipe.send_some()
        self._close_pipe()
        if self._session.fail(error, time.monotonic()) is Ending.ENDED:
            self._stop.set()

    def _close_pipe(self) -> None:
        pipe, self._pipe = self._pipe, None
        if pipe is not None:
            pipe.close()

    # ---------------------------------------------------------------- reconnecting

    def _reconnect_step(self, deadline: float | None) -> None:
        """While reconnecting: wait for the next attempt (no later than
        ``deadline``), or make it; the client ends once the plan gives up."""
        session = self._session
        plan = session.plan
        assert plan is not None
        now = time.monotonic()
        if now < plan.next_attempt:
            until = plan.next_attempt if deadline is None else min(deadline, plan.next_attempt)
            time.sleep(max(until - now, 0.0))
            return
        error = self._reconnect_attempt(plan.attempt_deadline(now, self._connect_timeout))
        if error is not None:
            session.attempt_failed(error, time.monotonic())
            if session.error is not None:
                self._stop.set()

    def _reconnect_attempt(self, deadline: float) -> ConnectionLost | None:
        """Connect once and resume the session (or restore a lost one); the error if not."""
        session = self._session
        state = session.begin_attempt(time.monotonic())
        try:
            self._open(deadline, state)
            session.check_open()  # it may have broken right after the Welcome
            lost = session.attempt_welcomed()
            if lost is not None:
                self._run(flows.restore(session, lost), deadline, "restoring the session")
        except (ConnectionLost, TimeoutError) as error:
            self._close_pipe()
            if isinstance(error, ConnectionLost):
                return error
            return ConnectionLost(f"restoring the session timed out: {error}")
        broke_again = session.attempt_error if self._pipe is None else None
        session.reconnected()
        if broke_again is not None:  # it broke again once the session was restored
            self._fail(broke_again)
        if lost is not None and self._on_session_lost is not None:
            self._on_session_lost()
        return None

    # ---------------------------------------------------------------- I/O

    def _write_now(self) -> None:
        """Write what is pending, as far as the socket takes it now."""
        pipe = self._pipe
        if pipe is None:
            return
        try:
            pipe.collect(self._session.conn)
            pipe.send_some()
        except ConnectionLost as error:
            self._fail(error)

    def _read_available(self) -> None:
        """Read and process everything the socket holds now (never waits)."""
        session = self._session
        while (pipe := self._pipe) is not None:
            try:
                data = pipe.read()
            except ConnectionLost as error:
                self._fail(error)
                return
            if data is None:
                return
            if data:
                lost = session.receive_data(data, time.monotonic())
                if lost is not None:
                    self._fail(lost)
                    return
            if pipe.eof:
                self._fail(ConnectionLost(PEER_CLOSED))
                return

    def _keepalive(self) -> None:
        """Ping when this side has been silent; give up on a silent broker."""
        if self._pipe is not None:
            lost = self._session.handle_timer(time.monotonic())
            if lost is not None:
                self._fail(lost)

    def _service(self) -> None:
        """Without waiting: read what is readable, keep alive, write what is pending."""
        self._service_requested = False
        if self._pipe is None:
            return
        self._read_available()
        self._keepalive()
        self._write_now()

    def _heartbeat_tick(self) -> None:
        """Called by the heartbeat thread: service now (or reconnect, when an
        attempt is due), or ask the lock's holder to.

        Never raises: an unexpected error ends the connection (and is logged),
        so the application sees it as :class:`ConnectionLost` on its next call.
        """
        if not self._lock.acquire(blocking=False):
            self._service_requested = True
            return
        session = self._session
        try:
            if session.broken is not None and session.error is None:
                plan = session.plan
                if plan is not None and time.monotonic() >= plan.next_attempt:
                    self._reconnect_step(time.monotonic())
            else:
                self._service()
        except Exception as error:
            log.exception("%s: heartbeat failed", session.name)
            session.broken = None
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
        pending = self._session.conn.bytes_to_send
        if pending >= SEND_THRESHOLD or (urgent and pending):
            self._write_now()
        if self._service_requested:
            self._service()

    def _step(self, deadline: float | None) -> bool:
        """Wait once for the socket, the next heartbeat or ``deadline``, and process it.

        Pending output is written while waiting; the socket is read whenever
        it is readable; a broken connection is replaced (``reconnect``).
        Returns whether ``deadline`` has passed.
        """
        session = self._session
        if session.broken is not None and not session.attempting:
            self._reconnect_step(deadline)
            return deadline is not None and time.monotonic() >= deadline
        self._write_now()
        pipe = self._pipe
        if pipe is None:
            self._check_open()
            if session.broken is not None and not session.attempting:
                return False  # it broke just now: reconnect on the next step
            raise ConnectionLost("the connection is closed")
        timeout = _remaining(deadline)
        due = session.next_deadline()
        if due is not None:
            until_timer = max(due - time.monotonic(), 0.0)
            timeout = until_timer if timeout is None else min(timeout, until_timer)
        try:
            readable, writable = pipe.wait(timeout)
            if writable:
                pipe.send_some()
        except ConnectionLost as error:
            self._fail(error)
            readable = False
        if readable:
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

    def _run(self, steps: flows.Steps[T], deadline: float | None, what: str) -> T:
        """Run one of the session's flows to its result, waiting as it asks (lock held)."""
        try:
            condition = next(steps)
            while True:
                self._wait_until(condition, deadline, what)
                condition = steps.send(None)
        except StopIteration as stop:
            result: T = stop.value
            return result
        finally:
            steps.close()

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
        deadline = _deadline(timeout)
        session = self._session
        with self._locked(deadline):
            if not session.try_publish(topic, payload, key, headers, stage):
                self._wait_until(
                    lambda: session.try_publish(topic, payload, key, headers, stage),
                    deadline,
                    "publish",
                )
            self._after_operation()

    def publish_nowait(
        self,
        topic: str,
        payload: bytes,
        *,
        key: bytes | None = None,
        headers: Headers | None = None,
        stage: Stage | None = None,
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
        session = self._session
        with self._lock:
            for attempt in range(2):
                self._check_open()
                if not session.ready:
                    raise BlockingIOError(errno.EAGAIN, "reconnecting to the broker")
                if session.try_publish(topic, payload, key, headers, stage):
                    self._after_operation()
                    return
                if attempt == 0:
                    self._service()
            self._after_operation(urgent=True)  # (releases that make room)
            raise BlockingIOError(errno.EAGAIN, f"no guarantees to publish on {topic!r} now")

    def flush(self, timeout: float | None = None) -> None:
        """Write everything pending and wait until the broker has routed every
        message published so far (its ``Confirm`` counts cover them).

        Raises :class:`TimeoutError` when ``timeout`` seconds pass first and
        :class:`ConnectionLost` if the connection has ended or ends first.
        """
        deadline = _deadline(timeout)
        session = self._session
        with self._locked(deadline):
            self._check_open()
            targets = session.flush_targets()

            def flushed() -> bool:
                pipe = self._pipe
                return (
                    session.broken is None
                    and not (pipe is not None and pipe.wbuf)
                    and not session.conn.bytes_to_send
                    and session.all_confirmed(targets)
                )

            self._wait_until(flushed, deadline, "flush")

    # ---------------------------------------------------------------- staging

    def finish_stage(self, stage: Stage, timeout: float | None = None) -> int:
        """Wait until the broker holds every message published with ``stage``
        (a :meth:`flush`), let go of the stage's topic handles, and return
        how many messages were published with it: the count its batch's
        :meth:`commit` must list for ``stage.member``."""
        deadline = _deadline(timeout)
        with self._locked(deadline):
            self.flush(timeout=_remaining(deadline))
            count = self._session.finish_stage(stage)
            self._after_operation(urgent=True)
            return count

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
        steps = flows.request(self._session, lambda conn: conn.commit(batch, listed))
        return check_outcome(batch, self._request(steps, timeout, "commit"))

    def abort(self, batch: str, *, timeout: float | None = None) -> Outcome:
        """Discard what ``batch`` staged so far (``outcome.messages``: how
        many); the batch may be staged and committed afresh afterwards.
        Raises :class:`~broker.client.StagingRefused` if the batch was
        committed."""
        steps = flows.request(self._session, lambda conn: conn.abort(batch))
        return check_outcome(batch, self._request(steps, timeout, "abort"))

    def _request(self, steps: flows.Steps[Outcome], timeout: float | None, what: str) -> Outcome:
        deadline = _deadline(timeout)
        with self._locked(deadline):
            return self._run(steps, deadline, what)

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
            subscription = BlockingSubscription(self, topic)
            subscription.mode = mode
            subscription.options = options
            try:
                self._run(
                    flows.open_subscription(self._session, subscription), deadline, what="subscribe"
                )
            except BaseException:
                if subscription.handle >= 0:
                    subscription.close()
                raise
            self._after_operation()
            return subscription

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
        session = self._session
        with self._lock:
            try:
                if flush and not session.closing:
                    if not self.closed:
                        self.flush(timeout)
                    elif not session.all_confirmed(session.published):
                        self._check_open()
            finally:
                goodbye = self._pipe is not None and session.ready
                session.close_here()
                self._stop.set()
                if goodbye and self._pipe is not None:
                    session.conn.goodbye(0, "bye")
                    self._pipe.linger(session.conn, LINGER_SECONDS)
                self._close_pipe()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(LINGER_SECONDS)

    def statistics(self) -> dict[str, int]:
        """Messages published/confirmed, live subscriptions, bytes, resumes, for
        scripts and tests (bytes count the current connection)."""
        with self._lock:
            unsent = 0 if self._pipe is None else len(self._pipe.wbuf)
            statistics = self._session.statistics()
            statistics["bytes_unsent"] = unsent + self._session.conn.bytes_to_send
            return statistics


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
