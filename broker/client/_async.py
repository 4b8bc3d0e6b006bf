"""The trio client: ``async with open_client(url) as client``.

The operations of the trio client; :class:`~._trio_driver.TrioDriver`
drives its sans-IO session (``_core.py``) with trio tasks.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager

import trio

from broker.errors import sole_exception
from broker.protocol import (
    AdminValue,
    GoodbyeCode,
    Headers,
    Options,
    Outcome,
    Policy,
    Stage,
    check_topic_name,
)

from . import _flows as flows
from ._common import (
    ClientError,
    ConnectionLost,
    Message,
    check_outcome,
    client_policy,
    connection_target,
    offsets_answer,
    show_address,
    split_url,
)
from ._settles import flush_settles, settle
from ._start import Start, check_subscription_target, group_options, subscribe_options
from ._subscription import BATCH_MOST, SubscriptionState
from ._tls import failure_hint
from ._topics import DEFAULT_MAX_TOPICS
from ._trio_driver import TrioDriver

#: The async client yields to the scheduler at least once per this many
#: publishes that did not have to wait, so its writer can batch them.
PUBLISHES_PER_YIELD = 64


class Subscription(SubscriptionState):
    """Messages of one subscription, in order: ``async for message in sub``.

    Each message consumed frees its space in the delivery channel's buffer,
    and the client promises that space to the broker again: the
    subscriber's consumption is the window, so a slow consumer slows the
    publishers feeding it instead of growing anybody's memory.
    """

    def __init__(self, client: Client, topic: str) -> None:
        super().__init__(client._session, -1, topic)
        self._client = client
        self._since_yield = 0

    def __aiter__(self) -> Subscription:
        return self

    def _settle(self, seq: int, outcome: int, detail: int | str | None) -> None:
        settle(self._client._session, self, seq, outcome, detail)

    async def settled(self) -> None:
        """Wait until the broker has every settle of this group member's
        messages made so far (JetStream's double ack): it has written them,
        so none of those records settled *done* comes again, even after a
        crash of the broker. Raises :class:`ConnectionLost` like ``flush``."""
        client = self._client
        session = client._session
        client._check_open()
        flush_settles(session, self)
        nonce = session.ping()
        client._wake_writer()
        await client._wait_for(lambda: session.pong >= nonce)

    async def __anext__(self) -> Message:
        try:
            return await self.receive()
        except ConnectionLost as error:
            if error.code == GoodbyeCode.NORMAL or self._closed:
                raise StopAsyncIteration from None
            raise
        except ClientError:
            if self.ended is not None:
                raise StopAsyncIteration from None  # (the broker ended it: a clean end)
            raise

    def receive_nowait(self) -> Message:
        """The next message, or :class:`trio.WouldBlock` if none is here yet."""
        if not self._inbox:
            self._client._check_open()
            if self._closed:
                raise ClientError(self.ended or "the subscription is closed")
            raise trio.WouldBlock
        return self._take()

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
        if not self._inbox.messages:
            self.receive_nowait()  # raises why there is none
        return self._take_many(max_messages)

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


class Client(TrioDriver):
    """A connection to a broker; see :func:`open_client`."""

    # ---------------------------------------------------------------- publishing

    def publish_nowait(
        self,
        topic: str,
        payload: bytes,
        *,
        key: bytes | None = None,
        headers: Headers | None = None,
        stage: Stage | None = None,
    ) -> None:
        """Publish if the topic's guarantees allow it now; else :class:`trio.WouldBlock`.

        Once it returns, the broker is certain to accept the message (with
        ``optimism``: once the client has resent it, if it was dropped).
        While the client reconnects (see :func:`open_client`) it waits. A bad
        ``topic`` name raises :class:`~broker.protocol.TopicNameError`.
        """
        session = self._session
        if session.broken is not None:
            check_topic_name(topic)
            self._check_open()
            raise trio.WouldBlock
        if not session.try_publish(topic, payload, key, headers, stage):
            self._check_open()
            self._wake_writer()  # (a bind, or a release making room)
            raise trio.WouldBlock
        self._wakeup.set()

    async def publish(
        self,
        topic: str,
        payload: bytes,
        *,
        key: bytes | None = None,
        headers: Headers | None = None,
        stage: Stage | None = None,
    ) -> None:
        """Publish, waiting for the topic's guarantees: backpressure reaches the caller.

        With a ``stage``, the broker holds the message (staged) instead of
        routing it, until a :meth:`commit` of the stage's batch lists its
        member; see :meth:`finish_stage`.

        Always checks for cancellation; yields to other tasks when it waits,
        and otherwise at least once per ``PUBLISHES_PER_YIELD`` calls (so a
        tight publishing loop lets the writer batch its frames). A bad
        ``topic`` name raises :class:`~broker.protocol.TopicNameError`.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        session = self._session
        if session.broken is not None or not session.try_publish(
            topic, payload, key, headers, stage
        ):
            self._since_yield = 0
            while True:
                try:
                    self.publish_nowait(topic, payload, key=key, headers=headers, stage=stage)
                    break
                except trio.WouldBlock:
                    await self._changed.park()
        self._wakeup.set()
        self._since_yield += 1
        if self._since_yield >= PUBLISHES_PER_YIELD:
            self._since_yield = 0
            await trio.lowlevel.cancel_shielded_checkpoint()

    async def flush(self) -> None:
        """Wait until the broker has routed every message published so far.

        Raises :class:`ConnectionLost` if the connection has ended (even with
        nothing outstanding) or ends first, like ``BlockingClient.flush``.
        """
        await trio.lowlevel.checkpoint()
        self._check_open()
        self._wake_writer()
        session = self._session
        targets = session.flush_targets()
        await self._wait_for(lambda: session.all_confirmed(targets))

    # ---------------------------------------------------------------- staging

    async def finish_stage(self, stage: Stage) -> int:
        """Wait until the broker holds every message published with ``stage``
        (a :meth:`flush`), let go of the stage's topic handles, and return
        how many messages were published with it: the count its batch's
        :meth:`commit` must list for ``stage.member``."""
        await self.flush()
        count = self._session.finish_stage(stage)
        self._wake_writer()
        return count

    async def commit(self, batch: str, members: Iterable[tuple[str, int]]) -> Outcome:
        """Make the listed members of ``batch`` visible (each with the number
        of messages it staged, as :meth:`finish_stage` returned it), in this
        order, and discard the batch's other members; returns once the
        broker has routed them. Idempotent (a batch committed before is
        answered ``DUPLICATE``); raises
        :class:`~broker.client.StagingRefused` if the broker refuses."""
        listed = list(members)
        await self._ready_for_the_application()
        steps = flows.request(self._session, lambda conn: conn.commit(batch, listed))
        return check_outcome(batch, await self._run_flow(steps))

    async def abort(self, batch: str) -> Outcome:
        """Discard what ``batch`` staged so far (``outcome.messages``: how
        many). Raises :class:`~broker.client.StagingRefused` if the batch
        was committed."""
        await self._ready_for_the_application()
        steps = flows.request(self._session, lambda conn: conn.abort(batch))
        return check_outcome(batch, await self._run_flow(steps))

    async def offsets(self, topics: Iterable[str] | None = None) -> dict[str, tuple[int, int]]:
        """``{topic: (first, end)}`` of ``topics`` (None: of every topic the
        broker keeps a log of that this client may subscribe to): ``first``
        is the offset of the first record kept, ``end`` the offset the next
        record will get (Kafka's beginning and end offsets; equal when the
        log holds nothing). A topic without a log is left out (nothing is
        created). Raises :class:`ClientError` on a broker without topic
        logs; naming a topic the client may not subscribe to ends the
        connection (Goodbye 6)."""
        names = None if topics is None else list(topics)
        for name in names or ():
            check_topic_name(name)
        await self._ready_for_the_application()
        steps = flows.request(self._session, lambda conn: conn.list_offsets(names))
        return offsets_answer(await self._run_flow(steps))

    async def admin(self, command: str, **arguments: AdminValue) -> list[dict[str, AdminValue]]:
        """Topic administration (Kafka's admin client; see "Topic
        administration" in docs/broker.md): ``command`` is ``"topics"``
        (``pattern=``), ``"delete-topic"`` (``topic=``), ``"purge-topic"``
        (``topic=``, ``before=``), ``"cursors"`` (``pattern=``),
        ``"delete-cursor"`` (``topic=``, ``cursor=``, ``principal=``),
        ``"groups"`` (``pattern=``) or ``"delete-group"`` (``topic=``,
        ``group=``, ``principal=``);
        returns the answer's rows, one map per topic, cursor or group (all
        pages).
        Allowed to principals with the ``admin`` permission (everyone on a
        broker without authentication); a refusal raises
        :class:`~broker.client.AdminRefused` with the broker's one line."""
        await self._ready_for_the_application()
        return await self._run_flow(flows.admin(self._session, command, arguments))

    # ---------------------------------------------------------------- subscribing

    @asynccontextmanager
    async def subscribe(
        self,
        topic: str,
        *,
        mode: str = "reliable",
        options: Options | None = None,
        start: Start | None = None,
        cursor: str | None = None,
        timestamps: bool = False,
        group: str | None = None,
        max_outstanding: int | None = None,
    ) -> AsyncIterator[Subscription]:
        """Subscribe to ``topic`` for the duration of the block.

        Returns once the broker has processed the subscription: every message
        published after that is delivered (``mode="reliable"``). With
        ``"lossy"`` or ``"latest"`` the broker drops instead of slowing
        publishers (queue limits in ``options``: ``max_queued``,
        ``max_queued_bytes``); :attr:`Subscription.missed` counts the drops.

        On a broker that keeps topic logs, a reliable subscription may start
        elsewhere than at the next message published: ``start`` is
        ``"earliest"`` (the first record retained), ``"latest"`` (the
        default), an offset (``message.offset + 1`` continues after a message
        seen before) or a timezone-aware :class:`datetime.datetime` (the
        first record received at or after it); ``cursor`` names a durable
        cursor that the broker keeps (per principal and topic), which goes
        on after its last acknowledged record (``start`` then applies only
        the first time). Messages then carry their :attr:`Message.offset`.
        With ``timestamps=True`` they carry their :attr:`Message.timestamp`
        too: the time the broker received each record (ms since the epoch).
        With ``group`` the subscription is a member of that consumer group
        (per principal and topic): the group's members share the topic's
        records, each settled with :meth:`Message.ack`, ``retry``,
        ``reject`` or ``in_progress`` (see "Consumer groups" in
        docs/broker.md); ``max_outstanding`` is how many unsettled records
        it may hold (the broker's default: 1000), and ``options`` may carry
        the group's ``ack_wait``, ``max_deliveries``, ``dead_letters`` and
        ``ordering``. ``start`` then applies to a group seen for the first
        time.
        On a broker without topic logs (its Welcome did not say
        ``offsets``) they raise :class:`ClientError` before anything is sent
        (the broker would end the connection).

        A bad ``topic`` name raises :class:`~broker.protocol.TopicNameError`;
        a bad ``start`` or ``cursor``, either with another ``mode`` or with
        the same option in ``options``, raises :class:`ValueError`.
        """
        check_subscription_target(topic, group, timestamps, options)
        options = subscribe_options(mode, options, start, cursor, timestamps)
        options = group_options(options, mode, group, max_outstanding)
        await self._ready_for_the_application()
        subscription = Subscription(self, topic)
        subscription.mode = mode
        subscription.options = options
        try:
            await self._run_flow(flows.open_subscription(self._session, subscription))
            # (A refusal ends the connection: its Goodbye may come in the read
            # that brought the Pong the flow waited for.)
            self._check_open()
            yield subscription
        finally:
            subscription._closed = True
            if self._reconnecting:
                # The session being resumed still holds the subscription: free
                # it on the connection that replaces this one.
                with (
                    trio.CancelScope(shield=True),
                    trio.move_on_after(10),
                    contextlib.suppress(ConnectionLost),
                ):
                    await self._ready_for_the_application()
            if subscription.handle >= 0:
                self._session.unsubscribe(subscription)
                self._wake_writer()
            self._changed.unpark_all()

    # ---------------------------------------------------------------- closing

    async def aclose(self, *, flush: bool = True) -> None:
        """Flush (by default), say Goodbye and close the connection.

        With ``flush``, a connection that already broke raises
        :class:`ConnectionLost` if published messages were never confirmed;
        ``flush=False`` accepts that. Later calls do nothing.
        """
        session = self._session
        if session.closing:
            return
        if flush:
            # Before closing: a connection that breaks meanwhile is replaced
            # and the session resumed (with ``reconnect``), as for any flush.
            with contextlib.suppress(ConnectionLost):  # then raised below, if anything is lost
                await self._ready_for_the_application()
                if session.error is None and not session.conn.closed:
                    await self.flush()
        session.closing = True
        if session.error is None and not session.conn.closed:
            session.ack_consumed(session.subscriptions.values())  # (a cursor's place)
            session.conn.goodbye(GoodbyeCode.NORMAL, "bye")
            self._wake_writer()
        elif flush and not session.all_confirmed(session.published):
            # Never leave quietly with messages the broker may not have routed.
            raise session.error or ConnectionLost("the client is closed")
        # Tasks waiting for guarantees or messages learn that the client is closed.
        self._changed.unpark_all()

    def statistics(self) -> dict[str, int]:
        """Messages published/confirmed and subscriptions, for scripts and tests."""
        return self._session.statistics()


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
    open_stream: Callable[[], Awaitable[trio.abc.Stream]] | None = None,
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

    ``open_stream``, if given, opens each connection's stream (any trio
    stream, e.g. a test's in-memory one) instead of a TCP connection to
    ``url`` (which then only names the broker in messages); TLS, if asked
    for, still goes over it.
    """
    host, port, context = connection_target(url, ssl_context, token)
    policy = client_policy(policy, optimism)
    if reconnect < 0:
        raise ClientError("reconnect must be >= 0 seconds")
    if max_topics < 1:
        raise ClientError("max_topics must be at least 1")

    async def connect(redirect: str | None = None) -> trio.abc.Stream:
        """A stream to the broker (or to ``redirect``, ``HOST:PORT``, where a
        broker of several workers sent a resume; TLS still checks ``host``)."""
        stream: trio.abc.Stream
        if open_stream is not None:
            stream = await open_stream()
        else:
            there, at, _ = split_url(redirect) if redirect else (host, port, False)
            stream = await trio.open_tcp_stream(there, at)
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
                connect_timeout=connect_timeout,
                on_session_lost=on_session_lost,
                max_topics=max_topics,
            )
            try:
                with trio.fail_after(connect_timeout):
                    await client._run(nursery)
            except (trio.TooSlowError, ConnectionLost) as error:
                lost = error if isinstance(error, ConnectionLost) else None
                tls = context is not None
                raise client._session.handshake_error(lost, address, connect_timeout, tls) from None
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
        hint = failure_hint(cause)
        raise ConnectionLost(f"TLS handshake with {host} failed: {cause}{hint}") from None
    return secured
