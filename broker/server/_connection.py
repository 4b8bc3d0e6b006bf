"""One client connection: a reader, a writer and a keepalive task around a sans-IO Connection."""

from __future__ import annotations

import logging
import weakref
from collections import deque
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio

from accounts import Account, LoanedItem
from broker.auth import AuthFailure
from broker.protocol import (
    Abort,
    Ack,
    BrokerSessionState,
    Channel,
    ChannelKind,
    Commit,
    Connection,
    ConnectionClosed,
    DeliverReceived,
    Event,
    GoodbyeCode,
    GuaranteesReceived,
    HandleDeleted,
    HandleFreeProposed,
    HandleType,
    HelloReceived,
    LocalProtocolError,
    OutcomeStatus,
    PublishReceived,
    Role,
    Stage,
    Subscribed,
    TopicBound,
    encode_deliver_tail,
)

from ._budget import ConnectionBudget
from ._lossy import OptionError, make_subscription
from ._peerlog import LINE_CHARS, shown
from ._peers import peer_key
from ._policy import BrokerPolicy
from ._session import Session
from ._staging import STAGED_PUBLISH_OVERHEAD, CommitDecision
from ._topic import DELIVER_HEAD_ESTIMATE, Routed, Subscription, Topic

if TYPE_CHECKING:
    from ._broker import Broker, PrincipalUsage

#: Bytes asked of the socket per read. The connection account is checked
#: between reads; channel frames are bounded by guarantees regardless.
RECEIVE_SIZE = 64 * 1024
#: Publishes forwarded to a topic as one actor message (and one loan).
FORWARD_BATCH = 64
#: Publishes a resumed channel forwards before yielding to other tasks.
FORWARD_SLICE = 256
#: How long a closing connection waits for the client to see its Goodbye.
LINGER_SECONDS = 1.0


@dataclass(slots=True, eq=False)
class PublishChannel:
    """The broker's side of one publish channel ``[2, t]``."""

    channel: Channel
    account: Account
    topic: Topic
    #: Received publishes not yet forwarded to the topic (the channel buffer).
    buffer: deque[PublishReceived] = field(default_factory=deque)
    #: Publishes the topic has routed to every subscription (for Confirm).
    routed: int = 0
    confirmed: int = 0
    #: A task waits for the account to clear (guarantees are withheld meanwhile).
    waiting: bool = False
    #: The client was told (Throttled) that this channel is withheld.
    advised: bool = False
    #: Estimated charge of the deliveries of batches the topic has not routed yet.
    unrouted_fan_out: int = 0
    #: The client's principal may publish to the topic (else a publish ends the connection).
    may_publish: bool = True
    #: Where its publishes are staged until a commit (None: routed at once).
    stage: Stage | None = None


@dataclass(slots=True)
class ConnectionCounters:
    messages_in: int = 0
    bytes_in: int = 0
    messages_out: int = 0
    bytes_out: int = 0
    reader_pauses: int = 0
    #: Deliveries dropped from lossy/latest queues: overflow, and replaced by a newer one.
    deliveries_overflowed: int = 0
    deliveries_replaced: int = 0


class ServerConnection:
    """The broker's end of one TCP connection.

    Control messages are handled as they arrive; publishes wait in their
    channel's buffer and are forwarded to the topic only while the channel's
    account is clear. Guarantees on a channel are issued only while its
    account is below its watermark (see :class:`BrokerPolicy`), so a slow
    topic withholds exactly its own channel's guarantees. The reader stops
    reading while the connection's account is blocked (the backstop) or
    while too much output waits for a client that does not read.
    """

    def __init__(
        self,
        broker: Broker,
        stream: trio.abc.Stream,
        serial: int,
        peer: str,
        identity: str | None = None,
    ) -> None:
        self.broker = broker
        self.stream = stream
        self.serial = serial
        config = broker.config
        self.peer = peer
        #: The verified client certificate's common name (mutual TLS), if any.
        self.identity = identity
        #: The authenticated principal's usage (None while unauthenticated or without auth).
        self.principal: PrincipalUsage | None = None
        self.name = f"conn-{serial}"
        self.client_name = ""
        self.account = Account(
            self.name,
            high_watermark=config.connection_high_watermark,
            low_watermark=config.connection_low_watermark,
            parent=broker.account,
            kind="connection",
        )
        self.channels: dict[int, PublishChannel] = {}
        #: The session's subscriptions (the session's own dict once welcomed).
        self.subscriptions: dict[int, Subscription] = {}
        #: The session this connection serves (None before the Welcome).
        self.session: Session | None = None
        #: The session ends with this connection (the client said Goodbye, or
        #: broke the rules); otherwise it waits for a resume.
        self.ends_session = False
        #: What this connection's lossy and latest queues hold (see ``lossy_budget``).
        self.dropping_bytes = 0
        self.counters = ConnectionCounters()
        self.buffer_reserved = 0
        # No reference cycles through the connection: the budget books into a
        # proxy of it, the policy sees the budget through a proxy and the
        # channels through their dict, so a closed connection is freed by
        # reference counting (see test_churn).
        #: Who gets the connection's receive-buffer budget, and when.
        self.budget = ConnectionBudget(config, weakref.proxy(self))
        channels = self.channels

        def publish_blocked(index: int) -> bool:
            """Publish channel ``index``'s account withholds its guarantees."""
            state = channels.get(index)
            return state is not None and state.account.blocked

        self.protocol = Connection(
            Role.BROKER,
            policy=BrokerPolicy(weakref.proxy(self.budget), publish_blocked),
            max_frame=config.max_frame,
            heartbeat=config.heartbeat,
            lease=config.lease,
            now=trio.current_time(),
        )
        self.budget.protocol = self.protocol
        self.buffer_reserved = self.budget.capacity_in_use()
        #: The Hello must have arrived by then, whatever else the peer sends.
        self._hello_deadline = trio.current_time() + config.hello_timeout
        self._inflight: list[LoanedItem[bytes]] = []
        self._writing: list[LoanedItem[bytes]] = []
        self._wakeup = trio.Event()
        self._drained = trio.Event()
        self._stalled: set[int] = set()
        self._funds_scope: trio.CancelScope | None = None
        self._nursery: trio.Nursery | None = None
        self._confirm_dirty: set[int] = set()
        self.closed = trio.Event()
        self.close_reason = ""
        #: The connection was cut without waiting for the client to read.
        self._aborted = False
        #: A refusal held back (a failed authentication): the writer waits.
        self._held: trio.CancelScope | None = None

    # ================================================================ lifecycle

    async def run(self) -> None:
        """Serve the connection until either side closes it."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._reader)
                nursery.start_soon(self._keepalive)
                await self._writer()
                nursery.cancel_scope.cancel()
            if not self._aborted:
                await self._linger()
        except (trio.BrokenResourceError, trio.ClosedResourceError) as error:
            self.close_reason = self.close_reason or f"socket error: {error}"
        finally:
            self._cleanup()
            with trio.CancelScope(shield=True), trio.move_on_after(1):
                await self.stream.aclose()
            self.closed.set()

    async def _linger(self) -> None:
        """After our Goodbye: half-close, and discard what the client still
        sends for a moment, so that closing does not reset the connection
        before the client has read the Goodbye."""
        with trio.move_on_after(LINGER_SECONDS):
            if isinstance(self.stream, trio.abc.HalfCloseableStream):
                await self.stream.send_eof()
            while await self.stream.receive_some(RECEIVE_SIZE):
                pass

    def goodbye(self, code: GoodbyeCode, reason: str) -> None:
        """Say Goodbye; the writer sends it and closes the connection."""
        if not self.protocol.closed:
            self.protocol.goodbye(code, reason)
            self.close_reason = self.close_reason or f"goodbye {int(code)}: {reason}"
        self.wake_writer()

    def shutting_down(self) -> None:
        """The broker shuts down: send the last Confirms (of what was routed),
        then Goodbye 5 (or a refusal held back, now)."""
        if self._held is not None:
            self._held.cancel()
        if self._confirm_dirty and not self.protocol.closed:
            self._send_confirms()
        self.goodbye(GoodbyeCode.SHUTTING_DOWN, "broker shutting down")

    def _cleanup(self) -> None:
        session = self.session
        if session is not None:
            if self.ends_session or self.broker.closing:
                self.broker.sessions.end(session)
                session.connection = self.session = None  # (a cycle otherwise)
            else:
                self._detach()
        self._close_channels()
        for subscription in list(self.subscriptions.values()):
            subscription.close()  # none left if the session went on
        self.subscriptions.clear()
        for loan in (*self._writing, *self._inflight):
            loan.repay()
        self._writing = []
        self._inflight = []
        self.account.close()
        self.reserve(-self.buffer_reserved)
        if self.principal is not None:
            self.principal.connections -= 1
        self.broker.forget(self)
        self._log(logging.INFO, "closed: %s", self.close_reason or "done")

    def _log(self, level: int, message: str, *args: object) -> None:
        """Log a line about this connection: rate-limited per client address
        (client input in ``args`` goes through ``shown()``)."""
        self.broker.peer_log.log(level, self.peer, "%s %s: " + message, self.name, self.peer, *args)

    def _detach(self) -> None:
        """Leave the session to wait for a resume: its record of handles and
        its subscriptions (which go on queueing) stay; this connection lets go."""
        session = self.session
        assert session is not None
        state = self.protocol.session_state()
        assert isinstance(state, BrokerSessionState)
        for handle in list(self.subscriptions):
            if handle not in state.subscriptions:  # being freed: it goes now
                self.subscriptions.pop(handle).close()
        self.subscriptions = {}
        self.session = None
        self.broker.sessions.detach(session, state)
        self._log(logging.INFO, "session %s detached", session.name)

    def hand_over(self) -> None:
        """The session resumes on another connection while this one still
        looks alive: let go of it now, forward what was received, and close."""
        if self.session is None:
            return
        self._detach()
        self._close_channels()
        self.goodbye(GoodbyeCode.NORMAL, "session resumed on another connection")

    def _close_channels(self) -> None:
        # Publishes that were accepted within guarantees are forwarded even
        # though their sender is gone: the guarantee promised they'd be routed.
        # (Not once a shutdown began: they are never confirmed, and the client
        # publishes them again.)
        for state in list(self.channels.values()):
            if state.buffer and not self.broker.closing:
                size = sum(event.size for event in state.buffer)
                self._forward(state, list(state.buffer), size, 0)
                state.buffer.clear()
            state.topic.publishers -= 1
            state.topic.release_if_unused()
            state.account.close()
        self.channels.clear()

    # ================================================================ writer

    def wake_writer(self) -> None:
        self._wakeup.set()

    async def _writer(self) -> None:
        protocol = self.protocol
        stream = self.stream
        counters = self.counters
        while True:
            await self._wakeup.wait()
            self._wakeup = trio.Event()
            if self._held is not None:
                with self._held:
                    await trio.sleep_forever()
                self._held = None
            if self._confirm_dirty and not protocol.closed:
                # (A Goodbye read since the routing was noted closes the protocol:
                # nothing more may be said then.)
                self._send_confirms()
            # Loans being written stay in _writing, where clean-up finds them
            # if the write never completes (a reset, a shutdown).
            loans = self._writing = self._inflight
            self._inflight = []
            data = protocol.data_to_send(trio.current_time())
            if data:
                try:
                    await stream.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError) as error:
                    self.close_reason = self.close_reason or f"socket error: {error}"
                    self._nursery_cancel()
                    return
                counters.bytes_out += len(data)
            self._writing = []
            for loan in loans:
                loan.repay()
            self._drained.set()
            if protocol.closed and not protocol.bytes_to_send:
                return

    def _send_confirms(self) -> None:
        protocol = self.protocol
        for handle in self._confirm_dirty:
            state = self.channels.get(handle)
            if state is not None and state.routed != state.confirmed:
                state.confirmed = state.routed
                if protocol.may_reference(state.channel):  # not when its topic is being freed
                    protocol.confirm(handle, state.routed)
        self._confirm_dirty.clear()

    def routed(self, routed: Routed) -> None:
        """A topic routed a batch of this connection's publishes."""
        state = self.channels.get(routed.handle)
        if state is None:
            return
        state.unrouted_fan_out -= routed.fan_out
        if not self.protocol.closed:
            state.routed += len(routed.tails)
            self._confirm_dirty.add(routed.handle)
            self._wakeup.set()
            if state.buffer and not state.waiting:
                self._drain(state)

    # ================================================================ deliveries

    def send_deliveries(self, subscription: Subscription, tails: list[bytes]) -> int | None:
        """Queue Delivers of ``tails`` (see ``encode_deliver_tail``), in order
        from the subscription's next sequence number, as far as the
        subscriber's guarantees allow; returns how many were taken, or None
        if the subscription can take nothing more (it is being freed)."""
        protocol = self.protocol
        if protocol.closed:
            return 0  # they wait in the subscription: for a resume, or to be repaid
        try:
            count = protocol.deliver_encoded_many(subscription.handle, subscription.next_seq, tails)
        except LocalProtocolError:
            # The client is freeing the subscription (the event saying so may
            # still be on its way to us).
            return None
        if count:
            subscription.next_seq += count
            subscription.delivered += count
            self.counters.messages_out += count
            self._wakeup.set()
        return count

    def deliver(self, subscription: Subscription, loans: list[LoanedItem[bytes]]) -> int:
        """:meth:`send_deliveries` for a subscription that keeps nothing once
        sent: the loans taken are repaid once written to the socket, the
        others stay with the caller; returns how many were taken."""
        count = self.send_deliveries(subscription, [loan.item for loan in loans])
        if count is None:
            for loan in loans:
                loan.repay()
            return len(loans)
        if count:
            self._inflight.extend(loans if count == len(loans) else loans[:count])
        return count

    def has_room(self, subscription: Subscription, size: int) -> bool:
        """Whether the subscriber's guarantees cover a frame of ``size`` bytes now."""
        if self.protocol.closed:
            return False
        try:
            room = self.protocol.room(Channel(ChannelKind.DELIVER, subscription.handle))
        except LocalProtocolError:
            return False  # the subscription is being freed
        return room >= size

    def gap(self, subscription: Subscription, first_seq: int, count: int) -> bool:
        """Tell the client that ``count`` deliveries from ``first_seq`` were
        dropped; False if nothing more can be said on the subscription."""
        if self.protocol.closed:
            return False
        try:
            self.protocol.gap(subscription.handle, first_seq, count)
        except LocalProtocolError:
            return False  # the client is freeing the subscription
        self._wakeup.set()
        return True

    def subscription_stalled(self, subscription: Subscription) -> None:
        """A subscription of ours waits for our client's guarantees.

        Those guarantees come in on our socket, so the reader must not stop
        on debt that only this client's reading can clear.
        """
        self._stalled.add(subscription.handle)
        if self._funds_scope is not None:
            self._funds_scope.cancel()

    # ================================================================ reader

    async def _reader(self) -> None:
        protocol = self.protocol
        stream = self.stream
        counters = self.counters
        while not protocol.closed:
            await self._pause_if_needed()
            try:
                data = await stream.receive_some(RECEIVE_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            if not data:
                self.close_reason = self.close_reason or "peer closed the connection"
                if not protocol.closed:
                    protocol.goodbye(GoodbyeCode.NORMAL, "connection closed")
                # Nothing more can reach a peer that closed: the writer stops.
                self._nursery_cancel()
                return
            counters.bytes_in += len(data)
            events = protocol.receive_data(data, trio.current_time())
            if events:
                self._handle_events(events)
            # (An Absolve may have completed a shrink; handles may have gone.)
            self.budget.settle()
            if protocol.bytes_to_send or protocol.closed:
                self._wakeup.set()

    def _nursery_cancel(self) -> None:
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    async def _pause_if_needed(self) -> None:
        if self.protocol.memory_to_send > self.broker.config.max_unsent:
            # The client does not read: stop reading until the writer drains.
            self.counters.reader_pauses += 1
            self._drained = trio.Event()
            await self._suspended(self._drained.wait())
        self._refresh_stalled()
        if not self._stalled and not self.account.is_clear():
            self.counters.reader_pauses += 1
            with trio.CancelScope() as scope:
                self._funds_scope = scope
                try:
                    await self._suspended(self.account.ensure_clear_funds())
                finally:
                    self._funds_scope = None

    async def _suspended(self, wait: Awaitable[None]) -> None:
        """Await ``wait`` with the client's lease not running (we are not reading)."""
        liveness = self.protocol.liveness
        liveness.suspend(trio.current_time())
        try:
            await wait
        finally:
            liveness.resume(trio.current_time())

    def _refresh_stalled(self) -> None:
        if self._stalled:
            self._stalled = {
                handle
                for handle in self._stalled
                if (sub := self.subscriptions.get(handle)) is not None
                and (sub.queued or sub.unacked)
            }

    # ================================================================ events

    def _handle_events(self, events: list[Event]) -> None:
        touched: set[PublishChannel] = set()
        # Events of a read that ended the connection (the client's Goodbye, a
        # protocol error) all stand: they end with ConnectionClosed. Only a
        # Goodbye of ours, said while handling them, stops the rest.
        closed_before = self.protocol.closed
        for event in events:
            if type(event) is PublishReceived:
                if self.broker.closing:
                    continue  # a shutdown accepts none: never routed, never confirmed
                state = self.channels[event.channel.index]
                if not state.may_publish:
                    self._deny(f"may not publish to {shown(state.topic.topic_name)}")
                    break
                if state.stage is not None:
                    if not self._stage(state, event):
                        break
                    continue
                state.buffer.append(event)
                touched.add(state)
                self.counters.messages_in += 1
            elif type(event) is GuaranteesReceived:
                if event.channel.kind == ChannelKind.DELIVER:
                    subscription = self.subscriptions.get(event.channel.index)
                    if subscription is not None:
                        subscription.pump()
            else:
                self._handle_other(event)
                if self.protocol.closed and not closed_before:
                    break  # nothing after a Goodbye of ours is applied
        if touched:
            now = trio.current_time()
            for state in touched:
                self.budget.note_busy(state.channel, now)
                self._drain(state)

    def _handle_other(self, event: Event) -> None:
        if isinstance(event, HelloReceived):
            self._on_hello(event)
        elif isinstance(event, TopicBound):
            self._open_publish_channel(event.handle, event.name, event.stage)
        elif type(event) is Commit:
            if not self.broker.closing:  # unanswered: the client sees Goodbye 5 instead
                self._commit(event)
        elif type(event) is Abort:
            decision = self.broker.staging.abort(self._owner, event.batch)
            self._answer(event.request, decision)
        elif isinstance(event, Subscribed):
            if self.principal is not None and not self.principal.principal.may_subscribe(
                event.topic_name
            ):
                self._deny(f"may not subscribe to {shown(event.topic_name)}")
                return
            topic = self.broker.topic(event.topic_name)
            try:
                subscription = make_subscription(
                    self, event.handle, topic, event.mode, event.options
                )
            except OptionError as error:
                topic.release_if_unused()
                self.goodbye(GoodbyeCode.PROTOCOL_ERROR, f"Subscribe: {error}")
                return
            self.subscriptions[event.handle] = subscription
            topic.subscribe(subscription)
            self.budget.subscriptions_changed()
        elif type(event) is Ack:
            acked = self.subscriptions.get(event.subscription)
            if acked is not None:
                acked.ack(event.seq)
        elif isinstance(event, HandleFreeProposed | HandleDeleted):
            self._on_handle_gone(event.handle_type, event.handle)
        elif isinstance(event, ConnectionClosed):
            # A client that says Goodbye 0 is done with its session; one that
            # breaks the rules loses it. Other Goodbyes (e.g. "broker silent")
            # leave it to be resumed.
            if event.error is not None or event.code == GoodbyeCode.NORMAL:
                self.ends_session = True
            how = "by the client" if event.by_peer else "for a protocol violation"
            self.close_reason = f"closed {how}: code {event.code} {shown(event.reason)}"
            if event.error is not None:
                self._log(logging.WARNING, "%s", shown(str(event.error), LINE_CHARS))
        elif isinstance(event, DeliverReceived):  # pragma: no cover - the protocol refuses it
            raise AssertionError("a broker never receives Deliver")

    def _on_hello(self, event: HelloReceived) -> None:
        if self.protocol.closed:
            return  # something after the Hello, in the same read, closed the connection
        hello = event.hello
        self.client_name = hello.client[:64]
        if self.broker.auth is not None and not self._authenticate(hello.token):
            return
        sessions = self.broker.sessions
        principal = self.principal.principal.name if self.principal else None
        session = None
        if hello.session is not None:
            session = sessions.find(hello.session, principal)
            if session is None:
                self._log(logging.INFO, "%s asks for an unknown session", shown(self.client_name))
        if session is not None:
            self._resume(session, hello.processed)
        else:
            self.session = sessions.create(self, principal)
            self.protocol.welcome(session=self.session.id, epoch=self.broker.epoch)
        # The bind channels exist now: their buffers count against the budgets.
        self.reserve(self.budget.capacity_in_use() - self.buffer_reserved)
        self.budget.subscriptions_changed()
        self._log(logging.INFO, "hello from %s", shown(self.client_name))

    def _resume(self, session: Session, processed: dict[int, int]) -> None:
        """Take over ``session``: its handles, channels and subscriptions; what
        the client did not process is delivered again, first."""
        if session.connection is not None:
            session.connection.hand_over()
        assert session.state is not None
        restore, dropped = session.state.for_resume(processed)
        for handle in dropped:  # the client gave them up
            session.subscriptions.pop(handle).close()
        self.broker.sessions.attach(session, self)
        self.session = session
        self.subscriptions = session.subscriptions
        self.protocol.welcome(session=session.id, epoch=self.broker.epoch, restore=restore)
        for handle, (name, _) in restore.topics.items():
            state = self._open_publish_channel(handle, name, restore.stages.get(handle))
            if state is None:
                return
            state.routed = state.confirmed = restore.received.get(handle, 0)
        redelivered = 0
        for handle, subscription in self.subscriptions.items():
            redelivered += subscription.attach(self, processed.get(handle, 0))
        self.broker.sessions.redelivered_total += redelivered
        self._log(logging.INFO, "session %s resumed (%d sent again)", session.name, redelivered)

    def _open_publish_channel(
        self, handle: int, name: str, stage: Stage | None = None
    ) -> PublishChannel | None:
        """The broker's side of a newly bound (or restored) topic handle (its
        publishes staged in ``stage``, if given); None (and Goodbye 6) if the
        client's principal may not use the topic."""
        may_publish = True
        if self.principal is not None:
            principal = self.principal.principal
            may_publish = principal.may_publish(name)
            if not may_publish and not principal.may_subscribe(name):
                self._deny(f"may not use topic {shown(name)}")
                return None
        topic = self.broker.topic(name)
        topic.publishers += 1
        account = Account(
            f"{self.name}/publish/{handle}",
            high_watermark=self.broker.config.channel_high_watermark,
            low_watermark=self.broker.config.channel_low_watermark,
            parent=self.account,
            kind="publish",
        )
        state = PublishChannel(
            Channel(ChannelKind.PUBLISH, handle),
            account,
            topic,
            may_publish=may_publish,
            stage=stage,
        )
        self.channels[handle] = state
        return state

    def _authenticate(self, token: str | None) -> bool:
        """Bind the connection to the principal its credentials prove, within
        the principal's connection limit; else say Goodbye (6 or 3)."""
        broker = self.broker
        assert broker.auth is not None
        found = broker.auth.authenticate(token, self.identity)
        if isinstance(found, AuthFailure):
            # Held back longer for each failure in a row from the address: no guessing.
            hold = broker.peers.failed(peer_key(self.peer), trio.current_time())
            reason = "bad credentials" if token is not None else "credentials required"
            self._deny(reason, found, hold)
            return False
        usage = broker.principals[found.name]
        limit = found.max_connections
        if limit and usage.connections >= limit:
            broker.auth_failed(AuthFailure.CONNECTION_LIMIT)
            self._refuse_hello(
                GoodbyeCode.LIMIT_EXCEEDED, f"{found.name!r} already has {limit} connection(s)"
            )
            return False
        usage.connections += 1
        usage.buffer_reserved += self.buffer_reserved
        self.principal = usage
        return True

    def _deny(
        self, reason: str, failure: AuthFailure = AuthFailure.TOPIC_DENIED, hold: float = 0.0
    ) -> None:
        """Refuse the client for ``failure``: Goodbye 6 (not authorised), sent
        after ``hold`` seconds (nothing it sent after is applied)."""
        self.ends_session = True
        self.broker.auth_failed(failure)
        self._refuse_hello(GoodbyeCode.NOT_AUTHORISED, f"not authorised: {reason}", hold)

    def _refuse_hello(self, code: GoodbyeCode, reason: str, hold: float = 0.0) -> None:
        """Say Goodbye for ``reason`` (client input in it already ``shown()``),
        logged; the writer holds it back ``hold`` seconds."""
        who = self.principal.principal.name if self.principal else self.identity or "anonymous"
        self._log(logging.WARNING, "(%s) %s", shown(who), reason)
        if hold > 0:
            self._held = trio.CancelScope(deadline=trio.current_time() + hold)
        self.goodbye(code, reason)

    def _on_handle_gone(self, handle_type: int, handle: int) -> None:
        if handle_type == HandleType.SUBSCRIPTION:
            subscription = self.subscriptions.pop(handle, None)
            if subscription is not None:
                subscription.close()
            self._stalled.discard(handle)
            self.budget.subscriptions_changed()
            return
        state = self.channels.get(handle)
        if state is None or state.buffer:
            return  # buffered publishes keep the handle; HandleDeleted comes later
        del self.channels[handle]
        self.budget.forget(state.channel)
        state.topic.publishers -= 1
        state.topic.release_if_unused()
        state.account.close()
        if self.budget.settle():  # its capacity may fund a starved channel
            self.wake_writer()

    # ================================================================ staging

    @property
    def _owner(self) -> str | None:
        """Whose staged batches this connection may commit: its principal's."""
        return self.principal.principal.name if self.principal is not None else None

    def _stage(self, state: PublishChannel, event: PublishReceived) -> bool:
        """Stage a publish of a staged channel: held by the broker, confirmed
        at once, routed when its batch is committed. False (and Goodbye 3) if
        the staging area is full."""
        assert state.stage is not None
        message = event.message
        tail = encode_deliver_tail(message.payload, message.key, message.headers)
        refusal = self.broker.staging.stage(
            self._owner,
            state.stage,
            state.topic.topic_name,
            tail,
            message.key,
            len(tail) + STAGED_PUBLISH_OVERHEAD,
            trio.current_time(),
        )
        if refusal is not None:
            self._log(logging.WARNING, "%s", refusal)
            self.goodbye(GoodbyeCode.LIMIT_EXCEEDED, refusal)
            return False
        self.counters.messages_in += 1
        released = self.protocol.release_frames(state.channel, event.size, 1)
        state.routed += 1
        self._confirm_dirty.add(state.channel.index)
        self.wake_writer()
        if released:
            self._handle_events(released)
        return True

    def _commit(self, event: Commit) -> None:
        """Decide a Commit; route what it makes visible (charged to a commit
        account under this connection's) and answer once it is routed."""
        batch = (self._owner, event.batch)
        decision = self.broker.staging.commit(*batch, event.members)
        running = self.broker.commits_in_flight.get(batch)
        if decision.status is OutcomeStatus.DUPLICATE and running is not None:
            # The first commit is still routing: "committed before" must
            # still mean "visible", so answer once it is.
            running.waiters.append(lambda: self._answer(event.request, decision))
            return
        if decision.status is not OutcomeStatus.COMMITTED or not decision.publishes:
            self._answer(event.request, decision)
            return
        config = self.broker.config
        account = Account(
            f"{self.name}/commit/{event.request}",
            high_watermark=config.channel_high_watermark,
            low_watermark=config.channel_low_watermark,
            parent=self.account,
            kind="commit",
        )

        def routed() -> None:
            account.close()
            self._answer(event.request, decision)

        self._log(
            logging.INFO, "batch %s committed: %d to route", shown(event.batch), decision.messages
        )
        self.broker.start_commit(batch, account, decision.publishes, routed)

    def _answer(self, request: int, decision: CommitDecision) -> None:
        """Send the Outcome of Commit or Abort ``request`` (if still connected)."""
        if not self.protocol.closed:
            self.protocol.outcome(request, decision.status, decision.messages, decision.reason)
            self.wake_writer()

    # ================================================================ publish channels

    def _drain(self, state: PublishChannel, limit: int = 0) -> None:
        """Forward buffered publishes (at most ``limit``, if given) while the
        channel's account is clear.

        Publishes go to the topic in batches of up to ``FORWARD_BATCH``: one
        actor message and one loan per batch, one release of buffer space. A
        batch ends with the publish that, counting the deliveries it and
        the batches still on their way will be charged, takes the account
        over its high watermark: the debt passes the watermark by about one
        publish's fan-out, as if publishes were forwarded one at a time.
        """
        if self.broker.closing:
            return  # a shutdown forwards nothing more (nothing more is confirmed)
        buffer = state.buffer
        account = state.account
        protocol = self.protocol
        left = limit or len(buffer)
        while buffer and left > 0 and not account.blocked:
            # While routed, a publish's loan and its deliveries' loans are all
            # charged: the room is shared by the publishes and their fan-out.
            # Batches not routed yet will add their fan-out: count it as spent.
            room = account.high_watermark - account.debt - state.unrouted_fan_out
            fan_out = state.topic.charging  # lossy/latest queues charge nobody here
            per_delivery = DELIVER_HEAD_ESTIMATE + account.event_cost
            batch: list[PublishReceived] = []
            size = deliveries = 0
            if room <= 0 and state.unrouted_fan_out > 0:
                break  # resumed by routed() when the topic has caught up
            most = min(FORWARD_BATCH, left)
            while buffer and len(batch) < most and (not batch or size + deliveries <= room):
                event = buffer.popleft()
                batch.append(event)
                size += event.size
                deliveries += fan_out * (event.size + per_delivery)
            left -= len(batch)
            self._forward(state, batch, size, deliveries)
            released = protocol.release_frames(state.channel, size, len(batch))
            if released:
                self._handle_events(released)
        if account.blocked and not state.waiting and not protocol.closed:
            state.waiting = True
            assert self._nursery is not None
            self._nursery.start_soon(self._await_clear, state)
        if self.budget.settle():  # a shrink may have completed
            self.wake_writer()

    def _forward(
        self, state: PublishChannel, batch: list[PublishReceived], size: int, fan_out: int
    ) -> None:
        """Send ``batch`` (``size`` bytes of frames) to the topic as one loan on
        the channel's account; ``fan_out`` estimates what its deliveries will
        be charged once routed."""
        tails = [
            encode_deliver_tail(e.message.payload, e.message.key, e.message.headers) for e in batch
        ]
        state.unrouted_fan_out += fan_out
        state.topic.send_nowait(
            Routed(tails, self, state.channel.index, fan_out, [e.message.key for e in batch]),
            account=state.account,
            cost=size,
        )

    async def _await_clear(self, state: PublishChannel) -> None:
        """Resume a throttled channel once its account clears and its buffer
        is forwarded; ``state.waiting`` stays true until then, so exactly one
        such task looks after the channel.

        The buffered publishes are forwarded a slice at a time, yielding in
        between, so that a backlog does not hold up other channels' traffic;
        if forwarding (or routing meanwhile) blocks the account again, it
        waits again. Guarantees are issued when it is done.
        """
        while self._owns(state):
            if state.account.blocked:
                await self._wait_for_funds(state)
                continue
            if not state.buffer or self.broker.closing:
                break
            self._drain(state, FORWARD_SLICE)
            self.wake_writer()
            await trio.lowlevel.checkpoint()
        state.waiting = False
        if self._owns(state) and not self.broker.closing:
            if state.advised:
                state.advised = False
                if self.protocol.may_reference(state.channel):  # not when being freed
                    self.protocol.throttled(state.channel, False)
            self.protocol.issue_guarantees(state.channel)
            self.wake_writer()

    async def _wait_for_funds(self, state: PublishChannel) -> None:
        """Wait for the channel's account to clear; a wait longer than
        ``throttle_notice_after`` is announced to the client (Throttled)."""
        with trio.move_on_after(self.broker.config.throttle_notice_after) as patience:
            await state.account.ensure_clear_funds()
        if patience.cancelled_caught:
            if not state.advised and self._owns(state):
                state.advised = True
                if self.protocol.may_reference(state.channel):  # not when being freed
                    self.protocol.throttled(state.channel, True)
                self.wake_writer()
            await state.account.ensure_clear_funds()

    def _owns(self, state: PublishChannel) -> bool:
        """``state`` is still this open connection's channel."""
        return self.channels.get(state.channel.index) is state and not self.protocol.closed

    # ================================================================ budgets

    def spare_budget(self) -> int:
        """What the broker's and the principal's budgets still allow (see
        :class:`ConnectionBudget`)."""
        spare = self.broker.config.global_budget - self.broker.buffer_reserved
        principal = self.principal
        if principal is not None:
            spare = min(spare, principal.buffer_budget - principal.buffer_reserved)
        return spare

    def reserve(self, amount: int) -> None:
        """Book ``amount`` more bytes of capacity as reserved by this
        connection (and its broker and principal)."""
        self.buffer_reserved += amount
        self.broker.buffer_reserved += amount
        if self.principal is not None:
            self.principal.buffer_reserved += amount

    # ================================================================ keepalive

    async def _keepalive(self) -> None:
        protocol = self.protocol
        while not protocol.closed:
            deadline = protocol.next_deadline()
            if protocol.welcome_message is None:
                deadline = min(deadline, self._hello_deadline)
            await trio.sleep_until(deadline)
            now = trio.current_time()
            if protocol.welcome_message is None and now >= self._hello_deadline:
                self.goodbye(GoodbyeCode.LEASE_EXPIRED, "no Hello in time")
                return
            if protocol.peer_gone(now):
                handshake = protocol.welcome_message is None
                if not handshake:
                    self.broker.security.lease_expirations += 1
                self.goodbye(
                    GoodbyeCode.LEASE_EXPIRED,
                    "no Hello in time" if handshake else "lease expired",
                )
                # A client that reads nothing would keep the writer (and the
                # connection) forever: the Goodbye gets a moment, not more.
                await trio.sleep(LINGER_SECONDS)
                self.close_reason = self.close_reason or "lease expired"
                self._aborted = True  # no more lingering for it either
                self._nursery_cancel()
                return
            if protocol.ping_due(now):
                if protocol.welcome_message is not None and not protocol.closed:
                    protocol.ping()
                    # Counted as sent now: one Ping per heartbeat, however
                    # long the writer takes to send it.
                    protocol.liveness.on_sent(now)
                    self.wake_writer()
                else:
                    protocol.liveness.on_sent(now)  # nothing to ping before the handshake
