"""The life of a connection: where it is (:class:`ConnectionState`), the
handshake (Hello, Welcome), keepalive (Ping, timers, leases) and the end.

:class:`Handshake` is a part the connection owns. It references no other
part: it makes the Hello and the Welcome, checks those received, and says
when to ping or give up on the peer; the connection queues what it makes
and applies what the handshake settled (frame sizes, options, the session
to restore) to its other parts.
"""

from __future__ import annotations

from enum import Enum

from .._errors import LocalProtocolError, RemoteProtocolError
from .._owners import Cluster
from .._types import PROTOCOL_VERSION, U64_MAX, Role
from ..frames._messages import Hello, Ping, Welcome
from ._liveness import Liveness
from ._session import BrokerSessionState, ClientSessionState, check_welcome


class ConnectionState(Enum):
    """Lifecycle of a connection."""

    IDLE = "idle"  # client, before hello()
    AWAIT_WELCOME = "await-welcome"  # client, Hello sent
    AWAIT_HELLO = "await-hello"  # broker, nothing received yet
    HELLO_RECEIVED = "hello-received"  # broker, welcome() not yet called
    OPEN = "open"
    CLOSED = "closed"


def require_role(role: Role, wanted: Role, what: str) -> None:
    """Refuse a call that only a ``wanted`` side makes, on a ``role`` side."""
    if role is not wanted:
        raise LocalProtocolError(f"only a {wanted.name.lower()} can {what}")


class Handshake:
    """One side's lifecycle: its :class:`ConnectionState`, the Hello and
    Welcome exchanged, the session a client asked to resume (until the
    Welcome), and the keepalive timers (:class:`Liveness`)."""

    def __init__(self, role: Role, *, heartbeat: float, lease: float, now: float) -> None:
        self.role = role
        #: Read directly by the connection's hot paths (one attribute).
        self.state = ConnectionState.IDLE if role is Role.CLIENT else ConnectionState.AWAIT_HELLO
        self.liveness = Liveness(heartbeat, lease, now, now)
        self.hello_message: Hello | None = None
        self.welcome_message: Welcome | None = None
        #: Client: the session this connection resumes, until the Welcome.
        self.resume: ClientSessionState | None = None
        self._ping_nonce = 0

    def require_open(self) -> None:
        if self.state is not ConnectionState.OPEN:
            raise LocalProtocolError(f"connection is {self.state.value}, not open")

    def check_open(self, message: object) -> None:
        """Refuse ``message`` received before the handshake completed."""
        if self.state is not ConnectionState.OPEN:
            raise RemoteProtocolError(f"{type(message).__name__} before the handshake completed")

    def close(self) -> None:
        """A Goodbye was sent or received: the connection is closed."""
        self.state = ConnectionState.CLOSED

    # ---------------------------------------------------------------- the client's side

    def hello(
        self,
        client: str,
        *,
        session: bytes | None,
        processed: dict[int, int] | None,
        token: str | None,
        resume: ClientSessionState | None,
        deliver_many: bool,
        metadata: bool,
        publish_many: bool,
        max_message: int,
    ) -> Hello:
        """Client: the Hello that opens the connection (for the connection
        to queue); waits for the Welcome from now on."""
        if self.role is not Role.CLIENT:
            raise LocalProtocolError("only a client can say hello")
        if self.state is not ConnectionState.IDLE:
            raise LocalProtocolError("hello() was already called")
        if resume is not None:
            session = resume.session
            processed = {h: resume.processed.get(h, 0) for h in resume.subscriptions}
            self.resume = resume
        message = Hello(
            PROTOCOL_VERSION,
            client,
            session,
            dict(processed or {}),
            token,
            deliver_many,
            metadata,
            publish_many,
            max_message,
        )
        self.hello_message = message
        self.state = ConnectionState.AWAIT_WELCOME
        return message

    def on_welcome(self, message: Welcome) -> ClientSessionState | None:
        """Client: the broker's Welcome, checked (a refused one changes
        nothing); returns the session to restore if it was resumed."""
        if self.role is not Role.CLIENT or self.state is not ConnectionState.AWAIT_WELCOME:
            raise RemoteProtocolError("unexpected Welcome")
        resume = self.resume
        check_welcome(message, resume)
        self.welcome_message = message
        self.liveness.lease = message.lease_ms / 1000
        self.liveness.heartbeat = message.heartbeat_ms / 1000
        self.state = ConnectionState.OPEN
        self.resume = None
        return resume if message.resumed else None

    # ---------------------------------------------------------------- the broker's side

    def on_hello(self, message: Hello) -> None:
        """Broker: the client's Hello, checked."""
        if self.role is not Role.BROKER or self.state is not ConnectionState.AWAIT_HELLO:
            raise RemoteProtocolError("unexpected Hello")
        if message.version != PROTOCOL_VERSION:
            raise RemoteProtocolError(f"unsupported protocol version {message.version}")
        self.hello_message = message
        self.state = ConnectionState.HELLO_RECEIVED

    def welcome(
        self,
        *,
        session: bytes,
        epoch: bytes,
        resumed: bool,
        lease_ms: int | None,
        heartbeat_ms: int | None,
        received: dict[int, int] | None,
        restore: BrokerSessionState | None,
        offsets: bool,
        cluster: Cluster | None,
        max_frame: int,
        max_message: int,
    ) -> Welcome:
        """Broker: the Welcome that accepts the client's Hello (for the
        connection to queue); the connection is open from now on."""
        if self.role is not Role.BROKER:
            raise LocalProtocolError("only a broker can welcome a client")
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
        liveness = self.liveness
        if lease_ms is not None:
            liveness.lease = lease_ms / 1000
        if heartbeat_ms is not None:
            liveness.heartbeat = heartbeat_ms / 1000
        hello = self.hello_message
        message = Welcome(
            PROTOCOL_VERSION,
            session,
            resumed,
            epoch,
            round(liveness.lease * 1000),
            round(liveness.heartbeat * 1000),
            max_frame,
            dict(received or {}),
            None if restore is None else (restore.next_topic, restore.next_subscription),
            surviving,
            offsets,
            cluster if hello is not None and hello.metadata else None,
            hello is not None and hello.publish_many,
            max_message if hello and hello.max_message else 0,
        )
        self.welcome_message = message
        self.state = ConnectionState.OPEN
        return message

    def _surviving_subscriptions(self, state: BrokerSessionState) -> tuple[int, ...] | None:
        """The Welcome's ``subscriptions``: those ``state`` keeps, if it lacks
        one the Hello listed below its count (else None: all survive)."""
        assert self.hello_message is not None
        listed = self.hello_message.processed
        if all(h >= state.next_subscription or h in state.subscriptions for h in listed):
            return None
        return tuple(sorted(state.subscriptions))

    # ---------------------------------------------------------------- keepalive

    def ping(self) -> Ping:
        """The next Ping to send (the connection is open)."""
        self.require_open()
        self._ping_nonce = (self._ping_nonce + 1) & U64_MAX
        return Ping(self._ping_nonce)

    def lease_expired(self, now: float) -> str | None:
        """The reason to say Goodbye with, if the peer has been silent for
        its whole lease at ``now`` (else None)."""
        if not self.liveness.peer_gone(now):
            return None
        if self.role is Role.CLIENT:
            return "broker silent"
        if self.hello_message is None:
            return "no Hello in time"
        return "lease expired"
