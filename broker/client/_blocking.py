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

import errno
import ssl
import threading
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType

from broker.protocol import (
    AdminValue,
    Answer,
    Headers,
    Options,
    Outcome,
    Policy,
    Stage,
    check_topic_name,
)

from . import _flows as flows
from ._blocking_driver import SEND_THRESHOLD, BlockingDriver, deadline_in, remaining
from ._common import ClientError, ConnectionLost, Message, check_outcome, offsets_answer
from ._settles import flush_settles, settle
from ._start import Start, check_subscription_target, group_options, subscribe_options
from ._subscription import BATCH_MOST, SubscriptionState

__all__ = ["SEND_THRESHOLD", "BlockingClient", "BlockingSubscription", "connect"]


#: How long :meth:`BlockingClient.close` waits for its Goodbye to be written
#: and for the broker to close its end.
LINGER_SECONDS = 1.0


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

    def _settle(self, seq: int, outcome: int, detail: int | str | None) -> None:
        client = self._client
        with client._lock:
            settle(client._session, self, seq, outcome, detail)
            client._after_operation(urgent=outcome != 0)

    def settled(self, timeout: float | None = None) -> None:
        """Wait up to ``timeout`` seconds until the broker has every settle of
        this group member's messages made so far (see
        ``Subscription.settled``); raises :class:`TimeoutError` or
        :class:`ConnectionLost`."""
        deadline = deadline_in(timeout)
        client = self._client
        with client._locked(deadline):
            session = client._session
            client._check_open()
            flush_settles(session, self)
            nonce = session.ping()
            client._after_operation(urgent=True)
            client._wait_until(lambda: session.pong >= nonce, deadline, "settled")

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
        deadline = deadline_in(timeout)
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
        deadline = deadline_in(timeout)
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
            raise ClientError(self.ended or "the subscription is closed")
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


class BlockingClient(BlockingDriver):
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
        deadline = deadline_in(timeout)
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
        deadline = deadline_in(timeout)
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
        deadline = deadline_in(timeout)
        with self._locked(deadline):
            self.flush(timeout=remaining(deadline))
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

    def offsets(
        self, topics: Iterable[str] | None = None, *, timeout: float | None = None
    ) -> dict[str, tuple[int, int]]:
        """``{topic: (first, end)}`` of ``topics`` (None: every topic with a
        log this client may subscribe to); see
        :meth:`broker.client.Client.offsets`."""
        names = None if topics is None else list(topics)
        for name in names or ():
            check_topic_name(name)
        steps = flows.request(self._session, lambda conn: conn.list_offsets(names))
        return offsets_answer(self._request(steps, timeout, "list offsets"))

    def admin(
        self, command: str, *, timeout: float | None = None, **arguments: AdminValue
    ) -> list[dict[str, AdminValue]]:
        """Topic administration: see :meth:`broker.client.Client.admin`."""
        steps = flows.admin(self._session, command, arguments)
        deadline = deadline_in(timeout)
        with self._locked(deadline):
            return self._run(steps, deadline, command)

    def _request(self, steps: flows.Steps[Answer], timeout: float | None, what: str) -> Answer:
        deadline = deadline_in(timeout)
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
        start: Start | None = None,
        cursor: str | None = None,
        timestamps: bool = False,
        group: str | None = None,
        max_outstanding: int | None = None,
    ) -> BlockingSubscription:
        """Subscribe to ``topic``; returns once the broker has processed the subscription.

        Every message the broker routes on ``topic`` after it returns is
        delivered (``mode`` ``"reliable"``); in particular every message
        published, by any client, after it returns. With ``mode="lossy"`` or
        ``"latest"`` the broker drops instead of slowing publishers (queue
        limits in ``options``: ``max_queued``, ``max_queued_bytes``); the
        subscription's :attr:`~BlockingSubscription.missed` counts what was
        dropped.

        On a broker that keeps topic logs, ``start`` (``"earliest"``,
        ``"latest"``, an offset or a timezone-aware datetime) and ``cursor``
        (a durable cursor's name) say where a reliable subscription starts,
        and messages carry their :attr:`~broker.client.Message.offset`
        (and with ``timestamps=True`` their
        :attr:`~broker.client.Message.timestamp`, the record's receive time);
        see :meth:`broker.client.Client.subscribe`, which also says what
        ``group`` (a consumer group's member, settling each message) and
        ``max_outstanding`` are. A bad value, either with
        another ``mode`` or with the same option in ``options``, raises
        :class:`ValueError` before anything is sent, and so does
        :class:`ClientError` on a broker without topic logs.

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
        check_subscription_target(topic, group, timestamps, options)
        options = subscribe_options(mode, options, start, cursor, timestamps)
        options = group_options(options, mode, group, max_outstanding)
        deadline = deadline_in(timeout)
        with self._locked(deadline):
            subscription = BlockingSubscription(self, topic)
            subscription.mode = mode
            subscription.options = options
            try:
                self._run(
                    flows.open_subscription(self._session, subscription), deadline, what="subscribe"
                )
                self._check_open()  # (a refusal's Goodbye may come with the Pong)
            except BaseException:
                if subscription.handle >= 0:
                    subscription.close()
                raise
            self._after_operation()
            return subscription

    # ---------------------------------------------------------------- closing

    def _take_lock_to_close(self, deadline: float | None) -> TimeoutError | None:
        """Hold the client's lock to close it. If another thread keeps it
        past ``deadline`` (a call waiting without a timeout), its wait is
        broken (the socket shut down, no reconnecting: that call raises
        :class:`ConnectionLost`) and the lock taken then; returns the
        :class:`TimeoutError` that :meth:`close` raises once closed."""
        if self._acquire(deadline):
            return None
        self._session.closing = True  # (a plain flag: the holder sees it when its wait breaks)
        pipe = self._pipe
        if pipe is not None:
            pipe.shutdown()
        self._lock.acquire()
        return TimeoutError("another thread kept the client busy: closed without flushing")

    def close(self, *, flush: bool = True, timeout: float | None = None) -> None:
        """Flush (by default, up to ``timeout`` seconds), say Goodbye and close the socket.

        Idempotent. On a connection that already ended it is quiet unless
        ``flush`` is asked for and some published message was never
        confirmed (then :class:`ConnectionLost`: those messages may be lost).
        A connection being replaced is waited for when flushing. The socket
        is closed even if flushing fails; the flush's :class:`TimeoutError`
        or :class:`ConnectionLost` is raised afterwards. If another thread
        keeps the client busy past ``timeout`` (a call waiting without a
        timeout of its own), that call is made to raise
        :class:`ConnectionLost`, the client is closed without flushing, and
        :class:`TimeoutError` is raised.
        """
        session = self._session
        busy = self._take_lock_to_close(deadline_in(timeout))
        flush = flush and busy is None
        try:
            try:
                if flush and not session.closing:
                    if not self.closed:
                        self.flush(timeout)
                    elif not session.all_confirmed(session.published):
                        self._check_open()
            finally:
                goodbye = self._pipe is not None and session.ready
                if goodbye:
                    session.ack_consumed(session.subscriptions.values())  # (a cursor's place)
                session.close_here()
                self._stop_heartbeat()
                if goodbye and self._pipe is not None:
                    session.conn.goodbye(0, "bye")
                    self._pipe.linger(session.conn, LINGER_SECONDS)
                self._close_pipe()
        finally:
            self._lock.release()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(LINGER_SECONDS)
        if busy is not None:
            raise busy

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
