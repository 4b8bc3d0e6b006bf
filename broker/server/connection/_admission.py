"""Admitting a client: its Hello, credentials and session (new or resumed),
and what its principal may do; a session's detaching and handing over."""

from __future__ import annotations

import logging
from typing import Protocol

import trio

from broker.auth import AuthFailure
from broker.protocol import Connection, GoodbyeCode, HelloReceived, Stage
from broker.protocol.connection import BrokerSessionState

from .._peer_logging import ConnectionLog, shown
from .._peers import peer_key
from .._principal_usage import ConnectionLedger, PrincipalUsage
from .._services import Gate, Storage
from ..sessions._records import SessionRecords
from ..sessions._session import Session, SessionHolder, SessionTable
from ._delivery import Deliveries
from ._publishing import PublishChannel, Publishing


class Admitted(SessionHolder, Protocol):
    """The connection being admitted, as admission acts on it."""

    def goodbye(self, code: GoodbyeCode, reason: str) -> None:
        """Say Goodbye; the writer sends it and closes the connection."""
        ...


class Admission:
    """Who the client is and which session it holds.

    The connection passes itself (:class:`Admitted`) to each call instead of
    being kept here: no reference cycle through the connection.
    """

    def __init__(
        self,
        gate: Gate,
        sessions: SessionTable,
        storage: Storage,
        protocol: Connection,
        publishing: Publishing,
        deliveries: Deliveries,
        ledger: ConnectionLedger,
        log: ConnectionLog,
        *,
        peer: str,
        identity: str | None,
        trusted: bool = False,
    ) -> None:
        #: Credentials, principals, per-address limits, what a Welcome tells.
        self.gate = gate
        self.sessions = sessions
        #: The durable state (for a restored session's publish counts).
        self.storage = storage
        self.protocol = protocol
        self.publishing = publishing
        self.deliveries = deliveries
        self.ledger = ledger
        self.log = log
        self.peer = peer
        #: The verified client certificate's common name (mutual TLS), if any.
        self.identity = identity
        #: Another worker's link (accepted on the link listener, which only
        #: the broker's own workers can reach): no credentials asked.
        self.trusted = trusted
        self.client_name = ""
        #: The session this connection serves (None before the Welcome).
        self.session: Session | None = None
        #: The session ends with this connection (the client said Goodbye, or
        #: broke the rules, or it is a link, which never resumes: its
        #: subscriptions must not queue for a lease); otherwise it waits for a resume.
        self.ends_session = trusted
        #: A refusal held back (a failed authentication): the writer waits.
        self.held: trio.CancelScope | None = None
        #: Handles were bound or freed since the session's record was written.
        self.session_dirty = False

    @property
    def principal(self) -> PrincipalUsage | None:
        """The authenticated principal's usage (None while unauthenticated or without auth)."""
        return self.ledger.principal

    # ---------------------------------------------------------------- hello

    def hello(self, event: HelloReceived, connection: Admitted) -> None:
        """Authenticate the client, then create or resume its session (Welcome)."""
        if self.protocol.closed:
            return  # something after the Hello, in the same read, closed the connection
        hello = event.hello
        self.client_name = hello.client[:64]
        gate = self.gate
        if (
            gate.auth is not None
            and not self.trusted
            and not self._authenticate(hello.token, connection)
        ):
            return
        sessions = self.sessions
        principal = self.principal.principal.name if self.principal else None
        session = None
        if hello.session is not None:
            session = sessions.find(hello.session, principal)
            if session is None and (home := gate.home_address(hello.session)) is not None:
                # Another worker holds it (a TLS resume cannot be handed over).
                self.refuse(GoodbyeCode.REDIRECT, f"resume at {home}", connection)
                return
            if session is None:
                sessions.unknown_total += 1
                self.log(logging.INFO, "%s asks for an unknown session", shown(self.client_name))
        if session is not None:
            self._resume(session, hello.processed, connection)
        else:
            self.session = sessions.create(
                connection,
                self.client_name,
                self.deliveries.subscriptions,
                principal,
                link=self.trusted,
            )
            # Recorded even if it never binds a handle (a cluster client's
            # connection to a worker that owns none of its topics): a session
            # without a record is "unknown" after a restart.
            self.session_dirty = True
            self.protocol.welcome(
                session=self.session.id,
                epoch=gate.epoch,
                offsets=self.storage.offsets,
                cluster=gate.cluster,
            )
        if self.session is not None:
            self.publishing.session_id = self.session.id  # (its publishes' origin)
        # The bind channels exist now: their buffers count against the budgets.
        budget = self.publishing.budget
        budget.book()  # (what the policy granted the channels the Welcome opened)
        ledger = self.ledger
        ledger.reserve(budget.capacity_in_use() - ledger.buffer_reserved)
        budget.subscriptions_changed()
        self.log(logging.INFO, "hello from %s", shown(self.client_name))

    def _authenticate(self, token: str | None, connection: Admitted) -> bool:
        """Bind the connection to the principal its credentials prove, within
        the principal's connection limit; else say Goodbye (6 or 3)."""
        gate = self.gate
        assert gate.auth is not None
        found = gate.auth.authenticate(token, self.identity)
        if isinstance(found, AuthFailure):
            # Held back longer for each failure in a row from the address: no guessing.
            hold = gate.peers.failed(peer_key(self.peer), trio.current_time())
            reason = "bad credentials" if token is not None else "credentials required"
            self.deny(reason, connection, found, hold)
            return False
        usage = gate.principals[found.name]
        limit = found.max_connections
        if limit and usage.whole_broker_connections() >= limit:
            gate.auth_failed(AuthFailure.CONNECTION_LIMIT)
            self.refuse(
                GoodbyeCode.LIMIT_EXCEEDED,
                f"{found.name!r} already has {limit} connection(s)",
                connection,
            )
            return False
        usage.connected(1)
        self.ledger.bind(usage)
        self.publishing.owner = found.name
        return True

    def deny(
        self,
        reason: str,
        connection: Admitted,
        failure: AuthFailure = AuthFailure.TOPIC_DENIED,
        hold: float = 0.0,
    ) -> None:
        """Refuse the client for ``failure``: Goodbye 6 (not authorised), sent
        after ``hold`` seconds (nothing it sent after is applied)."""
        self.ends_session = True
        self.gate.auth_failed(failure)
        self.refuse(GoodbyeCode.NOT_AUTHORISED, f"not authorised: {reason}", connection, hold)

    def refuse(
        self, code: GoodbyeCode, reason: str, connection: Admitted, hold: float = 0.0
    ) -> None:
        """Say Goodbye for ``reason`` (client input in it already ``shown()``),
        logged; the writer holds it back ``hold`` seconds."""
        who = self.principal.principal.name if self.principal else self.identity or "anonymous"
        self.log(logging.WARNING, "(%s) %s", shown(who), reason)
        if hold > 0:
            self.held = trio.CancelScope(deadline=trio.current_time() + hold)
        connection.goodbye(code, reason)

    # ---------------------------------------------------------------- permissions

    def open_channel(
        self, handle: int, name: str, stage: Stage | None, connection: Admitted
    ) -> PublishChannel | None:
        """The broker's side of a newly bound (or restored) topic handle (its
        publishes staged in ``stage``, if given); None (and Goodbye 6) if the
        client's principal may not use the topic."""
        may_publish = True
        if self.principal is not None:
            principal = self.principal.principal
            may_publish = principal.may_publish(name)
            if not may_publish and not principal.may_subscribe(name):
                self.deny(f"may not use topic {shown(name)}", connection)
                return None
        return self.publishing.open(handle, name, stage, may_publish=may_publish)

    def may_administer(self) -> str | None:
        """Why the client's principal may not administer topics (None: it
        may: ``admin = true``, or a broker without authentication)."""
        usage = self.principal
        if usage is None or usage.principal.admin:
            return None
        name = usage.principal.name
        return (
            f"principal {name!r} may not administer topics: give it admin = true in the auth file"
        )

    def may_subscribe(self, topic_name: str) -> bool:
        """Whether the client's principal may subscribe to ``topic_name``."""
        return self.principal is None or self.principal.principal.may_subscribe(topic_name)

    # ---------------------------------------------------------------- sessions

    def _resume(self, session: Session, processed: dict[int, int], connection: Admitted) -> None:
        """Take over ``session``: its handles, channels and subscriptions; what
        the client did not process is delivered again, first."""
        if session.connection is not None:
            session.connection.hand_over()
        assert session.state is not None
        self.storage.held_publishes(session.id, session.state)
        restore, dropped = session.state.for_resume(processed)
        for handle in dropped:  # the client gave them up
            session.subscriptions.pop(handle).close()
        gate = self.gate
        self.sessions.attach(session, connection)
        self.session = session
        deliveries = self.deliveries
        deliveries.subscriptions = session.subscriptions
        self.protocol.welcome(
            session=session.id,
            epoch=gate.epoch,
            restore=restore,
            offsets=self.storage.offsets,
            cluster=gate.cluster,
        )
        for handle, (name, _) in restore.topics.items():
            state = self.open_channel(handle, name, restore.stages.get(handle), connection)
            if state is None:
                return
            state.routed = state.confirmed = state.forwarded = restore.received.get(handle, 0)
        redelivered = 0
        for handle, subscription in deliveries.subscriptions.items():
            redelivered += subscription.attach(deliveries, processed.get(handle, 0))
        self.sessions.redelivered_total += redelivered
        self.log(logging.INFO, "session %s resumed (%d sent again)", session.name, redelivered)

    def record(self, records: SessionRecords) -> None:
        """Put what changed of the session into ``records`` (a broker with a
        data directory: its handles, what was routed, what the client
        processed), before the Confirms that rely on it go out. A link's
        session is not recorded: it ends with its link, never resumed."""
        session = self.session
        if session is None or session.link:
            return
        deliveries = self.deliveries
        if self.session_dirty:
            self.session_dirty = False
            state = self.protocol.session_state()
            assert isinstance(state, BrokerSessionState)
            records.save(session, state, deliveries.subscriptions)
        publishing = self.publishing
        for handle in publishing.confirm_dirty:
            channel = publishing.channels.get(handle)
            if channel is not None:
                # (A staged channel's count is all a resume has of its
                # publishes: no stream holds them yet.)
                records.routed(session, handle, channel.routed, strict=channel.stage is not None)
        if deliveries.acked_dirty:
            for handle in deliveries.acked_dirty:
                subscription = deliveries.subscriptions.get(handle)
                if subscription is not None:
                    records.acked(session, handle, subscription.acked)
            deliveries.acked_dirty.clear()

    def detach(self) -> None:
        """Leave the session to wait for a resume: its record of handles and
        its subscriptions (which go on queueing) stay; this connection lets go."""
        session = self.session
        assert session is not None
        state = self.protocol.session_state()
        assert isinstance(state, BrokerSessionState)
        deliveries = self.deliveries
        for handle in list(deliveries.subscriptions):
            if handle not in state.subscriptions:  # being freed: it goes now
                deliveries.subscriptions.pop(handle).close()
        deliveries.subscriptions = {}
        self.session = None
        self.sessions.detach(session, state)
        self.log(logging.INFO, "session %s detached", session.name)

    def leave(self, *, end: bool) -> None:
        """The connection closes: its session ends with it if ``end`` (or if
        the client said so), else waits for a resume; the principal's
        connection count goes down."""
        session = self.session
        if session is not None:
            if self.ends_session or end:
                self.sessions.end(session)
                session.connection = self.session = None  # (a cycle otherwise)
            else:
                self.detach()
        if self.principal is not None:
            self.principal.connected(-1)
