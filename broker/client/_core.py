"""One client session, sans-IO: what both clients (trio and blocking) do.

:class:`ClientSession` owns the protocol :class:`~broker.protocol.Connection`
and everything a client keeps about it: topic handles (``_topics.py``),
publish and Confirm counts, subscriptions and their inboxes, staging counts,
outcomes of commits, Ping nonces, advisories, statistics, and what to resume
when the connection breaks (``_resume.py``). It does no I/O and reads no
clock of its own: a driver feeds it what it reads (:meth:`receive_data`), runs
its timers (:meth:`handle_timer` at :meth:`next_deadline`), writes what
:meth:`data_to_send` returns, and waits its own way (trio tasks, a selector)
for the conditions the session exposes; what cannot go on returns False or None.
"""

from __future__ import annotations

import contextlib
import enum
import logging
from collections.abc import Callable, Hashable, Iterable

from broker.protocol import (
    SUBSCRIPTION_BINDS,
    Answer,
    Channel,
    ChannelKind,
    Confirm,
    Connection,
    ConnectionClosed,
    DeliverManyReceived,
    DeliverReceived,
    DropAnnounced,
    Event,
    FramesAbandoned,
    Gap,
    HandleDeleted,
    HandleFreeProposed,
    HandleType,
    Headers,
    LocalProtocolError,
    Matched,
    MatchedGap,
    NoGuarantees,
    Policy,
    Pong,
    Role,
    Stage,
    SubscriptionDropped,
    Throttled,
    WelcomeReceived,
    check_topic_name,
)
from broker.protocol.connection import MAX_MESSAGE, ClientSessionState

from ._acks import HeldAcks
from ._common import ConnectionLost, handshake_error, subscription_limit
from ._resume import (
    ReconnectPlan,
    log_session_lost,
    may_retry,
    resume_state,
    without_subscription,
)
from ._settles import flush_settles
from ._subscription import RELEASE_BATCH, SubscriptionState
from ._topics import FlushTargets, TopicCache, covered

log = logging.getLogger("broker.client")


#: How many of a peer's first bytes a client keeps, to say what answered its Hello.
ANSWER_KEPT = 64


class Ending(enum.Enum):
    """What :meth:`ClientSession.fail` made of a connection's end."""

    #: Nothing to do: the client ended, or is being reconnected, already.
    IGNORED = "ignored"
    #: A connection attempt failed (see :attr:`ClientSession.attempt_error`).
    ATTEMPT = "attempt"
    #: Replace the connection: the session is kept for a resume.
    RECONNECT = "reconnect"
    #: The client is over (:attr:`ClientSession.error` says why).
    ENDED = "ended"


class ClientSession:
    """A client's session with one broker, over successive connections.

    ``clock()`` is the driver's monotonic time (for the topic cache's
    learning window and held acknowledgements); ``reconnect`` the seconds a
    broken connection may take to be replaced (0: never). ``on_output()`` is
    called when consuming messages queued output (guarantees,
    acknowledgements) on its own; ``held.on_timer(due)`` when an
    acknowledgement is held back until ``due`` (see :meth:`next_deadline`).
    """

    def __init__(
        self,
        name: str,
        policy: Policy | None,
        token: str | None,
        *,
        max_topics: int,
        reconnect: float,
        clock: Callable[[], float],
    ) -> None:
        self.name = name
        self.token = token
        self.reconnect = reconnect
        self.fallback: str | None = None  #: see ``Client.reconnect_through``
        self.on_output: Callable[[], object] = lambda: None
        self.clock = clock
        self.conn = Connection(Role.CLIENT, policy=policy, max_message=MAX_MESSAGE, now=clock())
        self.held = HeldAcks[SubscriptionState](self.conn.policy.ack_delay)
        self.published: dict[int, int] = {}
        self.confirmed: dict[int, int] = {}
        #: Topic handles by name, and by (name, stage) for staged ones.
        self.cache = TopicCache(max_topics, self.published, self.confirmed, clock)
        self.handles = self.cache.handles
        self.subscriptions: dict[int, SubscriptionState] = {}
        #: Subscription handles closed before their Subscribe was confirmed.
        self.pending_frees: set[int] = set()
        #: Publishes made per stage (see :meth:`finish_stage`).
        self.stage_counts: dict[Stage, int] = {}
        #: Answers to this connection's Commits, Aborts and ListOffsets, by request number.
        self.outcomes: dict[int, Answer] = {}
        #: The highest nonce of a Pong received (nonces of our Pings increase).
        self.pong = 0
        self.goodbye_code: int | None = None
        self.goodbye_by_peer = False
        #: Channels the broker says it is withholding guarantees on (advisory).
        self.throttled: set[Channel] = set()
        #: Announced drops of frames sent beyond the guarantees, and how many
        #: frames they made the client send again (optimistic mode).
        self.drops_announced = self.frames_resent = 0
        #: Frames the last Welcome made the client send again (on a resume).
        self._resent_last = 0
        #: Sessions resumed on a new connection, and frames they sent again.
        self.resumes = self.frames_resent_on_resume = 0
        #: Times the broker no longer knew the session; deliveries dropped as
        #: duplicates (see ``SubscriptionState._put``).
        self.sessions_lost = self.duplicates_dropped = 0
        #: The first bytes the peer sent before its Welcome.
        self.answer = b""
        #: Why the client is over (None: it is not).
        self.error: ConnectionLost | None = None
        #: The client is closing or closed by the application.
        self.closing = False
        #: Why the connection broke while it is being replaced (None: it is not).
        self.broken: ConnectionLost | None = None
        #: A connection attempt is under way; how it failed, if it did.
        self.attempting = False
        self.attempt_error: ConnectionLost | None = None
        #: The connection takes new frames (it is not being replaced).
        self.ready = True
        #: The session to resume, its open subscriptions, and when to try.
        self.resume: ClientSessionState | None = None
        self.resuming: dict[int, SubscriptionState] = {}
        self.plan: ReconnectPlan | None = None
        #: Connections welcomed so far (a round trip started on an older one is redone).
        self.generation = 0
        #: The last Welcome said ``offsets``: the broker keeps topic logs.
        self.offsets = False

    # ---------------------------------------------------------------- the connection

    def start(self, now: float, resume: ClientSessionState | None = None) -> Connection:
        """A new connection (resuming ``resume``), its Hello queued."""
        conn = self.conn = Connection(
            Role.CLIENT, policy=self.conn.policy, max_message=MAX_MESSAGE, now=now
        )
        self.pong = 0  # Ping nonces start again
        self.outcomes.clear()  # and request numbers
        self.answer = b""
        conn.hello(self.name, token=self.token, resume=resume, deliver_many=True, metadata=True)
        return conn

    @property
    def optimistic(self) -> bool:
        """Publishing may run ahead of the guarantees (drops are then expected)."""
        return self.conn.policy.optimism > 0

    def receive_data(
        self, data: bytes | bytearray | memoryview, now: float
    ) -> ConnectionLost | None:
        """Process bytes read from the broker; the connection's end, if they end it."""
        conn = self.conn
        if conn.welcome_message is None and len(self.answer) < ANSWER_KEPT:
            self.answer += bytes(data[: ANSWER_KEPT - len(self.answer)])
        lost = self.apply_events(conn.receive_data(data, now))
        if self.ready and not self.attempting:  # (a lost session clears the cache first)
            self.cache.pump(conn)
        if self.pending_frees and not conn.closed:
            for handle in list(self.pending_frees):
                if conn.confirmed(HandleType.SUBSCRIPTION, handle):
                    self.pending_frees.discard(handle)
                    conn.free_handle(HandleType.SUBSCRIPTION, handle)
        return lost

    def next_deadline(self) -> float | None:
        """When :meth:`handle_timer` is due (None: not before the Welcome)."""
        conn = self.conn
        if conn.welcome_message is None or conn.closed:
            return None
        held = self.held.earliest()
        due = conn.next_deadline()
        return due if held is None else min(due, held)

    def handle_timer(self, now: float) -> ConnectionLost | None:
        """Ping when this side has been silent, send held acknowledgements
        that are due; the connection's end if the broker went silent for its
        whole lease (a Goodbye 4 is queued)."""
        if self.conn.welcome_message is None:
            return None
        for event in self.conn.handle_timer(now):
            if isinstance(event, ConnectionClosed):
                return ConnectionLost("the broker went silent (lease expired)")
        if self.held:  # (a closed one acknowledged what it consumed as it closed)
            self.ack_consumed(s for s in self.held.take_due(now) if not s._closed)
        return None

    def fail(self, error: ConnectionLost, now: float) -> Ending:
        """The connection ended with ``error``: what the driver does next."""
        if self.attempting:
            self.attempt_error = self.attempt_error or error
            return Ending.ATTEMPT
        if self.error is not None or self.broken is not None:
            return Ending.IGNORED
        if self.reconnect > 0 and not self.closing and self.generation > 0 and may_retry(error):
            self._begin_reconnect(error, now)
            return Ending.RECONNECT
        self.error = error
        self.ready = False
        return Ending.ENDED

    def close_here(self) -> None:
        """The application closed the client: no reconnecting any more."""
        self.closing = True
        if self.broken is not None and self.error is None:
            self.error = ConnectionLost("the client is closed")
        self.broken = self.resume = self.plan = None
        self.attempting = self.ready = False

    def check_open(self, *, attempt: bool = True) -> None:
        """Raise :class:`ConnectionLost` (a fresh one each time) if the client
        ended (or, while reconnecting and ``attempt``, if the attempt under
        way failed: what the code making the attempt wants to know)."""
        error = self.error
        if error is None and attempt and self.attempting:
            error = self.attempt_error
        if error is not None:
            raise ConnectionLost(error.reason, error.code)
        if (self.conn.closed or self.closing) and self.broken is None:
            raise ConnectionLost("the client is closed")

    @property
    def closed(self) -> bool:
        """The client has ended for good (a connection being replaced has not)."""
        return self.error is not None or (self.conn.closed and self.broken is None)

    def ended_normally(self) -> bool:
        """The connection ended by our own close or by the broker's Goodbye 0."""
        return self.closing or (self.goodbye_by_peer and self.goodbye_code == 0)

    def handshake_error(
        self, error: ConnectionLost | None, address: str, waited: float, tls: bool
    ) -> ConnectionLost:
        """What a failed handshake with ``address`` raises (see :func:`handshake_error`)."""
        return handshake_error(error, self.answer, self.goodbye_by_peer, address, waited, tls)

    # ---------------------------------------------------------------- reconnecting

    def _begin_reconnect(self, error: ConnectionLost, now: float) -> None:
        log.warning("%s: %s; reconnecting", self.name, error)
        self.broken = error
        self.ready = False
        self.resume = resume_state(self.conn, self.subscriptions)
        self.resuming = {handle: self.subscriptions[handle] for handle in self.resume.processed}
        for subscription in self.subscriptions.values():
            subscription._reset()
        self.pending_frees.clear()  # given up: the resumed session drops them
        self.held.clear()  # (what was consumed is the resume's `processed`)
        self.plan = ReconnectPlan(now, self.reconnect, self.fallback)

    def begin_attempt(self, now: float) -> ClientSessionState:
        """A connection attempt starts: the session it resumes (its Hello says so)."""
        assert self.resume is not None
        self.attempting = self.ready = True
        self.attempt_error = None
        return self.resume

    def attempt_failed(self, error: ConnectionLost, now: float) -> None:
        """The attempt failed: plan the next, or end the client."""
        assert self.plan is not None
        self.attempting = False
        self.ready = False
        self.broken = error
        final = self.plan.failed(error, now)
        if final is not None:
            for subscription in self.resuming.values():
                subscription._given_up()
            self.broken = self.resume = self.plan = None
            self.error = final

    def attempt_aborted(self) -> None:
        """The attempt ended with an error the driver raised to the
        application: the session stays broken, and the next attempt follows
        the same plan."""
        self.attempting = False
        self.ready = False

    def attempt_welcomed(self) -> ClientSessionState | None:
        """The attempt's connection was welcomed: None if the session was
        resumed, else the lost session's state, to be restored by the driver
        (:meth:`lost_subscriptions`, :func:`unconfirmed_publishes`)."""
        welcome = self.conn.welcome_message
        assert welcome is not None and self.resume is not None
        if welcome.resumed:
            for handle, count in welcome.received.items():
                self.confirmed[handle] = max(self.confirmed.get(handle, 0), count)
            self.cache.connection_replaced()
            self.resumes += 1
            for subscription in self.resuming.values():
                subscription._resumed()
                flush_settles(self, subscription)  # (a group member's, made meanwhile)
            self.frames_resent_on_resume += self._resent_last
            log.info("%s: session resumed; %d frames sent again", self.name, self._resent_last)
            return None
        state = self.resume
        self.sessions_lost += 1
        log_session_lost(self.name, state, welcome.offsets)
        self.cache.clear()
        self.published.clear()
        self.confirmed.clear()
        self.subscriptions = {}
        return state

    def lost_subscriptions(self, state: ClientSessionState) -> list[SubscriptionState]:
        """Lost ``state``'s open subscriptions, to make again in order (see ``_resubscribing``)."""
        resuming = self.resuming
        return [resuming[h]._resubscribing(self.offsets) for h in sorted(state.subscriptions)]

    def reconnected(self) -> None:
        """The attempt succeeded (and a lost session was restored)."""
        self.attempting = False
        self.broken = self.resume = self.plan = None
        self.resuming = {}
        self.ready = True

    # ---------------------------------------------------------------- events

    def apply_events(self, events: list[Event]) -> ConnectionLost | None:
        """Apply the protocol's events; the connection's end, if one ends it."""
        lost: ConnectionLost | None = None
        for event in events:
            if type(event) is DeliverReceived or type(event) is DeliverManyReceived:
                subscription = self.subscriptions.get(event.message.subscription)
                if subscription is None or subscription._closed:
                    if not self.conn.closed:
                        self.conn.release(event)  # a subscription being freed
                else:
                    self.duplicates_dropped += subscription._put(event)
            elif type(event) is Gap:
                subscription = self.subscriptions.get(event.subscription)
                if subscription is not None:
                    subscription._gap(event.first_seq, event.count)
            elif isinstance(event, Matched | MatchedGap):
                subscription = self.subscriptions.get(event.subscription)
                if subscription is not None:
                    subscription._matched(event)
            elif type(event) is Confirm:
                self.confirmed[event.topic] = event.count
            elif type(event) is Pong:
                self.pong = max(self.pong, event.nonce)
            elif isinstance(event, Answer):
                self.outcomes[event.request] = event
            elif type(event) is WelcomeReceived:
                self._resent_last = event.resent
                self.generation += 1
                self.offsets = event.welcome.offsets
                for subscription in self.subscriptions.values() if event.welcome.resumed else ():
                    subscription._numbered(event.welcome.offsets)
            elif isinstance(event, Throttled):
                self._on_throttled(event)
            elif type(event) is HandleDeleted and event.handle_type == HandleType.TOPIC:
                self.cache.on_deleted(event.handle)
                self.throttled.discard(Channel(ChannelKind.PUBLISH, event.handle))
            elif type(event) is HandleFreeProposed and event.handle_type == HandleType.TOPIC:
                self.cache.on_free_proposed(event.handle)
            elif type(event) is HandleFreeProposed:
                # The broker ends a subscription: its topic was deleted. What
                # its inbox holds is still the application's to take.
                subscription = self.subscriptions.get(event.handle)
                if subscription is not None and not subscription._closed:
                    subscription._closed = True
                    subscription.ended = (
                        f"the broker ended the subscription to {subscription.topic!r}: "
                        "its topic was deleted"
                    )
            elif isinstance(event, ConnectionClosed):
                self.goodbye_code = event.code
                self.goodbye_by_peer = event.by_peer
                reason = event.reason if event.by_peer else f"protocol error: {event.reason}"
                lost = lost or ConnectionLost(reason, event.code)
            elif isinstance(event, DropAnnounced):
                # Frames sent beyond the guarantees were dropped; the protocol
                # retransmits them, in order, before anything new.
                self.drops_announced += 1
                self.frames_resent += event.frames
                level = logging.DEBUG if self.optimistic else logging.WARNING
                log.log(level, "%s: %s (resending them)", self.name, event)
            elif isinstance(event, FramesAbandoned):
                log.warning("%s: %s", self.name, event)
            elif isinstance(event, SubscriptionDropped):
                # The resumed session no longer has it: it ends (receiving
                # from it raises ClientError); the rest goes on.
                dropped = self.subscriptions.pop(event.subscription, None)
                if dropped is not None:
                    dropped._closed = True
                log.warning(
                    "%s: the broker ended our subscription to %r", self.name, event.topic_name
                )
        return lost

    def _on_throttled(self, event: Throttled) -> None:
        channel = event.channel
        (self.throttled.add if event.throttled else self.throttled.discard)(channel)
        if channel != SUBSCRIPTION_BINDS:
            self.cache.on_throttled(self.conn, channel, event.throttled, self.name)
        elif event.throttled:
            log.info("%s: near the broker's limit of subscriptions per connection", self.name)
        else:
            log.debug("%s: no longer near the broker's subscription limit", self.name)

    # ---------------------------------------------------------------- publishing

    def bind(self, topic: str, stage: Stage | None = None) -> int | None:
        """The handle of ``topic`` (staged in ``stage``), binding it on first
        use; None if there is no room now (or the connection is being
        replaced). Raises if the client ended or the name is bad."""
        key: Hashable = topic if stage is None else (topic, stage)
        handle = self.handles.get(key)
        if handle is not None and self.ready and not self.closing:
            return handle
        check_topic_name(topic)
        self.check_open()  # (closing: its Goodbye may be on its way, the connection not closed)
        if not self.ready:
            return None
        try:
            return self.cache.bind(self.conn, key, topic, stage)
        except NoGuarantees:
            return None

    def try_publish(
        self,
        topic: str,
        payload: bytes,
        key: bytes | None,
        headers: Headers | None,
        stage: Stage | None = None,
        count_stage: bool = True,
    ) -> bool:
        """Publish if the topic's guarantees allow it now (binding it first
        if needed); False if not (nothing was published). A publish with a
        ``stage`` counts towards :meth:`finish_stage` (unless not ``count_stage``)."""
        handle = self.handles.get(topic if stage is None else (topic, stage))
        conn = self.conn
        if handle is None or not self.ready or conn.closed or self.closing:
            handle = self.bind(topic, stage)
            if handle is None:
                return False
        try:
            conn.publish(handle, payload, key=key, headers=headers)
        except NoGuarantees:
            self.cache.wanted.add(handle)
            return False
        self.published[handle] += 1
        wanted = self.cache.wanted
        if wanted:
            wanted.discard(handle)
        if stage is not None and count_stage:
            self.stage_counts[stage] = self.stage_counts.get(stage, 0) + 1
        return True

    def flush_targets(self) -> FlushTargets:
        """What a flush waits for: the publishes made so far, per topic handle."""
        return FlushTargets(self.sessions_lost, dict(self.published))

    def all_confirmed(self, targets: FlushTargets | dict[int, int]) -> bool:
        """The broker's Confirm counts cover ``targets`` (see :func:`covered`)."""
        return covered(targets, self.confirmed, self.published, self.sessions_lost)

    def finish_stage(self, stage: Stage) -> int:
        """Let go of ``stage``'s topic handles (everything published with it
        is confirmed); how many messages were published with it."""
        conn = self.conn
        for key, handle in list(self.handles.items()):
            if not isinstance(key, tuple) or key[1] != stage:
                continue
            del self.handles[key]
            self.published.pop(handle, None)
            self.confirmed.pop(handle, None)
            if not conn.closed and self.ready:
                with contextlib.suppress(LocalProtocolError):  # already being freed
                    conn.free_handle(HandleType.TOPIC, handle)
        return self.stage_counts.pop(stage, 0)

    def ping(self) -> int:
        """Send a Ping; the nonce whose Pong proves everything before it was processed."""
        return self.conn.ping()

    # ---------------------------------------------------------------- subscribing

    def try_subscribe(self, subscription: SubscriptionState, topic_handle: int | None) -> bool:
        """Send the Subscribe of ``subscription`` on bound ``topic_handle``
        (None: it is a pattern subscription, which needs none); False if
        there is no room for it now."""
        self.check_open()
        if not self.ready:
            return False
        try:
            if topic_handle is None:
                handle = self.conn.subscribe_pattern(
                    subscription.topic, subscription.mode, subscription.options
                )
            else:
                handle = self.conn.subscribe(topic_handle, subscription.mode, subscription.options)
        except NoGuarantees:
            return False
        subscription.handle = handle
        subscription._consumed = subscription._acked = 0
        self.subscriptions[handle] = subscription
        subscription._numbered(self.offsets)
        if subscription.group is not None and subscription._inbox.ticket is None:
            subscription._join_group()
        return True

    @property
    def near_subscription_limit(self) -> bool:
        """The broker says this connection is near its limit of subscriptions."""
        return SUBSCRIPTION_BINDS in self.throttled

    def subscription_limit(self) -> Exception:
        """The error of a Subscribe for which the broker has no room, at its limit."""
        return subscription_limit(len(self.subscriptions))

    def unsubscribe(self, subscription: SubscriptionState) -> None:
        """Acknowledge what the subscription consumed, free its handle (now,
        or once its Subscribe is confirmed) and release everything its inbox
        holds."""
        conn = self.conn
        handle = subscription.handle
        if self.subscriptions.get(handle) is subscription:  # (not dropped by the broker)
            self.ack_consumed([subscription])
        subscription._closed = True
        self.subscriptions.pop(handle, None)
        if not self.ready and self.resume is not None:
            # Being replaced: the resumed session leaves it out (the broker drops it).
            self.resume = without_subscription(self.resume, handle)
            self.resuming.pop(handle, None)
        elif not conn.closed and handle in conn.subscriptions:
            if conn.confirmed(HandleType.SUBSCRIPTION, handle):
                conn.free_handle(HandleType.SUBSCRIPTION, handle)
            else:
                self.pending_frees.add(handle)  # freed once the Subscribe is confirmed
        size, count = subscription._inbox.clear()
        if count and not conn.closed:
            conn.release_frames(Channel(ChannelKind.DELIVER, handle), size, count)

    def release(self, subscription: SubscriptionState, *, hold: bool = False) -> None:
        """Free the room of the frames it consumed whole; acknowledge what it
        consumed (``hold``: a small batch, maybe held back, see ``HeldAcks``)."""
        size, count = subscription._inbox.collect()
        if not count:
            return
        conn = self.conn
        if not conn.closed:
            channel = Channel(ChannelKind.DELIVER, subscription.handle)
            conn.release_frames(channel, size, count)
            if hold and subscription._unacked < RELEASE_BATCH:
                window = conn.receiver(channel).capacity
                if self.held.hold(subscription, size, self.clock(), window):
                    if conn.bytes_to_send:  # (the guarantees released go now)
                        self.on_output()
                    return
        self.acknowledge(subscription)

    def acknowledge(self, subscription: SubscriptionState) -> None:
        """Acknowledge what ``subscription`` consumed, frames whole or not."""
        if not subscription._closed:
            self.ack_consumed([subscription])
        self.on_output()

    def ack_consumed(self, subscriptions: Iterable[SubscriptionState]) -> None:
        """Acknowledge what each of ``subscriptions`` consumed and did not
        acknowledge yet, whole frames or not: on leaving, so that a durable
        cursor stands right after the last message the application took."""
        conn = self.conn
        if conn.closed or not self.ready:
            return
        for subscription in subscriptions:
            if subscription._done or subscription._other:
                flush_settles(self, subscription)
            consumed = subscription._consumed
            if consumed > subscription._acked:
                with contextlib.suppress(LocalProtocolError):  # being freed
                    conn.ack(subscription.handle, consumed)
                    subscription._acked = consumed
                    subscription._unacked = 0
                    self.held.forget(subscription)

    # ---------------------------------------------------------------- statistics

    def statistics(self) -> dict[str, int]:
        """Messages published/confirmed, subscriptions, bytes, resends, resumes, duplicates."""
        return {
            **self.cache.statistics(),
            "subscriptions": len(self.subscriptions),
            "bytes_sent": self.conn.bytes_sent,
            "bytes_received": self.conn.bytes_received,
            "frames_resent": self.frames_resent,
            "resumes": self.resumes,
            "frames_resent_on_resume": self.frames_resent_on_resume,
            "sessions_lost": self.sessions_lost,
            "duplicates_dropped": self.duplicates_dropped,
        }
