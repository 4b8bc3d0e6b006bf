"""One end of a broker connection, sans-IO: bytes in, events out, bytes to send.

A :class:`Connection` never performs I/O and never reads a clock. Feed it
what the socket produced with :meth:`Connection.receive_data` (passing the
current time), act on the events it returns, and write
:meth:`Connection.data_to_send` to the socket. The same class serves both
roles: a client publishes and receives deliveries; a broker receives
publishes and sends deliveries.

A peer that breaks the protocol never gets a traceback out of this class:
:meth:`receive_data` queues a ``Goodbye`` with the matching code, reports
:class:`ConnectionClosed` carrying the error, and the frame that broke the
rule has changed nothing.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from ._codec import (
    MAX_DELIVER_MANY,
    deliver_heads,
    deliver_many_head,
    deliver_many_head_size,
    encode,
    encode_body,
    encode_deliver,
    encode_publish,
)
from ._errors import LocalProtocolError, RemoteProtocolError
from ._events import (
    ConnectionClosed,
    DeliverManyReceived,
    DeliverReceived,
    DropAnnounced,
    Event,
    FramesAbandoned,
    GuaranteesReceived,
    HandleDeleted,
    HandleFreeProposed,
    HelloReceived,
    PublishReceived,
    Subscribed,
    SubscriptionDropped,
    TopicBound,
    WelcomeReceived,
)
from ._framing import FrameDecoder
from ._guarantees import (
    ChannelReceiver,
    ChannelSender,
    ReceiverStatistics,
    SenderStatistics,
    SentFrame,
)
from ._handles import Binding, HandleState, HandleTable
from ._liveness import Liveness
from ._messages import (
    Abort,
    Absolve,
    Ack,
    AnnounceDropping,
    Apologise,
    BindTopic,
    Commit,
    Confirm,
    Deliver,
    DeliverMany,
    FreeHandle,
    Gap,
    Goodbye,
    Headers,
    Hello,
    IssueGuarantee,
    LimitReceiving,
    LimitSending,
    Message,
    Options,
    Outcome,
    Ping,
    Plead,
    Pong,
    Publish,
    Stage,
    Subscribe,
    Throttled,
    Welcome,
)
from ._names import check_topic_name, topic_name_problem
from ._policy import Policy
from ._session import BrokerSessionState, ClientSessionState, SubscriptionInfo, check_welcome
from ._short_run import ShortRun
from ._types import (
    DEFAULT_MAX_FRAME,
    LENGTH_PREFIX,
    PROTOCOL_VERSION,
    SUBSCRIPTION_BINDS,
    TOPIC_BINDS,
    U64_MAX,
    Channel,
    ChannelKind,
    DeliveryMode,
    GoodbyeCode,
    HandleType,
    Role,
    channel_sender,
)

#: The handle type a publish/deliver channel's index names, and back.
_HANDLE_TYPE_OF_KIND: dict[int, HandleType] = {
    ChannelKind.PUBLISH: HandleType.TOPIC,
    ChannelKind.DELIVER: HandleType.SUBSCRIPTION,
}
_KIND_OF_HANDLE_TYPE: dict[HandleType, int] = {
    handle_type: kind for kind, handle_type in _HANDLE_TYPE_OF_KIND.items()
}
#: The channel that binds each handle type, and back.
_BIND_CHANNEL = {HandleType.TOPIC: TOPIC_BINDS, HandleType.SUBSCRIPTION: SUBSCRIPTION_BINDS}
_HANDLE_TYPE_OF_BIND_CHANNEL = {
    channel: handle_type for handle_type, channel in _BIND_CHANNEL.items()
}


def _handle_channel(handle_type: HandleType, handle: int) -> Channel:
    """The publish or deliver channel of a handle."""
    return Channel(_KIND_OF_HANDLE_TYPE[handle_type], handle)


class NoGuarantees(LocalProtocolError):
    """The channel has no room for this frame now.

    Nothing was sent and nothing changed; try again after a
    :class:`GuaranteesReceived` event for the channel.
    """


class ConnectionState(Enum):
    """Lifecycle of a connection."""

    IDLE = "idle"  # client, before hello()
    AWAIT_WELCOME = "await-welcome"  # client, Hello sent
    AWAIT_HELLO = "await-hello"  # broker, nothing received yet
    HELLO_RECEIVED = "hello-received"  # broker, welcome() not yet called
    OPEN = "open"
    CLOSED = "closed"


@dataclass(slots=True, frozen=True)
class ConnectionStatistics:
    """A snapshot of a connection: counters, channels and handles."""

    role: Role
    state: ConnectionState
    frames_received: int
    bytes_received: int
    frames_sent: int
    bytes_sent: int
    discarded_frames: int
    topics_bound: int
    subscriptions_bound: int
    receivers: list[ReceiverStatistics] = field(default_factory=list)
    senders: list[SenderStatistics] = field(default_factory=list)


#: A Deliver may exceed ``max_frame`` by this much (its per-subscriber fields),
#: so that any Publish the broker accepted can be delivered.
DELIVER_SLACK = 32
#: Goodbye reasons are cut to this many characters (they may echo peer input).
MAX_REASON = 200
#: The largest frame body a broker accepts before the client's Hello: what an
#: unauthenticated peer can make it buffer (``max_frame`` applies after it).
MAX_HELLO_FRAME = 16 * 1024
#: What CPython spends on one queued output piece besides its bytes: the
#: header and allocator rounding of a small ``bytes`` object (at most 48)
#: and its slot in the queue's list (8, plus the list's over-allocation).
PIECE_OVERHEAD = 64
_DEFAULT_HEARTBEAT = 5.0
_DEFAULT_LEASE = 15.0


class Connection:
    """The protocol state of one connection, for either role."""

    def __init__(
        self,
        role: Role,
        *,
        policy: Policy | None = None,
        max_frame: int = DEFAULT_MAX_FRAME,
        heartbeat: float = _DEFAULT_HEARTBEAT,
        lease: float = _DEFAULT_LEASE,
        now: float = 0.0,
    ) -> None:
        self.role = role
        self.policy = policy if policy is not None else Policy()
        #: Largest frame body this side accepts (announced in Welcome by a broker).
        self.max_frame = max_frame
        #: Largest frame body the peer accepts.
        self.peer_max_frame = DEFAULT_MAX_FRAME
        self.state = ConnectionState.IDLE if role is Role.CLIENT else ConnectionState.AWAIT_HELLO
        self.liveness = Liveness(heartbeat, lease, now, now)
        here = role is Role.CLIENT
        #: Topic handles -> topic names.
        self.topics: HandleTable[str] = HandleTable(HandleType.TOPIC, created_here=here)
        #: Subscription handles -> what they subscribe to.
        self.subscriptions: HandleTable[SubscriptionInfo] = HandleTable(
            HandleType.SUBSCRIPTION, created_here=here
        )
        self.hello_message: Hello | None = None
        self.welcome_message: Welcome | None = None
        #: Broker: per topic handle, Publish frames accepted (resume data).
        self.publishes_received: dict[int, int] = {}
        #: Client: per subscription handle, the last sequence acknowledged.
        self.processed: dict[int, int] = {}
        #: Client: per topic handle, the Publish frames the broker has not
        #: confirmed yet (kept for a resume), and how many it confirmed.
        self._retained: dict[int, deque[bytes]] = {}
        self._retained_base: dict[int, int] = {}
        #: Client: the session this connection resumes (see :meth:`hello`).
        self._resume: ClientSessionState | None = None
        #: Client: FreeHandles of resumed topics, sent once their resends are.
        self._frees_after_resend: dict[int, FreeHandle] = {}
        #: Broker: handles restored from a session, whose bind frames hold
        #: space taken off the bind channel's capacity (grown back when freed).
        self._restored_binds: set[tuple[HandleType, int]] = set()
        self.frames_received = 0
        self.bytes_received = 0
        self.frames_sent = 0
        self.bytes_sent = 0
        #: Frames referencing a handle whose bind was dropped, discarded silently.
        self.discarded_frames = 0
        # A broker accepts only a small frame (the Hello) before the Hello.
        first = min(max_frame, MAX_HELLO_FRAME) if role is Role.BROKER else max_frame
        self._decoder = FrameDecoder(max_frame=first)
        self._out: list[bytes] = []
        self._out_size = 0
        self._receivers: dict[Channel, ChannelReceiver] = {}
        self._senders: dict[Channel, ChannelSender] = {}
        self._pending_binds: dict[HandleType, deque[tuple[BindTopic | Subscribe, int]]] = {
            HandleType.TOPIC: deque(),
            HandleType.SUBSCRIPTION: deque(),
        }
        #: Broker: bytes each live handle holds on its bind channel.
        self._bind_sizes: dict[tuple[HandleType, int], int] = {}
        #: Topic handles whose publishes are staged, and where.
        self._stages: dict[int, Stage] = {}
        #: Client: the number of the last Commit or Abort sent.
        self._last_request = 0
        self._ping_nonce = 0
        #: Set by the short path of the frame just handled (see ShortRun).
        self._run: ShortRun | None = None
        #: The client reads DeliverMany frames (its Hello said so / this one's does).
        self._many = False

    # ================================================================ bytes in / out

    def receive_data(self, data: bytes | bytearray | memoryview, now: float) -> list[Event]:
        """Process bytes from the peer; returns what happened, in order.

        A protocol violation ends the list with :class:`ConnectionClosed`
        (with ``error`` set) after queueing a ``Goodbye``; frames before the
        bad one stay applied, the bad one changes nothing.
        """
        if self.state is ConnectionState.CLOSED:
            return []
        if self.state is ConnectionState.IDLE:
            raise LocalProtocolError("call hello() before receiving data")
        events: list[Event] = []
        self._decoder.feed(data)
        if data:
            self.liveness.on_received(now)
        handlers = _HANDLERS
        closed = ConnectionState.CLOSED
        frames = received = 0
        run: ShortRun | None = None
        try:
            for message, size in self._decoder.messages():
                frames += 1
                received += size
                kind = type(message)
                if run is not None and kind is run.kind and run.take(message, size, events):
                    continue
                self._run = None
                handlers[kind](self, message, size, events)
                run = self._run
                if self.state is closed:
                    break
        except RemoteProtocolError as error:
            reason = self._queue_goodbye(int(error.code), error.reason)
            self.state = ConnectionState.CLOSED
            events.append(ConnectionClosed(int(error.code), reason, False, error))
        finally:
            self.frames_received += frames
            self.bytes_received += received
        return events

    def data_to_send(self, now: float | None = None) -> bytes:
        """Everything queued for the peer, as one buffer (empty if nothing).

        Passing ``now`` records the moment for heartbeat bookkeeping.
        """
        if not self._out:
            return b""
        data = b"".join(self._out)
        self._out.clear()
        self._out_size = 0
        if now is not None:
            self.liveness.on_sent(now)
        return data

    @property
    def bytes_to_send(self) -> int:
        """Bytes queued for the peer that :meth:`data_to_send` has not returned yet."""
        return self._out_size

    @property
    def memory_to_send(self) -> int:
        """An upper estimate of the memory the output queue holds: its bytes
        plus :data:`PIECE_OVERHEAD` per queued piece. Bound this, not
        :attr:`bytes_to_send`, for a peer that does not read: many tiny
        frames (a Pong per Ping) cost several times their bytes."""
        return self._out_size + PIECE_OVERHEAD * len(self._out)

    @property
    def closed(self) -> bool:
        """A Goodbye was sent or received; nothing more is processed."""
        return self.state is ConnectionState.CLOSED

    def _queue(self, message: Message) -> None:
        self._put(encode(message, max_frame=self.peer_max_frame))

    def _put(self, frame: bytes, tail: bytes = b"") -> None:
        """Queue one frame (optionally as a head and a shared ``tail``)."""
        self._out.append(frame)
        if tail:
            self._out.append(tail)
        size = len(frame) + len(tail)
        self.frames_sent += 1
        self.bytes_sent += size
        self._out_size += size

    def _queue_all(self, messages: list[Any]) -> None:
        for message in messages:
            self._queue(message)

    def _require_open(self) -> None:
        if self.state is not ConnectionState.OPEN:
            raise LocalProtocolError(f"connection is {self.state.value}, not open")

    def _require_role(self, role: Role, what: str) -> None:
        if self.role is not role:
            raise LocalProtocolError(f"only a {role.name.lower()} can {what}")

    # ================================================================ session

    def hello(
        self,
        client: str,
        *,
        session: bytes | None = None,
        processed: dict[int, int] | None = None,
        token: str | None = None,
        resume: ClientSessionState | None = None,
        deliver_many: bool = False,
    ) -> None:
        """Client: open the connection (a new session, or resume ``session``),
        presenting ``token`` to a broker that authenticates its clients.

        With ``deliver_many`` the Hello says this client reads
        :class:`DeliverMany` frames, so the broker may deliver many messages
        in one frame; without it (the default) every delivery comes as a
        Deliver.

        With ``resume`` (an earlier connection's :meth:`session_state`), the
        session is resumed: if the broker still has it, every handle is
        restored and what the broker did not receive (binds, publishes) is
        sent again, in order, before anything new; otherwise the Welcome says
        ``resumed=False`` and this is a new, empty session.
        """
        self._require_role(Role.CLIENT, "say hello")
        if self.state is not ConnectionState.IDLE:
            raise LocalProtocolError("hello() was already called")
        if resume is not None:
            session = resume.session
            processed = {h: resume.processed.get(h, 0) for h in resume.subscriptions}
            self._resume = resume
        message = Hello(
            PROTOCOL_VERSION, client, session, dict(processed or {}), token, deliver_many
        )
        self._queue(message)
        self.hello_message = message
        self._many = deliver_many
        self.state = ConnectionState.AWAIT_WELCOME

    def welcome(
        self,
        *,
        session: bytes,
        epoch: bytes,
        resumed: bool = False,
        lease_ms: int | None = None,
        heartbeat_ms: int | None = None,
        received: dict[int, int] | None = None,
        restore: BrokerSessionState | None = None,
    ) -> None:
        """Broker: accept the client's Hello; opens the bind channels.

        ``restore`` resumes a session: its handles are bound again (publish
        channels opened, delivery channels ready), and the Welcome tells the
        client what the broker received and bound, so that it resends the rest.
        """
        self._require_role(Role.BROKER, "welcome a client")
        if self.state is not ConnectionState.HELLO_RECEIVED:
            raise LocalProtocolError(f"welcome() needs a Hello first (state {self.state.value})")
        if len(session) != 16:
            raise LocalProtocolError("a session id is 16 bytes")
        if resumed and restore is None:
            raise LocalProtocolError("a resumed session needs the state to restore")
        surviving = None
        if restore is not None:
            resumed = True
            received = restore.received
            surviving = self._surviving_subscriptions(restore)
        if lease_ms is not None:
            self.liveness.lease = lease_ms / 1000
        if heartbeat_ms is not None:
            self.liveness.heartbeat = heartbeat_ms / 1000
        message = Welcome(
            PROTOCOL_VERSION,
            session,
            resumed,
            epoch,
            round(self.liveness.lease * 1000),
            round(self.liveness.heartbeat * 1000),
            self.max_frame,
            dict(received or {}),
            None if restore is None else (restore.next_topic, restore.next_subscription),
            surviving,
        )
        self._queue(message)
        self.welcome_message = message
        self.peer_max_frame = self.max_frame + DELIVER_SLACK
        self.state = ConnectionState.OPEN
        if restore is not None:
            self._restore_broker(restore)
            return
        for channel in (TOPIC_BINDS, SUBSCRIPTION_BINDS):
            self._open_receiver(channel)

    def _surviving_subscriptions(self, state: BrokerSessionState) -> tuple[int, ...] | None:
        """The Welcome's ``subscriptions``: those ``state`` keeps, if it lacks
        one the Hello listed below its count (else None: all survive)."""
        assert self.hello_message is not None
        listed = self.hello_message.processed
        if all(h >= state.next_subscription or h in state.subscriptions for h in listed):
            return None
        return tuple(sorted(state.subscriptions))

    def _restore_broker(self, state: BrokerSessionState) -> None:
        self.topics.restore({h: name for h, (name, _) in state.topics.items()}, state.next_topic)
        self.subscriptions.restore(
            {h: info for h, (info, _) in state.subscriptions.items()}, state.next_subscription
        )
        held = {HandleType.TOPIC: 0, HandleType.SUBSCRIPTION: 0}
        for handle_type, bindings in (
            (HandleType.TOPIC, state.topics),
            (HandleType.SUBSCRIPTION, state.subscriptions),
        ):
            for handle, (_, size) in bindings.items():
                self._bind_sizes[(handle_type, handle)] = size
                self._restored_binds.add((handle_type, handle))
                held[handle_type] += size
        for handle_type, channel in _BIND_CHANNEL.items():
            capacity = self.policy.initial_capacity(channel) - held[handle_type]
            self._open_receiver(channel, max(capacity, 0))
        self.publishes_received = {h: state.received.get(h, 0) for h in state.topics}
        self._stages = {h: s for h, s in state.stages.items() if h in state.topics}
        for handle in state.topics:
            self._open_receiver(Channel(ChannelKind.PUBLISH, handle))
        for handle in state.subscriptions:
            channel = Channel(ChannelKind.DELIVER, handle)
            self._senders[channel] = ChannelSender(channel)

    def session_state(self) -> BrokerSessionState | ClientSessionState:
        """What this side must keep of the session to resume it on a new
        connection (a broker: its live handles and publish counts; a client:
        its handles, processed sequence numbers and unconfirmed publishes).

        Valid at any time after the handshake, the connection closed or not.
        Handles being freed are left out (a client keeps topic handles it
        proposed to free, and proposes again on resume). A broker that defers
        bind processing calls :meth:`process_binds` first.
        """
        if self.welcome_message is None:
            raise LocalProtocolError("no session before the handshake")
        bound = HandleState.BOUND
        if self.role is Role.BROKER:
            topics = {
                h: (b.value, self._bind_sizes.get((HandleType.TOPIC, h), 0))
                for h, b in self.topics.items()
                if b.state is bound
            }
            return BrokerSessionState(
                topics,
                {
                    h: (b.value, self._bind_sizes.get((HandleType.SUBSCRIPTION, h), 0))
                    for h, b in self.subscriptions.items()
                    if b.state is bound
                },
                self.topics.next_handle,
                self.subscriptions.next_handle,
                {h: self.publishes_received.get(h, 0) for h in topics},
                {h: s for h, s in self._stages.items() if h in topics},
            )
        proposed = HandleState.PROPOSED
        live_topics = {
            h: b.value for h, b in self.topics.items() if b.state is bound or b.state is proposed
        }
        subscriptions = {h: b.value for h, b in self.subscriptions.items() if b.state is bound}
        return ClientSessionState(
            session=self.welcome_message.session,
            epoch=self.welcome_message.epoch,
            topics=live_topics,
            freeing_topics=frozenset(
                h for h, b in self.topics.items() if b.state is HandleState.PROPOSED
            ),
            subscriptions=subscriptions,
            next_topic=self.topics.next_handle,
            next_subscription=self.subscriptions.next_handle,
            processed={h: self.processed.get(h, 0) for h in subscriptions},
            retained={
                h: (self._retained_base.get(h, 0), tuple(self._retained.get(h, ())))
                for h in live_topics
            },
            stages={h: s for h, s in self._stages.items() if h in live_topics},
        )

    def goodbye(self, code: GoodbyeCode | int = GoodbyeCode.NORMAL, reason: str = "") -> None:
        """Queue a Goodbye and close; received data is ignored from now on."""
        if self.state is ConnectionState.CLOSED:
            return
        self._queue_goodbye(int(code), reason)
        self.state = ConnectionState.CLOSED

    def _queue_goodbye(self, code: int, reason: str) -> str:
        """Queue a Goodbye whose reason is cut to fit; returns the reason sent."""
        reason = reason[:MAX_REASON]
        while len(encode_body(Goodbye(code, reason))) > self.peer_max_frame and reason:
            reason = reason[: len(reason) // 2]
        self._queue(Goodbye(code, reason))
        return reason

    def ping(self) -> int:
        """Queue a Ping; returns its nonce (the Pong event carries it back)."""
        self._require_open()
        self._ping_nonce = (self._ping_nonce + 1) & U64_MAX
        self._queue(Ping(self._ping_nonce))
        return self._ping_nonce

    def ping_due(self, now: float) -> bool:
        """This side has sent nothing for a heartbeat interval."""
        return self.liveness.ping_due(now)

    def peer_gone(self, now: float) -> bool:
        """The peer has been silent for its whole lease."""
        return self.liveness.peer_gone(now)

    def next_deadline(self) -> float:
        """When to call :meth:`handle_timer` next."""
        return self.liveness.next_deadline()

    def handle_timer(self, now: float) -> list[Event]:
        """Run the keepalive timers at ``now``; returns what happened.

        When the peer has been silent for its whole lease, this queues a
        ``Goodbye`` (code LEASE_EXPIRED), closes, and returns one
        :class:`ConnectionClosed` (``by_peer`` false, no ``error``). Otherwise,
        once this side has been silent for a heartbeat interval, it queues a
        ``Ping`` (after the handshake only) and counts it as sent at ``now``,
        so a slow writer still sends one Ping per heartbeat. Call it at
        :meth:`next_deadline` (earlier or later is harmless).
        """
        if self.state is ConnectionState.CLOSED:
            return []
        liveness = self.liveness
        if liveness.peer_gone(now):
            if self.role is Role.CLIENT:
                reason = "broker silent"
            elif self.hello_message is None:
                reason = "no Hello in time"
            else:
                reason = "lease expired"
            reason = self._queue_goodbye(int(GoodbyeCode.LEASE_EXPIRED), reason)
            self.state = ConnectionState.CLOSED
            return [ConnectionClosed(int(GoodbyeCode.LEASE_EXPIRED), reason, False)]
        if liveness.ping_due(now):
            if self.state is ConnectionState.OPEN:
                self.ping()
            liveness.on_sent(now)
        return []

    def suspend_reading(self, now: float) -> None:
        """This side stopped reading (e.g. its account is in debt): the peer's
        silence from ``now`` on does not count against its lease."""
        self.liveness.suspend(now)

    def resume_reading(self, now: float) -> None:
        """This side reads again; the time spent suspended is forgiven."""
        self.liveness.resume(now)

    def _on_hello(self, message: Hello, size: int, events: list[Event]) -> None:
        if self.role is not Role.BROKER or self.state is not ConnectionState.AWAIT_HELLO:
            raise RemoteProtocolError("unexpected Hello")
        if message.version != PROTOCOL_VERSION:
            raise RemoteProtocolError(f"unsupported protocol version {message.version}")
        self.hello_message = message
        self._many = message.deliver_many
        self.state = ConnectionState.HELLO_RECEIVED
        self._decoder.max_frame = self.max_frame
        events.append(HelloReceived(message))

    def _on_welcome(self, message: Welcome, size: int, events: list[Event]) -> None:
        if self.role is not Role.CLIENT or self.state is not ConnectionState.AWAIT_WELCOME:
            raise RemoteProtocolError("unexpected Welcome")
        resume = self._resume
        check_welcome(message, resume)  # a refused Welcome changes nothing
        self.welcome_message = message
        self.peer_max_frame = message.max_frame
        self._decoder.max_frame = max(self.max_frame, message.max_frame + DELIVER_SLACK)
        self.liveness.lease = message.lease_ms / 1000
        self.liveness.heartbeat = message.heartbeat_ms / 1000
        self.state = ConnectionState.OPEN
        for channel in (TOPIC_BINDS, SUBSCRIPTION_BINDS):
            self._senders[channel] = ChannelSender(channel)
        resent = 0
        dropped: list[Event] = []
        if message.resumed:
            assert resume is not None
            resent = self._restore_client(resume, message, dropped)
        self._resume = None
        events.append(WelcomeReceived(message, resent))
        events += dropped

    def _restore_client(
        self, state: ClientSessionState, welcome: Welcome, dropped: list[Event]
    ) -> int:
        """Bind the resumed session's handles again and queue, for sending
        before anything new, what the broker did not receive; returns how
        many frames that is. Subscriptions the broker no longer has are
        left out, each reported in ``dropped``. The Welcome is checked."""
        assert welcome.bound is not None
        bound_topics, bound_subscriptions = welcome.bound
        received = welcome.received
        # Topic handles below the broker's count that it no longer lists were freed there.
        topics = {h: name for h, name in state.topics.items() if h >= bound_topics or h in received}
        self.topics.restore(topics, state.next_topic)
        self._stages = {h: s for h, s in state.stages.items() if h in topics}
        # So are subscription handles it does not list, when it lists them.
        subscriptions = dict(state.subscriptions)
        if welcome.subscriptions is not None:
            for handle in sorted(set(subscriptions).difference(welcome.subscriptions)):
                if handle < bound_subscriptions:
                    name = subscriptions.pop(handle).topic_name
                    dropped.append(SubscriptionDropped(handle, name))
        self.subscriptions.restore(subscriptions, state.next_subscription)
        self.processed = {h: n for h, n in state.processed.items() if h in subscriptions}
        resent = 0
        binds = self._senders[TOPIC_BINDS]
        for handle in sorted(topics):
            channel = Channel(ChannelKind.PUBLISH, handle)
            sender = self._senders[channel] = ChannelSender(channel)
            if handle >= bound_topics:
                bind = BindTopic(topics[handle], self._stages.get(handle))
                resent += self._queue_resend(binds, bind)
            base, frames = state.retained.get(handle, (0, ()))
            count = received.get(handle, 0)
            missing = frames[count - base :]
            self._retained[handle] = deque(missing)
            self._retained_base[handle] = count
            for frame in missing:
                sender.retransmit.append(SentFrame(len(frame), frame, None))
            resent += len(missing)
        subscribes = self._senders[SUBSCRIPTION_BINDS]
        for handle, info in sorted(subscriptions.items()):
            if handle >= bound_subscriptions:
                message = Subscribe(info.topic, info.mode, dict(info.options))
                resent += self._queue_resend(subscribes, message)
            self._open_receiver(Channel(ChannelKind.DELIVER, handle))
        for handle in sorted(state.freeing_topics & topics.keys()):
            # Proposed again once its resent bind and publishes are out.
            self._frees_after_resend[handle] = self.topics.propose_free(handle)
        self._send_deferred_frees()
        return resent

    def _send_deferred_frees(self) -> None:
        """Client: re-propose freeing the resumed topics whose resends are all sent."""
        if not self._frees_after_resend:
            return
        for handle, message in list(self._frees_after_resend.items()):
            sender = self._senders.get(Channel(ChannelKind.PUBLISH, handle))
            if (sender is None or not sender.retransmit) and not self._bind_awaits_retransmission(
                handle
            ):
                del self._frees_after_resend[handle]
                self._queue(message)

    def _queue_resend(self, sender: ChannelSender, message: BindTopic | Subscribe) -> int:
        frame = encode(message, max_frame=self.peer_max_frame)
        sender.retransmit.append(SentFrame(len(frame), frame, message))
        return 1

    def _check_open(self, message: Message) -> None:
        if self.state is not ConnectionState.OPEN:
            raise RemoteProtocolError(f"{type(message).__name__} before the handshake completed")

    def _on_goodbye(self, message: Goodbye, size: int, events: list[Event]) -> None:
        self.state = ConnectionState.CLOSED
        events.append(ConnectionClosed(message.code, message.reason, True))

    def _on_ping(self, message: Ping, size: int, events: list[Event]) -> None:
        self._check_open(message)
        self._queue(Pong(message.nonce))

    def _on_passthrough(self, message: Any, size: int, events: list[Event]) -> None:
        self._check_open(message)
        events.append(message)

    def _on_throttled(self, message: Throttled, size: int, events: list[Event]) -> None:
        self._check_open(message)
        if self.role is not Role.CLIENT or channel_sender(message.channel) is not Role.CLIENT:
            raise RemoteProtocolError("Throttled is sent by the broker about a client channel")
        self._check_channel_handle(message.channel, events)
        events.append(message)

    # ================================================================ handles

    def _table(self, handle_type: HandleType | int) -> HandleTable[Any]:
        return self.topics if handle_type == HandleType.TOPIC else self.subscriptions

    def _resolve_peer_reference(
        self, handle_type: HandleType, handle: int, events: list[Event]
    ) -> Binding[Any] | None:
        """The binding a received message references, processing pending binds first.

        None means the handle is still unbound: its bind was dropped.
        """
        table = self._table(handle_type)
        binding = table.resolve_remote(handle)
        if binding is None and self._pending_binds[handle_type]:
            self._process_pending(handle_type, events)
            binding = table.resolve_remote(handle)
        return binding

    def _resolve_required(
        self, handle_type: HandleType, handle: int, events: list[Event], what: str
    ) -> Binding[Any]:
        binding = self._resolve_peer_reference(handle_type, handle, events)
        if binding is None:
            raise RemoteProtocolError(
                f"{what} references unbound {handle_type.name.lower()} handle {handle}"
            )
        return binding

    def confirmed(self, handle_type: HandleType, handle: int) -> bool:
        """Client: the bind of ``handle`` is known to be processed by the broker.

        Only confirmed handles may be referenced in control messages (and in
        Subscribe); Publish may reference a handle optimistically.
        """
        table = self._table(handle_type)
        if handle not in table:
            return False
        if self.role is Role.BROKER:
            return True
        sender = self._senders[_BIND_CHANNEL[handle_type]]
        pending = len(sender.unconfirmed) + len(sender.retransmit)
        return handle < table.next_handle - pending

    def free_handle(self, handle_type: HandleType, handle: int) -> None:
        """Propose freeing a handle; this side stops using it at once.

        A client may free only confirmed handles, and a topic handle only
        once every Publish sent on it is confirmed.
        """
        self._require_open()
        table = self._table(handle_type)
        table.resolve_local(handle)
        if self.role is Role.CLIENT:
            if not self.confirmed(handle_type, handle):
                raise LocalProtocolError(f"handle {handle} is not confirmed yet")
            if handle_type == HandleType.TOPIC:
                sender = self._senders[Channel(ChannelKind.PUBLISH, handle)]
                if sender.unconfirmed or sender.retransmit:
                    raise LocalProtocolError(
                        f"topic handle {handle} still has unconfirmed publishes"
                    )
                subscribes = self._senders[SUBSCRIPTION_BINDS]
                for entry in (*subscribes.unconfirmed, *subscribes.retransmit):
                    if entry.message.topic == handle:
                        raise LocalProtocolError(
                            f"topic handle {handle} has an unconfirmed Subscribe"
                        )
        self._queue(table.propose_free(handle))

    def _on_free_handle(self, message: FreeHandle, size: int, events: list[Event]) -> None:
        self._check_open(message)
        handle_type = HandleType(message.handle_type)
        if self._pending_binds[handle_type]:
            self._resolve_peer_reference(handle_type, message.handle, events)
        reply, deleted = self._table(handle_type).on_free(message.handle, message.mine)
        if reply is not None:
            self._queue(reply)
            events.append(HandleFreeProposed(int(handle_type), message.handle))
        if deleted:
            self._on_deleted(handle_type, message.handle, events)

    def _on_deleted(self, handle_type: HandleType, handle: int, events: list[Event]) -> None:
        channel = _handle_channel(handle_type, handle)
        self._receivers.pop(channel, None)
        sender = self._senders.pop(channel, None)
        if sender is not None and (sender.unconfirmed or sender.retransmit):
            lost = len(sender.unconfirmed) + len(sender.retransmit)
            events.append(FramesAbandoned(channel, lost))
        if handle_type == HandleType.TOPIC:
            self._stages.pop(handle, None)
        size = self._bind_sizes.pop((handle_type, handle), None)
        if size is not None:
            receiver = self._receivers[_BIND_CHANNEL[handle_type]]
            if (handle_type, handle) in self._restored_binds:
                self._restored_binds.discard((handle_type, handle))
                receiver.grow(size)  # its space was taken off the capacity
            else:
                receiver.release(size)
            self._issue(receiver)
        if handle_type == HandleType.TOPIC:
            self.publishes_received.pop(handle, None)
            self._retained.pop(handle, None)
            self._retained_base.pop(handle, None)
        else:
            self.processed.pop(handle, None)
        events.append(HandleDeleted(int(handle_type), handle))

    def _release_reference(self, handle_type: HandleType, handle: int, events: list[Event]) -> None:
        if self._table(handle_type).release(handle):
            self._on_deleted(handle_type, handle, events)

    # ---------------------------------------------------------------- binds (client side)

    def bind_topic(self, name: str, stage: Stage | None = None) -> int:
        """Client: bind the next topic handle to ``name``; returns the handle.

        Publishing on it may start at once (optimistically, if the policy
        allows); the broker issues the topic's guarantees once it has
        processed the bind. With a ``stage``, the broker stages what is
        published on the handle until a :meth:`commit` of the stage's batch.
        A name that breaks the topic-name rule raises :class:`TopicNameError`
        and sends nothing.
        """
        self._require_role(Role.CLIENT, "bind topics")
        self._require_open()
        check_topic_name(name)
        self._send_frame(self._senders[TOPIC_BINDS], BindTopic(name, stage))
        handle = self.topics.bind(name)
        if stage is not None:
            self._stages[handle] = stage
        self._senders[Channel(ChannelKind.PUBLISH, handle)] = ChannelSender(
            Channel(ChannelKind.PUBLISH, handle)
        )
        return handle

    def subscribe(
        self, topic: int, mode: str = DeliveryMode.RELIABLE, options: Options | None = None
    ) -> int:
        """Client: subscribe to a confirmed topic handle; returns the subscription handle.

        The delivery channel's guarantees are issued as soon as the Subscribe
        is confirmed.
        """
        self._require_role(Role.CLIENT, "subscribe")
        self._require_open()
        if mode not in DeliveryMode.ALL:
            raise LocalProtocolError(f"unknown delivery mode {mode!r}")
        name = self.topics.resolve_local(topic).value
        if topic in self._stages:
            raise LocalProtocolError(f"topic handle {topic} is staged: it cannot be subscribed to")
        if not self.confirmed(HandleType.TOPIC, topic):
            raise LocalProtocolError(f"topic handle {topic} is not confirmed yet")
        opts = dict(options or {})
        self._send_frame(self._senders[SUBSCRIPTION_BINDS], Subscribe(topic, mode, opts))
        handle = self.subscriptions.bind(SubscriptionInfo(topic, name, mode, opts))
        self._open_receiver(Channel(ChannelKind.DELIVER, handle))
        return handle

    # ---------------------------------------------------------------- binds (broker side)

    def _on_bind_frame(
        self, message: BindTopic | Subscribe, size: int, events: list[Event]
    ) -> None:
        self._check_open(message)
        if self.role is not Role.BROKER:
            raise RemoteProtocolError(f"{type(message).__name__} is sent by clients")
        if isinstance(message, Subscribe):
            if message.mode not in DeliveryMode.ALL:
                raise RemoteProtocolError(f"unknown delivery mode {message.mode[:24]!r}")
            self._resolve_required(HandleType.TOPIC, message.topic, events, "Subscribe")
            if message.topic in self._stages:
                raise RemoteProtocolError(f"Subscribe on staged topic handle {message.topic}")
        elif (problem := topic_name_problem(message.name)) is not None:
            raise RemoteProtocolError(f"BindTopic: {problem}")
        receiver = self._receivers[message.channel]
        accepted, out = receiver.on_frame(size)
        self._queue_all(out)
        if not accepted:
            return
        if receiver.sender_balance < 0:
            self._issue(receiver)  # confirm the optimistic frame without delay
        if isinstance(message, Subscribe):
            self.topics.acquire(message.topic)
            handle_type = HandleType.SUBSCRIPTION
        else:
            handle_type = HandleType.TOPIC
        self._pending_binds[handle_type].append((message, size))
        if self.policy.process_binds_on_arrival:
            self._process_pending(handle_type, events)

    def process_binds(self) -> list[Event]:
        """Broker: process every buffered bind now (with deferred bind processing)."""
        events: list[Event] = []
        for handle_type in (HandleType.TOPIC, HandleType.SUBSCRIPTION):
            self._process_pending(handle_type, events)
        return events

    def _process_pending(self, handle_type: HandleType, events: list[Event]) -> None:
        pending = self._pending_binds[handle_type]
        if handle_type == HandleType.SUBSCRIPTION and self._pending_binds[HandleType.TOPIC]:
            self._process_pending(HandleType.TOPIC, events)
        while pending:
            message, size = pending.popleft()
            if isinstance(message, BindTopic):
                handle = self.topics.bind(message.name)
                self._bind_sizes[(HandleType.TOPIC, handle)] = size
                self.publishes_received[handle] = 0
                if message.stage is not None:
                    self._stages[handle] = message.stage
                events.append(TopicBound(handle, message.name, message.stage))
                self._open_receiver(Channel(ChannelKind.PUBLISH, handle))
            else:
                topic_binding = self.topics.get(message.topic)
                assert topic_binding is not None  # referenced, so not deleted
                topic_name = topic_binding.value
                info = SubscriptionInfo(message.topic, topic_name, message.mode, message.options)
                handle = self.subscriptions.bind(info)
                self._bind_sizes[(HandleType.SUBSCRIPTION, handle)] = size
                channel = Channel(ChannelKind.DELIVER, handle)
                self._senders[channel] = ChannelSender(channel)
                events.append(
                    Subscribed(handle, message.topic, topic_name, message.mode, message.options)
                )
                self._release_reference(HandleType.TOPIC, message.topic, events)

    # ================================================================ guarantees

    def _open_receiver(self, channel: Channel, capacity: int | None = None) -> ChannelReceiver:
        if capacity is None:
            capacity = self.policy.initial_capacity(channel)
        receiver = ChannelReceiver(channel, capacity)
        self._receivers[channel] = receiver
        self._issue(receiver)
        return receiver

    def _may_reference(self, channel: Channel) -> bool:
        """Whether this side may still send control messages about ``channel``."""
        handle_type = _HANDLE_TYPE_OF_KIND.get(channel.kind)
        if handle_type is None:
            return True  # a bind channel
        binding = self._table(handle_type).get(channel.index)
        if binding is None or binding.state is not HandleState.BOUND:
            return False
        return self.confirmed(handle_type, channel.index)

    def may_reference(self, channel: Channel) -> bool:
        """Whether this side may still send control messages about ``channel``
        (``confirm``, ``throttled``, guarantees): the connection is open and
        the channel's handle is confirmed and not being freed."""
        return not self.closed and self._may_reference(channel)

    def _require_referable(self, channel: Channel) -> None:
        """Refuse a control message about a handle this side may not reference
        (unconfirmed, or being freed): the peer would close the connection."""
        self._require_open()
        if (channel in self._senders or channel in self._receivers) and not self._may_reference(
            channel
        ):
            raise LocalProtocolError(f"{channel}: its handle is not confirmed or is being freed")

    def _issue(self, receiver: ChannelReceiver) -> None:
        amount = self.policy.amount_to_issue(receiver)
        if amount > 0 and self._may_reference(receiver.channel):
            message = receiver.issue(amount)
            if message is not None:
                self._queue(message)

    def issue_guarantees(self, channel: Channel | None = None) -> None:
        """Issue what the policy allows on ``channel`` (default: every channel).

        Call it when a policy answer changes, e.g. when an account that
        withheld a channel's guarantees falls below its watermark.
        """
        if self.state is not ConnectionState.OPEN:
            return
        if channel is not None:
            self._issue(self._receiver(channel))
            return
        for receiver in list(self._receivers.values()):
            self._issue(receiver)

    def _receiver(self, channel: Channel) -> ChannelReceiver:
        receiver = self._receivers.get(channel)
        if receiver is None:
            raise LocalProtocolError(f"this side does not receive on {channel}")
        return receiver

    def _sender(self, channel: Channel) -> ChannelSender:
        sender = self._senders.get(channel)
        if sender is None:
            raise LocalProtocolError(f"this side does not send on {channel}")
        return sender

    def grow(self, channel: Channel, amount: int) -> None:
        """Add buffer capacity to a receiving channel (issued per policy)."""
        self._require_open()
        receiver = self._receiver(channel)
        receiver.grow(amount)
        self._issue(receiver)

    def set_capacity(self, channel: Channel, target: int, *, plead: bool | None = None) -> None:
        """Resize a receiving channel's buffer.

        Growing issues per policy. Shrinking reclaims unpromised space at
        once, then processed frames, and (with ``plead``, by default the
        policy's ``plead_on_shrink``) asks the sender to absolve what neither
        can reclaim.
        """
        if plead is None:
            plead = self.policy.plead_on_shrink
        self._require_open()
        receiver = self._receiver(channel)
        receiver.set_capacity(target)
        self._issue(receiver)
        if plead and self._may_reference(channel):
            message = receiver.plead_for_target()
            if message is not None:
                self._queue(message)

    def plead(self, channel: Channel, target: int) -> None:
        """Ask the sender of ``channel`` to keep only ``target`` bytes of guarantees."""
        self._require_referable(channel)
        self._queue(self._receiver(channel).plead(target))

    def limit_receiving(self, channel: Channel, bound: int) -> None:
        """Promise to issue at most ``bound`` more guarantee bytes on ``channel``."""
        self._require_referable(channel)
        self._queue(self._receiver(channel).limit_receiving(bound))

    def limit_sending(self, channel: Channel, bound: int) -> None:
        """Promise to send (or absolve) at most ``bound`` more bytes on ``channel``."""
        self._require_referable(channel)
        self._queue(self._sender(channel).limit_sending(bound))

    def absolve(self, channel: Channel, amount: int) -> None:
        """Give back ``amount`` bytes of guarantees on ``channel``."""
        self._require_referable(channel)
        self._queue(self._sender(channel).absolve(amount))

    def release(
        self, event: PublishReceived | DeliverReceived | DeliverManyReceived
    ) -> list[Event]:
        """A received Publish, Deliver or DeliverMany has been processed
        (all of a DeliverMany's entries): free its buffer space.

        Returns the events this causes: a :class:`HandleDeleted` when the
        frame was the last reference to a handle being freed.
        """
        if type(event) is DeliverManyReceived:
            return self.release_frames(event.channel, event.size, len(event.message.entries))
        return self.release_frame(event.channel, event.size)

    def release_frame(self, channel: Channel, size: int) -> list[Event]:
        """Free ``size`` bytes of a processed frame on ``channel``; see :meth:`release`."""
        return self.release_frames(channel, size, 1)

    def release_frames(self, channel: Channel, size: int, count: int) -> list[Event]:
        """Free ``count`` processed frames of ``size`` bytes in all on ``channel``.

        The same as releasing each frame in turn (:meth:`release_frame`),
        with guarantees issued once for the lot. A DeliverMany counts as one
        frame per entry here (each entry references its subscription).
        """
        if channel.kind not in (ChannelKind.PUBLISH, ChannelKind.DELIVER):
            raise LocalProtocolError("bind channels are released by the protocol itself")
        if count < 1:
            raise LocalProtocolError(f"cannot release {count} frames")
        receiver = self._receiver(channel)
        handle_type = _HANDLE_TYPE_OF_KIND[channel.kind]
        table = self._table(handle_type)
        if table.references(channel.index) < count:
            raise LocalProtocolError(f"{channel}: {count} frames are not buffered")
        receiver.release(size)
        events: list[Event] = []
        if table.release(channel.index, count):
            self._on_deleted(handle_type, channel.index, events)
        if channel in self._receivers and self.state is ConnectionState.OPEN:
            self._issue(receiver)
        return events

    def room(self, channel: Channel) -> int:
        """The largest frame this side may send on ``channel`` now."""
        return self._room(self._sender(channel))

    def _room(self, sender: ChannelSender) -> int:
        channel = sender.channel
        if channel.kind == ChannelKind.PUBLISH and self._bind_awaits_retransmission(channel.index):
            # The broker discards publishes on a handle it has not bound; wait
            # until the dropped bind has been sent again.
            return 0
        return sender.room(self._optimism(channel))

    def _bind_awaits_retransmission(self, topic: int) -> bool:
        waiting = len(self._senders[TOPIC_BINDS].retransmit)
        return waiting > 0 and topic >= self.topics.next_handle - waiting

    def _optimism(self, channel: Channel) -> int:
        # The broker never sends beyond a subscriber's guarantees.
        if channel.kind == ChannelKind.DELIVER:
            return 0
        return self.policy.optimism_for(channel)

    def _send_frame(
        self, sender: ChannelSender, message: Any, frame: bytes | None = None, tail: bytes = b""
    ) -> int:
        """Send a channel frame (default: ``message`` encoded) if it fits."""
        if frame is None:
            frame = encode(message, max_frame=self.peer_max_frame)
        size = len(frame) + len(tail)
        room = self._room(sender)
        if size > room:
            raise NoGuarantees(
                f"{sender.channel}: {size}-byte frame does not fit (room {room} bytes)"
            )
        # Only deliveries come with a tail, and they never go beyond the guarantees
        # (no optimism on [3, s]), so they are never kept for retransmission.
        sender.record_sent(SentFrame(size, b"" if tail else frame, message))
        self._put(frame, tail)
        return size

    def _pump_retransmissions(self, sender: ChannelSender, events: list[Event]) -> None:
        while (entry := sender.next_retransmission()) is not None:
            sender.record_sent(entry)
            self._put(entry.frame)
        self._send_deferred_frees()
        abandoned = sender.abandon_stuck_retransmissions()
        if abandoned:
            events.append(FramesAbandoned(sender.channel, len(abandoned)))
            if self.role is Role.CLIENT and sender.channel in _HANDLE_TYPE_OF_BIND_CHANNEL:
                self._undo_binds(sender.channel, len(abandoned), events)

    def _undo_binds(self, channel: Channel, count: int, events: list[Event]) -> None:
        """Client: bind frames that will never be sent bind nothing at the broker.

        They are the newest binds of their type, so undoing them keeps both
        sides' handle numbers in step.
        """
        handle_type = _HANDLE_TYPE_OF_BIND_CHANNEL[channel]
        for handle in self._table(handle_type).unbind_last(count):
            if handle_type == HandleType.TOPIC:
                self._retained.pop(handle, None)
                self._retained_base.pop(handle, None)
            handle_channel = _handle_channel(handle_type, handle)
            lost = self._senders.pop(handle_channel, None)
            if lost is not None and (lost.unconfirmed or lost.retransmit):
                events.append(
                    FramesAbandoned(lost.channel, len(lost.unconfirmed) + len(lost.retransmit))
                )
            self._receivers.pop(handle_channel, None)
            events.append(HandleDeleted(int(handle_type), handle))

    # ---------------------------------------------------------------- guarantee messages in

    def _peer_receives(self, channel: Channel, events: list[Event]) -> ChannelSender:
        """The sender state for a control message the channel's receiver sent."""
        if channel_sender(channel) is not self.role:
            raise RemoteProtocolError(f"{channel} is not a channel this side sends on")
        self._check_channel_handle(channel, events)
        sender = self._senders.get(channel)
        if sender is None:
            raise RemoteProtocolError(f"{channel} is not open")
        return sender

    def _peer_sends(self, channel: Channel, events: list[Event]) -> ChannelReceiver:
        """The receiver state for a control message the channel's sender sent."""
        if channel_sender(channel) is self.role:
            raise RemoteProtocolError(f"{channel} is not a channel this side receives on")
        self._check_channel_handle(channel, events)
        receiver = self._receivers.get(channel)
        if receiver is None:
            raise RemoteProtocolError(f"{channel} is not open")
        return receiver

    def _check_channel_handle(self, channel: Channel, events: list[Event]) -> None:
        handle_type = _HANDLE_TYPE_OF_KIND.get(channel.kind)
        if handle_type is not None:
            self._resolve_required(handle_type, channel.index, events, "control message")

    def _on_issue_guarantee(self, message: IssueGuarantee, size: int, events: list[Event]) -> None:
        self._check_open(message)
        sender = self._peer_receives(message.channel, events)
        sender.on_guarantee(message.amount)
        self._pump_retransmissions(sender, events)
        if message.channel == SUBSCRIPTION_BINDS and self.role is Role.CLIENT:
            self._issue_newly_confirmed_subscriptions()
        events.append(GuaranteesReceived(message.channel, sender.balance))

    def _issue_newly_confirmed_subscriptions(self) -> None:
        for handle, _binding in self.subscriptions.items():
            receiver = self._receivers.get(Channel(ChannelKind.DELIVER, handle))
            if receiver is not None and receiver.issued_total == 0:
                self._issue(receiver)

    def _on_plead(self, message: Plead, size: int, events: list[Event]) -> None:
        self._check_open(message)
        sender = self._peer_receives(message.channel, events)
        if not self._may_reference(message.channel):
            # This side proposed freeing the channel's handle: it says nothing
            # more about it, and the channel goes away with the handle.
            return
        absolve = sender.on_plead(message.target)
        if absolve is not None:
            self._queue(absolve)

    def _on_limit_receiving(self, message: LimitReceiving, size: int, events: list[Event]) -> None:
        self._check_open(message)
        sender = self._peer_receives(message.channel, events)
        sender.on_limit_receiving(message.bound)
        self._pump_retransmissions(sender, events)

    def _on_announce_dropping(
        self, message: AnnounceDropping, size: int, events: list[Event]
    ) -> None:
        self._check_open(message)
        sender = self._peer_receives(message.channel, events)
        apology, dropped = sender.on_announce_dropping()
        self._queue(apology)
        events.append(
            DropAnnounced(message.channel, len(dropped), sum(entry.size for entry in dropped))
        )
        if message.channel == TOPIC_BINDS and self.role is Role.CLIENT:
            # The broker discards, unannounced, publishes on handles whose bind was dropped.
            first = self.topics.next_handle - len(dropped)
            for handle in range(first, self.topics.next_handle):
                publish_sender = self._senders.get(Channel(ChannelKind.PUBLISH, handle))
                if publish_sender is not None and publish_sender.unconfirmed:
                    lost = publish_sender.forget_unconfirmed()
                    events.append(
                        DropAnnounced(publish_sender.channel, len(lost), sum(e.size for e in lost))
                    )
        self._pump_retransmissions(sender, events)

    def _on_absolve(self, message: Absolve, size: int, events: list[Event]) -> None:
        self._check_open(message)
        self._peer_sends(message.channel, events).on_absolve(message.amount)

    def _on_limit_sending(self, message: LimitSending, size: int, events: list[Event]) -> None:
        self._check_open(message)
        self._peer_sends(message.channel, events).on_limit_sending(message.bound)

    def _on_apologise(self, message: Apologise, size: int, events: list[Event]) -> None:
        self._check_open(message)
        receiver = self._peer_sends(message.channel, events)
        receiver.on_apologise()
        self._issue(receiver)

    # ================================================================ publish / deliver

    def publish(
        self,
        topic: int,
        payload: bytes,
        *,
        key: bytes | None = None,
        headers: Headers | None = None,
    ) -> int:
        """Client: publish on a topic handle; returns the frame size.

        Raises :class:`NoGuarantees` (nothing sent) if the channel has no
        room; within guarantees the frame is certain to be buffered.
        """
        if self.role is not Role.CLIENT:
            self._require_role(Role.CLIENT, "publish")
        if self.state is not ConnectionState.OPEN:
            self._require_open()
        binding = self.topics._bindings.get(topic)
        if binding is None or binding.state is not HandleState.BOUND:
            self.topics.resolve_local(topic)  # says what is wrong
        sender = self._senders[(ChannelKind.PUBLISH, topic)]  # type: ignore[index]
        if (
            headers is None
            and type(payload) is bytes
            and (key is None or type(key) is bytes)
            and type(topic) is int
        ):
            frame = encode_publish(topic, payload, key, max_frame=self.peer_max_frame)
        else:
            frame = encode(Publish(topic, payload, key, headers), max_frame=self.peer_max_frame)
        size = len(frame)
        if not self._senders[TOPIC_BINDS].retransmit and sender.send_guaranteed(size):
            # The usual case, in short: within the guarantees.
            self._out.append(frame)
            self.frames_sent += 1
            self.bytes_sent += size
            self._out_size += size
        else:
            self._send_frame(sender, Publish(topic, payload, key, headers), frame)
        # Kept until the broker confirms it, to be sent again on a resume.
        retained = self._retained.get(topic)
        if retained is None:
            retained = self._retained[topic] = deque()
        retained.append(frame)
        return size

    def _on_publish(self, message: Publish, size: int, events: list[Event]) -> None:
        if self.role is not Role.BROKER:
            raise RemoteProtocolError("Publish is sent by clients")
        if self.state is not ConnectionState.OPEN:
            self._check_open(message)
        topic = message.topic
        binding = self.topics._bindings.get(topic)
        if binding is not None and binding.state is HandleState.BOUND and not binding.peer_done:
            # The usual case, in short: a bound topic, within the guarantees.
            # (A plain tuple finds the channel's entry without making a Channel.)
            receiver = self._receivers[(ChannelKind.PUBLISH, topic)]  # type: ignore[index]
            if receiver.accept_guaranteed(size):
                binding.references += 1
                self.publishes_received[topic] += 1
                events.append(PublishReceived(message, binding.value, receiver.channel, size))
                self._run = ShortRun(Publish, topic, binding, receiver, self.publishes_received)
                return
        binding = self._resolve_peer_reference(HandleType.TOPIC, message.topic, events)
        if binding is None:
            # An optimistic reference whose bind was dropped (and announced).
            self.discarded_frames += 1
            return
        channel = Channel(ChannelKind.PUBLISH, message.topic)
        receiver = self._receivers[channel]
        accepted, out = receiver.on_frame(size)
        if binding.state is HandleState.BOUND:
            self._queue_all(out)
        if accepted:
            if receiver.sender_balance < 0 and binding.state is HandleState.BOUND:
                self._issue(receiver)  # confirm the optimistic frame without delay
            self.topics.acquire(message.topic)
            self.publishes_received[message.topic] += 1
            events.append(PublishReceived(message, binding.value, channel, size))

    def deliver(
        self,
        subscription: int,
        seq: int,
        payload: bytes,
        *,
        key: bytes | None = None,
        headers: Headers | None = None,
    ) -> int:
        """Broker: send a delivery within the subscriber's guarantees; returns its size."""
        sender = self._delivery_sender(subscription)
        return self._send_frame(sender, Deliver(subscription, seq, payload, key, headers))

    def _delivery_sender(self, subscription: int) -> ChannelSender:
        self._require_role(Role.BROKER, "deliver")
        self._require_open()
        self.subscriptions.resolve_local(subscription)
        return self._senders[Channel(ChannelKind.DELIVER, subscription)]

    def deliver_encoded(self, subscription: int, seq: int, tail: bytes) -> int:
        """Broker: :meth:`deliver` with the shared part pre-encoded once per publish.

        ``tail`` comes from :func:`encode_deliver_tail`; only a few bytes are
        encoded per subscriber.
        """
        sender = self._delivery_sender(subscription)
        head, tail = encode_deliver(subscription, seq, tail)
        size = len(head) + len(tail)
        if size - LENGTH_PREFIX > self.peer_max_frame:
            raise LocalProtocolError(f"Deliver frame of {size} bytes exceeds max_frame")
        return self._send_frame(sender, None, head, tail)

    def deliver_encoded_many(self, subscription: int, first_seq: int, tails: list[bytes]) -> int:
        """Broker: :meth:`deliver_encoded` for ``tails`` with consecutive
        sequence numbers from ``first_seq``, as many as the subscriber's
        guarantees allow, in order; returns how many were queued (0 if none
        fits). Raises :class:`LocalProtocolError` if the first frame could
        never be sent (larger than the peer's ``max_frame``); a later one
        ends the batch before it, and raises on the next call.
        """
        sender = self._delivery_sender(subscription)
        if first_seq < 0 or first_seq + len(tails) - 1 > U64_MAX:
            raise LocalProtocolError("seq must be u64")
        if self._many and len(tails) > 1:
            return self._deliver_in_many(sender, subscription, first_seq, tails)
        room = self._room(sender)
        limit = self.peer_max_frame + LENGTH_PREFIX
        seq = first_seq
        total = 0
        put = self._out.append
        for head, tail in zip(deliver_heads(subscription, first_seq, tails), tails, strict=True):
            size = len(head) + len(tail)
            if size > room or size > limit:
                if size > limit and seq == first_seq:
                    raise LocalProtocolError(f"Deliver frame of {size} bytes exceeds max_frame")
                break
            room -= size
            total += size
            put(head)
            put(tail)
            seq += 1
        count = seq - first_seq
        if count:
            # Deliveries never go beyond the guarantees (no optimism on
            # [3, s]), so none is kept for retransmission.
            sender.record_within_guarantees(count, total)
            self.frames_sent += count
            self.bytes_sent += total
            self._out_size += total
        return count

    def _deliver_in_many(
        self, sender: ChannelSender, subscription: int, first_seq: int, tails: list[bytes]
    ) -> int:
        """:meth:`deliver_encoded_many` to a client that reads DeliverMany:
        as few frames as the guarantees and ``max_frame`` allow (a frame of
        one entry goes as a plain Deliver)."""
        room = self._room(sender)
        limit = self.peer_max_frame + LENGTH_PREFIX
        out = self._out
        count = len(tails)
        sent = frames = total = 0
        while sent < count:
            capacity = min(room, limit)
            seq = first_seq + sent
            stop = min(count, sent + MAX_DELIVER_MANY)
            # What fits in one frame, its head counted at the longest it can be...
            cap = capacity - deliver_many_head_size(subscription, seq, MAX_DELIVER_MANY)
            # The usual case: all of them fit the first frame (summed in one
            # go; once a batch needs several frames, they are measured one by one).
            body = sum(map(len, tails[sent:stop])) if not frames else cap + 1
            if body <= cap:
                end = stop
            else:
                end = sent
                body = 0
                while end < stop:
                    size = len(tails[end])
                    if body + size > cap:
                        break
                    body += size
                    end += 1
            # ...then at its real size, a byte or two shorter for fewer entries.
            while (
                end < stop
                and deliver_many_head_size(subscription, seq, end + 1 - sent)
                + body
                + len(tails[end])
                <= capacity
            ):
                body += len(tails[end])
                end += 1
            if end - sent >= 2:
                head = deliver_many_head(subscription, seq, end - sent, body)
                size = len(head) + body
                out.append(head)
                out += tails[sent:end]
            else:
                tail = tails[sent]
                head = next(deliver_heads(subscription, seq, [tail]))
                size = len(head) + len(tail)
                if size > room or size > limit:
                    if size > limit and sent == 0:
                        raise LocalProtocolError(f"Deliver frame of {size} bytes exceeds max_frame")
                    break
                out.append(head)
                out.append(tail)
                end = sent + 1
            room -= size
            total += size
            frames += 1
            sent = end
        if sent:
            sender.record_within_guarantees(frames, total)
            self.frames_sent += frames
            self.bytes_sent += total
            self._out_size += total
        return sent

    def _on_deliver_many(self, message: DeliverMany, size: int, events: list[Event]) -> None:
        if self.role is not Role.CLIENT or not self._many:
            raise RemoteProtocolError(
                "DeliverMany is sent by the broker, and only to a client whose Hello asks for it"
            )
        if self.state is not ConnectionState.OPEN:
            self._check_open(message)
        handle = message.subscription
        entries = len(message.entries)
        binding = self.subscriptions._bindings.get(handle)
        if binding is not None and not binding.peer_done:
            # The usual case, in short: a bound subscription, within the guarantees.
            receiver = self._receivers[(ChannelKind.DELIVER, handle)]  # type: ignore[index]
            if receiver.accept_guaranteed(size):
                binding.references += entries
                events.append(DeliverManyReceived(message, receiver.channel, size))
                return
        channel = self._accept_delivery("DeliverMany", handle, size, entries, events)
        events.append(DeliverManyReceived(message, channel, size))

    def _accept_delivery(
        self, what: str, handle: int, size: int, entries: int, events: list[Event]
    ) -> Channel:
        """Buffer a delivery frame of ``entries`` messages on subscription
        ``handle`` (the long way); its channel. Raises if the handle is not
        bound or the frame is beyond the guarantees."""
        self._resolve_required(HandleType.SUBSCRIPTION, handle, events, what)
        channel = Channel(ChannelKind.DELIVER, handle)
        receiver = self._receivers[channel]
        if receiver.dropping or size > receiver.free or size > receiver.sender_balance:
            raise RemoteProtocolError(
                f"{channel}: {what} of {size} bytes beyond the guarantees "
                f"({receiver.sender_balance} left)",
                GoodbyeCode.LIMIT_EXCEEDED,
            )
        receiver.on_frame(size)
        self.subscriptions.acquire(handle, entries)
        return channel

    def _on_deliver(self, message: Deliver, size: int, events: list[Event]) -> None:
        if self.role is not Role.CLIENT:
            raise RemoteProtocolError("Deliver is sent by the broker")
        if self.state is not ConnectionState.OPEN:
            self._check_open(message)
        handle = message.subscription
        binding = self.subscriptions._bindings.get(handle)
        if binding is not None and not binding.peer_done:
            # The usual case, in short: a bound subscription, within the guarantees.
            receiver = self._receivers[(ChannelKind.DELIVER, handle)]  # type: ignore[index]
            if receiver.accept_guaranteed(size):
                binding.references += 1
                events.append(DeliverReceived(message, receiver.channel, size))
                self._run = ShortRun(Deliver, handle, binding, receiver, None)
                return
        channel = self._accept_delivery("Deliver", handle, size, 1, events)
        events.append(DeliverReceived(message, channel, size))

    # ================================================================ acks, gaps, confirms

    def ack(self, subscription: int, seq: int) -> None:
        """Client: everything up to ``seq`` on ``subscription`` is processed."""
        self._require_role(Role.CLIENT, "acknowledge")
        self._require_open()
        self.subscriptions.resolve_local(subscription)
        if seq < self.processed.get(subscription, 0):
            raise LocalProtocolError("Ack sequence numbers are cumulative and never go back")
        self.processed[subscription] = seq
        self._queue(Ack(subscription, seq))

    def _on_notice(self, message: Ack | Gap | Confirm, size: int, events: list[Event]) -> None:
        """Ack (client to broker), Gap and Confirm (broker to client): checked, passed on."""
        name = type(message).__name__
        if isinstance(message, Confirm):
            handle_type, handle = HandleType.TOPIC, message.topic
        else:
            handle_type, handle = HandleType.SUBSCRIPTION, message.subscription
        sent_by = Role.CLIENT if isinstance(message, Ack) else Role.BROKER
        if self.role is sent_by:
            raise RemoteProtocolError(f"{name} is sent by the {sent_by.name.lower()}")
        self._check_open(message)
        self._resolve_required(handle_type, handle, events, name)
        if isinstance(message, Confirm):
            self._on_confirm(message)
        events.append(message)

    def _on_confirm(self, message: Confirm) -> None:
        """Confirmed publishes need not be kept for a resume any more.

        The count is cumulative over the session: it never goes back, and
        never exceeds the Publish frames sent on the handle (a repeat of the
        last count changes nothing)."""
        topic, count = message.topic, message.count
        base = self._retained_base.get(topic, 0)
        retained = self._retained.get(topic)
        sent = base + (len(retained) if retained is not None else 0)
        if not base <= count <= sent:
            raise RemoteProtocolError(
                f"Confirm of {count} publishes on topic handle {topic}: "
                f"{base} confirmed before, {sent} sent"
            )
        if retained is not None and count > base:
            for _ in range(count - base):
                retained.popleft()
            self._retained_base[topic] = count

    def gap(self, subscription: int, first_seq: int, count: int) -> None:
        """Broker: tell the subscriber ``count`` deliveries from ``first_seq`` were dropped."""
        self._require_role(Role.BROKER, "report gaps")
        self._require_open()
        self.subscriptions.resolve_local(subscription)
        self._queue(Gap(subscription, first_seq, count))

    def confirm(self, topic: int, count: int) -> None:
        """Broker: ``count`` publishes on ``topic`` are fully routed (cumulative)."""
        self._require_role(Role.BROKER, "confirm")
        self._require_open()
        self.topics.resolve_local(topic)
        self._queue(Confirm(topic, count))

    def throttled(self, channel: Channel, throttled: bool) -> None:
        """Broker: advise the client that ``channel`` is (no longer) withheld.

        Refused (:class:`LocalProtocolError`, nothing sent) for the channel of
        a topic handle being freed: the client may have deleted it already.
        """
        self._require_role(Role.BROKER, "throttle")
        self._require_referable(channel)
        self._receiver(channel)
        self._queue(Throttled(channel, throttled))

    # ================================================================ staging

    def stage_of(self, topic: int) -> Stage | None:
        """Where publishes on topic handle ``topic`` are staged (None: routed at once)."""
        return self._stages.get(topic)

    def commit(self, batch: str, members: list[tuple[str, int]]) -> int:
        """Client: ask the broker to make the listed members of ``batch``
        visible, each with the number of publishes it staged, and to discard
        the batch's other members; returns the request number its
        :class:`Outcome` will carry."""
        self._require_role(Role.CLIENT, "commit")
        self._require_open()
        self._last_request += 1
        self._queue(Commit(self._last_request, batch, list(members)))
        return self._last_request

    def abort(self, batch: str) -> int:
        """Client: ask the broker to discard everything staged in ``batch``;
        returns the request number its :class:`Outcome` will carry."""
        self._require_role(Role.CLIENT, "abort")
        self._require_open()
        self._last_request += 1
        self._queue(Abort(self._last_request, batch))
        return self._last_request

    def outcome(self, request: int, status: int, messages: int, reason: str = "") -> None:
        """Broker: answer Commit or Abort number ``request``."""
        self._require_role(Role.BROKER, "answer commits")
        self._require_open()
        self._queue(Outcome(request, int(status), messages, reason))

    def _on_staging_notice(
        self, message: Commit | Abort | Outcome, size: int, events: list[Event]
    ) -> None:
        """Commit and Abort (client to broker), Outcome (broker to client): checked, passed on."""
        sent_by = Role.BROKER if isinstance(message, Outcome) else Role.CLIENT
        if self.role is sent_by:
            raise RemoteProtocolError(
                f"{type(message).__name__} is sent by the {sent_by.name.lower()}"
            )
        self._check_open(message)
        events.append(message)

    # ================================================================ inspection

    def receiver(self, channel: Channel) -> ChannelReceiver:
        """The receiving state of ``channel`` (read it; change it through this class)."""
        return self._receiver(channel)

    def sender(self, channel: Channel) -> ChannelSender:
        """The sending state of ``channel`` (read it; change it through this class)."""
        return self._sender(channel)

    @property
    def receiving_channels(self) -> list[Channel]:
        return list(self._receivers)

    @property
    def sending_channels(self) -> list[Channel]:
        return list(self._senders)

    def statistics(self) -> ConnectionStatistics:
        """Counters, per-channel state and handle counts, for metrics."""
        return ConnectionStatistics(
            role=self.role,
            state=self.state,
            frames_received=self.frames_received,
            bytes_received=self.bytes_received,
            frames_sent=self.frames_sent,
            bytes_sent=self.bytes_sent,
            discarded_frames=self.discarded_frames,
            topics_bound=len(self.topics),
            subscriptions_bound=len(self.subscriptions),
            receivers=[r.statistics() for r in self._receivers.values()],
            senders=[s.statistics() for s in self._senders.values()],
        )


#: How each received message is handled: unbound, as a per-connection table of
#: bound methods would make every connection a cycle only the collector frees.
_HANDLERS: dict[type, Callable[[Connection, Any, int, list[Event]], None]] = {
    Publish: Connection._on_publish,
    Deliver: Connection._on_deliver,
    DeliverMany: Connection._on_deliver_many,
    IssueGuarantee: Connection._on_issue_guarantee,
    Ack: Connection._on_notice,
    Gap: Connection._on_notice,
    Confirm: Connection._on_notice,
    Ping: Connection._on_ping,
    Pong: Connection._on_passthrough,
    Throttled: Connection._on_throttled,
    Goodbye: Connection._on_goodbye,
    Absolve: Connection._on_absolve,
    Plead: Connection._on_plead,
    LimitSending: Connection._on_limit_sending,
    LimitReceiving: Connection._on_limit_receiving,
    AnnounceDropping: Connection._on_announce_dropping,
    Apologise: Connection._on_apologise,
    FreeHandle: Connection._on_free_handle,
    BindTopic: Connection._on_bind_frame,
    Subscribe: Connection._on_bind_frame,
    Hello: Connection._on_hello,
    Welcome: Connection._on_welcome,
    Commit: Connection._on_staging_notice,
    Abort: Connection._on_staging_notice,
    Outcome: Connection._on_staging_notice,
}
