"""The life of a connection: the handshake (Hello, Welcome), keepalive
(Ping, timers, leases) and the end (Goodbye)."""

from __future__ import annotations

from .._errors import LocalProtocolError, RemoteProtocolError
from .._events import ConnectionClosed, Event, HelloReceived, WelcomeReceived
from .._owners import Cluster
from .._types import (
    PROTOCOL_VERSION,
    SUBSCRIPTION_BINDS,
    TOPIC_BINDS,
    U64_MAX,
    GoodbyeCode,
    Role,
)
from ..frames._messages import Hello, Ping, Welcome
from ..guarantees._receiver import ChannelSender
from ._core import DELIVER_SLACK, ConnectionState
from ._resume import SessionResume
from ._session import BrokerSessionState, ClientSessionState, check_welcome


class Handshake(SessionResume):
    """Opening, keeping alive and closing a connection."""

    # ---------------------------------------------------------------- opening

    def hello(
        self,
        client: str,
        *,
        session: bytes | None = None,
        processed: dict[int, int] | None = None,
        token: str | None = None,
        resume: ClientSessionState | None = None,
        deliver_many: bool = False,
        metadata: bool = False,
        encoded_deliveries: bool = False,
        publish_many: bool = False,
        keep_unconfirmed: bool = True,
    ) -> None:
        """Client: open the connection (a new session, or resume ``session``),
        presenting ``token`` to a broker that authenticates its clients.

        With ``deliver_many`` the Hello says this client reads
        :class:`DeliverMany` frames, so the broker may deliver many messages
        in one frame; without it (the default) every delivery comes as a
        Deliver.

        With ``encoded_deliveries`` too, a DeliverMany whose entries have no
        headers is given as :class:`EncodedDeliveriesReceived`: each entry's
        Deliver tail as it was on the wire, not decoded (for a client that
        passes deliveries on, as a broker relaying to its own subscribers).

        With ``publish_many`` the Hello asks to send PublishMany frames
        (:meth:`publish_many_tails`), if the Welcome allows them.

        With ``keep_unconfirmed=False`` the client says it will never
        resume the session: publishes are only counted until confirmed, not
        kept (:meth:`session_state` then refuses).

        With ``metadata`` the Hello asks a broker of several workers for its
        membership: the Welcome's ``cluster`` (None from a single process).

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
            PROTOCOL_VERSION,
            client,
            session,
            dict(processed or {}),
            token,
            deliver_many,
            metadata,
            publish_many,
            self.max_message,
        )
        self._writer.queue(message)
        self.hello_message = message
        self._many = deliver_many
        self._keep_unconfirmed = keep_unconfirmed
        self._decoder.encoded_deliveries = deliver_many and encoded_deliveries
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
        offsets: bool = False,
        cluster: Cluster | None = None,
    ) -> None:
        """Broker: accept the client's Hello; opens the bind channels.

        ``offsets`` says that reliable subscriptions number their deliveries
        by their topic's log offsets (a broker with a data directory).

        ``cluster`` (the membership of a broker of several workers) is sent
        only if the Hello asked for ``metadata``.

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
            offsets,
            cluster if self.hello_message is not None and self.hello_message.metadata else None,
            self.hello_message is not None and self.hello_message.publish_many,
            self.max_message if self.hello_message and self.hello_message.max_message else 0,
        )
        self._writer.queue(message)
        self.welcome_message = message
        self._publish_many = message.publish_many
        self._writer.peer_max_frame = self.max_frame + DELIVER_SLACK
        if message.max_message:
            assert self.hello_message is not None
            self.peer_max_message = self.hello_message.max_message
        self.state = ConnectionState.OPEN
        if restore is not None:
            self._restore_broker(restore)
            return
        for channel in (TOPIC_BINDS, SUBSCRIPTION_BINDS):
            self._bind_receivers[channel] = self._new_receiver(channel)

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
        hello = self.hello_message
        self._publish_many = message.publish_many and hello is not None and hello.publish_many
        self._writer.peer_max_frame = message.max_frame
        self.peer_max_message = message.max_message if self.max_message else 0
        if self.peer_max_message:
            self._plain_payload = message.max_frame - 64
        self._decoder.max_frame = max(self.max_frame, message.max_frame + DELIVER_SLACK)
        self.liveness.lease = message.lease_ms / 1000
        self.liveness.heartbeat = message.heartbeat_ms / 1000
        self.state = ConnectionState.OPEN
        for channel in (TOPIC_BINDS, SUBSCRIPTION_BINDS):
            self._bind_senders[channel] = ChannelSender(channel)
        resent = 0
        dropped: list[Event] = []
        if message.resumed:
            assert resume is not None
            resent = self._restore_client(resume, message, dropped)
        self._resume = None
        events.append(WelcomeReceived(message, resent))
        events += dropped

    # ---------------------------------------------------------------- keepalive

    def ping(self) -> int:
        """Queue a Ping; returns its nonce (the Pong event carries it back)."""
        self._require_open()
        self._ping_nonce = (self._ping_nonce + 1) & U64_MAX
        self._writer.queue(Ping(self._ping_nonce))
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
            reason = self._writer.queue_goodbye(int(GoodbyeCode.LEASE_EXPIRED), reason)
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

    # ---------------------------------------------------------------- closing

    def goodbye(self, code: GoodbyeCode | int = GoodbyeCode.NORMAL, reason: str = "") -> None:
        """Queue a Goodbye and close; received data is ignored from now on."""
        if self.state is ConnectionState.CLOSED:
            return
        self._writer.queue_goodbye(int(code), reason)
        self.state = ConnectionState.CLOSED
