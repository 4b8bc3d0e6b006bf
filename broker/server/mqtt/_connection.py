"""One MQTT client connection: the trio driver around a sans-IO
``broker.mqtt.ServerConnection``.

Three tasks: the reader (bytes in, a read's events applied: publishing,
subscriptions, PUBACKs; it stops reading while the connection's account
is in debt, so TCP throttles the client), the writer (what the protocol
queued, written; the loans of what it carried repaid once written; then
the subscriptions that waited for room pumped again) and the timer (the
CONNECT deadline, ``hello_timeout``, then the client's keepalive).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import trio

from accounts import Account, LoanedItem
from broker.mqtt import (
    MQTT_5,
    NO_PROPERTIES,
    Connect,
    ConnectionClosed,
    ConnectionState,
    Disconnect,
    Event,
    MQTTError,
    PingReq,
    Properties,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    ReasonCode,
    ServerConnection,
    SessionState,
    Subscribe,
    TopicError,
    Unsubscribe,
    broker_topic_name,
    topic_matches,
)

from .._peer_logging import ConnectionLog, shown
from .._services import BrokerServices
from ..transport._linger import linger
from ._admission import MQTTAdmission
from ._delivery import MQTTDeliveries
from ._messages import plain_tail, published_tail, wall_ms
from ._publishing import MQTTPublishing, Pending
from ._retained import RetainedStore
from ._sessions import Filters, KeptSession, MQTTSessions, expiry_of
from ._subscribing import MQTTSubscribing
from ._wills import Wills

__all__ = [
    "EVENTS_PER_TURN",
    "RECEIVE_SIZE",
    "SEND_MAXIMUM",
    "MQTTConnection",
    "MQTTConnectionStatistics",
]

#: MQTT topic names a connection keeps mapped to broker names (it may
#: publish to any number: past this many the map starts again).
NAMES_KEPT = 1024
#: Bytes asked of the socket per read.
RECEIVE_SIZE = 64 * 1024
#: Packets one turn of the reader applies before the other tasks go.
EVENTS_PER_TURN = 64
#: Inbound QoS 1 and 2 PUBLISHes a client may have unacknowledged (5.0's
#: Receive Maximum; their acknowledgements wait until they are routed).
RECEIVE_MAXIMUM = 1024
#: QoS 1 and 2 PUBLISHes the broker keeps unacknowledged to a client at
#: most (fewer if the client's Receive Maximum says so): a subscriber that
#: falls behind costs the broker that many deliveries in flight, no more.
SEND_MAXIMUM = 1024

R = ReasonCode


@dataclass(frozen=True, slots=True)
class MQTTConnectionStatistics:
    """One MQTT connection's figures (a row of ``/stat.json``'s ``mqtt``)."""

    serial: int
    name: str
    peer: str
    #: "" before CONNECT.
    client_id: str
    #: Its principal (None: no auth file).
    principal: str | None
    #: "3.1.1", "5.0" ("" before CONNECT).
    version: str
    #: ``awaiting_connect``, ``awaiting_connack``, ``connected``, ``closed``.
    state: str
    #: Its session outlives it (Clean Start 0 and an expiry).
    persistent: bool
    #: Its MQTT subscriptions (topic filters), and how many are shared.
    subscriptions: int
    shared_subscriptions: int
    messages_in: int
    messages_out: int
    #: QoS 1 and 2 PUBLISHes received and not acknowledged yet (not routed).
    unacknowledged_in: int
    #: QoS 1 and 2 PUBLISHes sent and not acknowledged by the client yet.
    in_flight_out: int
    #: Bytes queued and not written to the socket.
    unsent_bytes: int
    dropped_overflow: int
    dropped_too_large: int
    dropped_expired: int


class MQTTConnection:
    """The broker's end of one MQTT connection (see the module).

    Its parts: :attr:`admission` (CONNECT: credentials, client id,
    CONNACK), :attr:`publishing` (PUBLISH to the topics, acknowledged once
    routed), :attr:`deliveries` (the broker subscriptions' PUBLISHes out,
    PUBACKs in) and :attr:`subscribing` (SUBSCRIBE, UNSUBSCRIBE).
    """

    def __init__(
        self,
        services: BrokerServices,
        stream: trio.abc.Stream,
        serial: int,
        peer: str,
        *,
        sessions: MQTTSessions,
        wills: Wills,
        retained: RetainedStore,
        claim: Callable[[MQTTConnection, bool], KeptSession | None],
        forget: Callable[[MQTTConnection], None],
        identity: str | None = None,
    ) -> None:
        config = services.config
        resources = services.resources
        self.services = services
        self.stream = stream
        self.serial = serial
        self.peer = peer
        self.name = f"mqtt-{serial}"
        self._sessions = sessions
        self._wills = wills
        self._retained = retained
        self._claim = claim
        self._forget = forget
        #: CONNACK accepted the client.
        self.accepted = False
        #: A 5.0 client's Session Expiry Interval (DISCONNECT may change it).
        self._expiry_interval: int | None = None
        #: Another connection took the client id (and its session) over.
        self._session_given_up = False
        #: Its session outlives it (and is in the state journal).
        self._persistent = False
        self._life = services.life
        #: Its publishes' debt (and their fan-out) rolls up here, then to the broker's.
        self.account = Account(
            self.name,
            high_watermark=config.connection_high_watermark,
            low_watermark=config.connection_low_watermark,
            parent=resources.account,
            kind="mqtt",
        )
        self.protocol = ServerConnection(
            max_packet_size=config.max_frame,
            receive_maximum=RECEIVE_MAXIMUM,
            send_maximum=SEND_MAXIMUM,
        )
        self._log = ConnectionLog(resources.peer_log, self.name, peer)
        self.admission = MQTTAdmission(services.gate, peer, self.name, identity)
        self.publishing = MQTTPublishing(
            config, services.life, services.topics, self.account, self._acknowledge
        )
        self.deliveries = MQTTDeliveries(
            self.name,
            self.protocol,
            self.wake_writer,
            lossy_budget=config.lossy_budget,
            max_unsent=config.max_unsent,
            root_account=resources.account,
        )
        self.subscribing = MQTTSubscribing(
            services.topics,
            services.storage,
            self.deliveries,
            max_subscriptions=config.max_subscriptions,
        )
        self.subscribing.sessions = sessions
        self.subscribing.retained = retained
        self._connect_deadline = trio.current_time() + config.hello_timeout
        self._wake = trio.Event()
        self._poke_timer = trio.Event()
        self._writing: list[LoanedItem[Any]] = []
        #: Broker topic names of the MQTT topic names it published to.
        self._broker_names: dict[str, str] = {}
        #: Nothing is written before then (a refused CONNECT is held back).
        self._hold_until = 0.0
        #: When the reader last resumed after a pause (keepalive counts from then).
        self._resumed = trio.current_time()
        self._paused = False
        self._nursery: trio.Nursery | None = None
        #: We ended the connection (then the client is given a moment to read why).
        self._ended_by_us = False
        self.closed = trio.Event()
        self.close_reason = ""

    @property
    def client_id(self) -> str:
        """The client identifier it connected with ("" before CONNECT)."""
        return self.admission.client_id

    @property
    def version(self) -> int | None:
        """The protocol level (4: 3.1.1, 5: 5.0), once CONNECT said it."""
        return self.protocol.version

    def statistics(self) -> MQTTConnectionStatistics:
        """Its figures now (what ``/stat.json`` shows of it)."""
        deliveries = self.deliveries
        counters = deliveries.counters
        filters = deliveries.filters.values()
        return MQTTConnectionStatistics(
            serial=self.serial,
            name=self.name,
            peer=self.peer,
            client_id=self.client_id,
            principal=self.admission.principal_name,
            version={4: "3.1.1", 5: "5.0"}.get(self.version or 0, ""),
            state=self.protocol.state.name.lower(),
            persistent=self._persistent,
            subscriptions=len(deliveries.filters),
            shared_subscriptions=sum(1 for state in filters if state.shared),
            messages_in=self.publishing.messages_in,
            messages_out=counters.messages_out,
            unacknowledged_in=self.publishing.unacknowledged,
            in_flight_out=len(deliveries.in_flight),
            unsent_bytes=self.protocol.bytes_to_send,
            dropped_overflow=counters.deliveries_overflowed,
            dropped_too_large=counters.deliveries_too_large,
            dropped_expired=counters.deliveries_expired,
        )

    # ================================================================ lifecycle

    async def run(self) -> None:
        """Serve the connection until either side ends it."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._reader)
                nursery.start_soon(self._timer)
                await self._writer()
                nursery.cancel_scope.cancel()
            if self._ended_by_us:
                await linger(self.stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as error:
            self.close_reason = self.close_reason or f"socket error: {error}"
        finally:
            self._cleanup()
            with trio.CancelScope(shield=True), trio.move_on_after(1):
                await self.stream.aclose()
            self.closed.set()

    def end(self, reason: ReasonCode, message: str) -> None:
        """Close the connection: a 5.0 client is told ``reason`` (DISCONNECT)."""
        if self.protocol.state is not ConnectionState.CLOSED:
            self._ended_by_us = True
            properties = Properties(reason_string=message) if self.version == MQTT_5 else None
            if properties is None:
                self.protocol.disconnect(reason)
            else:
                self.protocol.disconnect(reason, properties)
            self.close_reason = self.close_reason or f"closed by the broker: {message}"
        self.wake_writer()

    def shutting_down(self) -> None:
        """The broker shuts down: DISCONNECT 0x8B (5.0), and close."""
        self.end(R.SERVER_SHUTTING_DOWN, "broker shutting down")

    def give_up_session(self) -> KeptSession | None:
        """Another connection takes the client id over: the session it may
        resume (this connection's subscriptions; None before CONNACK), which
        this one no longer keeps."""
        if not self.accepted or self._session_given_up:
            return None
        self._session_given_up = True
        return self._session_now(0.0)

    def _session_now(self, expires: float) -> KeptSession:
        filters = self._filters()
        state = self.protocol.session_state()
        inbound = state.inbound_qos2
        if not self._life.closing:  # (then they are forwarded, and count as received)
            inbound |= self.publishing.pending_qos2()
        outbound = self.deliveries.outbound()
        return KeptSession(filters, inbound, expires, outbound, state.outbound_released)

    def _leave_session(self) -> None:
        """The connection ends: its session is kept (a persistent one), or
        ends (its cursors deleted)."""
        if not self.accepted or self._session_given_up or not self._sessions.available:
            return
        connect = self.protocol.connect
        assert connect is not None
        expires: float | None = None
        if self.version == MQTT_5 or not connect.clean_start:
            expires = expiry_of(self._expiry_interval, self.version == MQTT_5, trio.current_time())
        if expires is not None:
            session = self._session_now(expires)
            self._sessions.keep(self.client_id, session)
            self._record_session(session.filters, gone=True)
            self._sessions.record_outbound(
                self.client_id, session.outbound, session.released, qos2_only=False
            )
        elif self.subscribing.session_client is not None:
            self._sessions.end(self.client_id)

    def _record_session(self, filters: Filters, *, gone: bool = False) -> None:
        """Put the session in the state journal (written before the next
        bytes go out)."""
        interval = self._expiry_interval if self.version == MQTT_5 else None
        self._sessions.record(self.client_id, filters, interval, gone=gone)

    def _filters(self) -> Filters:
        return {
            topic_filter: (
                state.qos,
                state.identifier,
                state.retain_as_published,
                state.no_local,
                state.since,
            )
            for topic_filter, state in self.deliveries.filters.items()
        }

    def _qos2_placed(self, topic: str, placed: list[tuple[int, int]]) -> None:
        """QoS 2 publishes of ours are about to be appended to ``topic``'s
        log: where they go is written to the journal first (a restart then
        knows whether their records made it)."""
        sessions = self._sessions
        for packet_id, offset in placed:
            sessions.qos2_received(self.client_id, packet_id, [topic, offset])
        if sessions.journal is not None and sessions.journal.pending:
            sessions.journal.write()  # (a LogError: the batch waits, tried again)

    def _send_will(self) -> None:
        """The connection ended without a normal DISCONNECT: its will goes
        to its topic, now or after its Will Delay Interval (5.0; not if the
        session went on in another connection)."""
        protocol = self.protocol
        connect = protocol.connect
        if self._life.closing or not protocol.will_due or connect is None or connect.will is None:
            return
        will = connect.will
        try:
            name = broker_topic_name(will.topic)
        except TopicError as error:
            self._log(logging.WARNING, "will not published: %s", error.message)
            return
        if not self.admission.may_publish(name):
            self._log(logging.WARNING, "will not published: may not publish to %s", shown(name))
            return
        origin = self._origin(will.topic)

        def will_tail() -> tuple[bytes, bytes | None]:
            """(Its Message Expiry Interval counts from when it is published.)"""
            return published_tail(
                will.payload,
                will.properties,
                retain=will.retain,
                now_ms=wall_ms(),
                origin=origin,
                qos=will.qos,
            )

        retain = (will.topic, will.qos, not will.payload) if will.retain else None
        delay = float(will.properties.will_delay_interval or 0) if self.version == MQTT_5 else 0.0
        if delay > 0:
            if self._session_given_up:
                return  # (the session goes on: no will)
            # Sent when the delay ends or the session does, whichever comes first.
            session_left = None
            if self._sessions.available:
                session_left = expiry_of(self._expiry_interval, True, 0.0)
            delay = min(delay, 0.0 if session_left is None else session_left)
        if delay <= 0:
            tail, key = will_tail()
            if retain is not None:
                self._retained.update(will.topic, tail, will.qos, clear=not will.payload)
                self._retained.write()
            self.publishing.add(name, tail, key, None, 0)  # (forwarded by close())
            return
        wills = self._wills
        self._wills.later(self.client_id, delay, lambda: wills.publish(name, *will_tail(), retain))

    def _cleanup(self) -> None:
        self._leave_session()
        self._send_will()
        self.publishing.close()
        self.deliveries.close_all()
        for loan in self._writing:
            loan.repay()
        self._writing = []
        self.admission.leave()
        self.account.close()
        self._forget(self)
        self._log(logging.INFO, "closed: %s", self.close_reason or "done")

    # ================================================================ writer

    def wake_writer(self) -> None:
        self._wake.set()

    async def _writer(self) -> None:
        """Write what the protocol queued; return once it is closed and
        everything is written."""
        protocol = self.protocol
        deliveries = self.deliveries
        while True:
            if self._hold_until:
                await trio.sleep_until(self._hold_until)
                self._hold_until = 0.0
            data = protocol.data_to_send()
            if deliveries.writing:
                self._writing += deliveries.take_written()
            else:
                deliveries.unsent = 0
            if data:
                # What it says (a PUBREC, a SUBACK) is in the journal first.
                self.services.storage.persist_state()
                try:
                    await self.stream.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError) as error:
                    self.close_reason = self.close_reason or f"socket error: {error}"
                    self._ended_by_us = False
                    return
                loans, self._writing = self._writing, []
                for loan in loans:
                    loan.repay()
                deliveries.apply_acks()  # (of deliveries dropped as too large, if any)
                deliveries.pump_stalled()  # (room for what waited on the output)
                continue
            if protocol.state is ConnectionState.CLOSED:
                return
            self._wake = trio.Event()
            if protocol.bytes_to_send:
                continue
            await self._wake.wait()

    # ================================================================ reader

    async def _reader(self) -> None:
        protocol = self.protocol
        more = True  # the protocol may hold packets already read
        while protocol.state is not ConnectionState.CLOSED:
            if not more:
                try:
                    data = await self.stream.receive_some(RECEIVE_SIZE)
                except (trio.BrokenResourceError, trio.ClosedResourceError) as error:
                    data = b""
                    self.close_reason = self.close_reason or f"socket error: {error}"
                protocol.receive_data(data if type(data) is bytes else bytes(data))
            more = self._turn()
            if protocol.state is ConnectionState.AWAITING_CONNACK:
                await self._admit()
                more = True
            await self._pause_if_needed()
        self.wake_writer()

    def _turn(self) -> bool:
        """Apply up to :data:`EVENTS_PER_TURN` events; whether more may be
        waiting in the protocol (else the reader reads)."""
        protocol = self.protocol
        next_event = protocol.next_event
        publish = self._publish
        puback = self.deliveries.puback
        connected = ConnectionState.CONNECTED
        now = trio.current_time()
        handled = 0
        try:
            while handled < EVENTS_PER_TURN:
                event = next_event(now)
                handled += 1
                if type(event) is Publish:  # (the usual events first, without the match)
                    publish(event)
                elif type(event) is PubAck:
                    puback(event.packet_id)
                    continue  # (a PUBACK closes nothing)
                elif event is None:
                    return False
                else:
                    self._handle(event)
                if protocol.state is not connected:
                    return False
            return True
        finally:
            self._retained.write()  # (before the acknowledgements of the read)
            self.deliveries.apply_acks()
            self.deliveries.pump_stalled()
            if protocol.bytes_to_send or protocol.state is ConnectionState.CLOSED:
                self.wake_writer()

    async def _pause_if_needed(self) -> None:
        """A checkpoint, then the turn's publishes forwarded; and while the
        connection's account is in debt (and no subscription of ours waits
        for this client's reading), no reading: TCP throttles the client.

        (The publishes go after the checkpoint, so that other connections
        whose bytes came in the same round apply theirs first: a SUBSCRIBE
        another client sent just before this PUBLISH is in place when the
        publish reaches its topic, as a broker reading sockets in order
        would have it.)"""
        await trio.lowlevel.checkpoint()
        self.publishing.flush()
        account = self.account
        deliveries = self.deliveries
        while not account.is_clear() and not deliveries.waits_for_client():
            if self.protocol.state is ConnectionState.CLOSED:
                return
            self._paused = True
            try:
                with trio.CancelScope() as scope:
                    deliveries.funds_scope = scope
                    await account.ensure_clear_funds()
            finally:
                deliveries.funds_scope = None
                self._paused = False
                self._resumed = trio.current_time()

    # ================================================================ timer

    async def _timer(self) -> None:
        """The CONNECT deadline, then the client's keepalive (not counted
        while the reader does not read)."""
        protocol = self.protocol
        while protocol.state is not ConnectionState.CLOSED:
            now = trio.current_time()
            if protocol.state is ConnectionState.AWAITING_CONNECT:
                if now >= self._connect_deadline:
                    self.close_reason = "no CONNECT in time"
                    self._ended_by_us = True
                    protocol.disconnect(R.MAXIMUM_CONNECT_TIME)
                    self.wake_writer()
                    return
                deadline = self._connect_deadline
            else:
                deadline = protocol.keepalive_deadline() or now + 3600.0
                connect = protocol.connect
                grace = 1.5 * connect.keepalive if connect is not None else 0.0
                if self._paused or now < self._resumed + grace:
                    deadline = max(deadline, (now if self._paused else self._resumed) + grace)
                elif protocol.check_keepalive(now):
                    self.close_reason = "keepalive expired"
                    self._ended_by_us = True
                    self.wake_writer()
                    return
            with trio.move_on_at(deadline):
                await self._poke_timer.wait()
            self._poke_timer = trio.Event()

    # ================================================================ events

    def _handle(self, event: Event) -> None:
        """Apply one event of a read."""
        protocol = self.protocol
        match event:
            case Publish():
                self._publish(event)
            case PubAck():
                self.deliveries.puback(event.packet_id)
            case PubRel():
                protocol.pubcomp(event.packet_id)
                if self._persistent:
                    self._sessions.qos2_done(self.client_id, event.packet_id)
            case Subscribe():
                protocol.suback(event.packet_id, self.subscribing.subscribe(event))
                if self._persistent:
                    self._record_session(self._filters())
                self.subscribing.start()
            case Unsubscribe():
                protocol.unsuback(event.packet_id, self.subscribing.unsubscribe(event))
                if self._persistent:
                    self._record_session(self._filters())
            case Connect():
                pass  # (admitted by the reader once the turn is over: see _admit)
            case Disconnect():
                self.close_reason = f"DISCONNECT from the client: {event.reason.name}"
                if event.properties.session_expiry_interval is not None:
                    self._expiry_interval = event.properties.session_expiry_interval
            case ConnectionClosed():
                if event.reason is None:
                    self.close_reason = self.close_reason or event.message
                else:
                    self.close_reason = f"protocol error {int(event.reason):#04x}: {event.message}"
                    self._ended_by_us = True
                    self._log(logging.WARNING, "%s", shown(self.close_reason))
            case PubRec():
                self.deliveries.pubrec(event.packet_id, event.reason.is_error)
            case PubComp():
                self.deliveries.pubcomp(event.packet_id)
            case PingReq():
                pass  # (answered by the protocol)

    def _publish(self, event: Publish) -> None:
        """A PUBLISH: to its topic, acknowledged once routed; refused (0x90
        no broker topic, 0x87 not authorised) with a PUBACK or PUBREC
        reason (5.0, QoS 1 and 2), else by closing the connection."""
        name = self._broker_names.get(event.topic)
        if name is None:
            try:
                name = broker_topic_name(event.topic)
            except TopicError as error:
                self._refuse(event, error.reason, error.message)
                return
            if len(self._broker_names) >= NAMES_KEPT:
                self._broker_names.clear()
            self._broker_names[event.topic] = name
        admission = self.admission
        if admission.principal is not None and not admission.may_publish(name):
            self._refuse(event, R.NOT_AUTHORIZED, f"may not publish to {shown(name)}")
            return
        if self._life.closing:
            return  # a shutdown accepts none: never routed, never acknowledged
        properties = event.properties
        if properties is NO_PROPERTIES and not event.retain and not self.deliveries.filters:
            # (The usual publish: nothing but its payload and QoS to keep.)
            self.publishing.add(
                name, plain_tail(event.payload, event.qos), None, event.packet_id, event.qos
            )
            return
        tail, key = published_tail(
            event.payload,
            properties,
            retain=event.retain,
            now_ms=None if properties.message_expiry_interval is None else wall_ms(),
            origin=self._origin(event.topic),
            qos=event.qos,
        )
        if event.retain:
            self._retained.update(event.topic, tail, event.qos, clear=not event.payload)
        self.publishing.add(name, tail, key, event.packet_id, event.qos)

    def _origin(self, topic: str) -> str | None:
        """The client id to mark a publish to ``topic`` with: only when one
        of the client's No Local subscriptions matches it (see ``_messages``)."""
        for state in self.deliveries.filters.values():
            if state.no_local and topic_matches(state.topic_filter, topic):
                return self.client_id
        return None

    def _refuse(self, event: Publish, reason: ReasonCode, message: str) -> None:
        protocol = self.protocol
        self._log(logging.WARNING, "PUBLISH to %s refused: %s", shown(event.topic), message)
        if self.version == MQTT_5 and event.packet_id is not None:
            properties = Properties(reason_string=message)
            if event.qos == 1:
                protocol.puback(event.packet_id, reason, properties)
            else:
                protocol.pubrec(event.packet_id, reason, properties)
            return
        self.end(reason, message)

    def _acknowledge(self, routed: list[Pending]) -> None:
        """Publishes of ours were routed: PUBACK (QoS 1) or PUBREC (QoS 2) each."""
        protocol = self.protocol
        if protocol.state is not ConnectionState.CONNECTED:
            return
        for pending in routed:
            if pending.qos == 1:
                protocol.puback(pending.packet_id)
            else:
                if self._persistent:  # (in the journal before the PUBREC goes)
                    self._sessions.qos2_received(self.client_id, pending.packet_id, [])
                protocol.pubrec(pending.packet_id)
        self.wake_writer()

    async def _admit(self) -> None:
        """Answer the CONNECT: accepted (CONNACK 0x00, this connection
        takes the client id over from any other), or refused (after the
        delay failed credentials earn)."""
        connect = self.protocol.connect
        assert connect is not None
        sessions = self._sessions
        decision = self.admission.admit(
            connect,
            trio.current_time(),
            keeps_sessions=sessions.available,
            shares=self.subscribing.shares,
        )
        try:
            if decision.reason.is_error:
                self._hold_until = decision.hold and trio.current_time() + decision.hold
                self._ended_by_us = True
                self.close_reason = f"CONNECT refused: {decision.message}"
                self._log(logging.WARNING, "%s", self.close_reason)
                properties = Properties(reason_string=decision.message)
                self.protocol.connack(
                    decision.reason,
                    properties=properties if self.version == MQTT_5 else Properties(),
                )
                return
            kept = self._claim(self, connect.clean_start)
            v5 = self.version == MQTT_5
            self._expiry_interval = connect.properties.session_expiry_interval if v5 else None
            persistent = (not v5 and not connect.clean_start) or bool(self._expiry_interval)
            subscribing = self.subscribing
            self.deliveries.client_id = self.client_id
            subscribing.may_subscribe = self.admission.may_subscribe
            subscribing.principal = self.admission.principal_name
            if sessions.available and (persistent or kept is not None):
                subscribing.session_client = self.client_id
            if sessions.available and persistent:
                self._persistent = True
                self.publishing.qos2_placed = self._qos2_placed
                client_id = self.client_id
                self.deliveries.outbound_changed = lambda packet_id, value: (
                    sessions.outbound_changed(client_id, packet_id, value)
                )
                self._record_session(kept.filters if kept is not None else {})
            elif kept is not None:
                sessions.forget_record(self.client_id)  # (it ends with this connection)
            session = None
            if kept is not None:
                unacked = {packet_id: qos for packet_id, (_, qos) in kept.outbound.items()}
                session = SessionState(kept.inbound_qos2, unacked, kept.released)
            self.protocol.connack(
                properties=decision.properties,
                session_present=kept is not None,
                session=session,
            )
            self.accepted = True
            self._log(
                logging.INFO,
                "CONNECT from %s%s",
                shown(self.client_id),
                " (session resumed)" if kept is not None else "",
            )
            if kept is not None:
                subscribing.restore(kept.filters)
                self.deliveries.resume(kept.outbound, kept.released)
                if self._persistent:  # (its QoS 1 ones are in memory now)
                    sessions.record_outbound(
                        self.client_id, kept.outbound, kept.released, qos2_only=True
                    )
                subscribing.start()
        except MQTTError as error:  # pragma: no cover - a bug of ours
            self.end(R.IMPLEMENTATION_SPECIFIC_ERROR, error.message)
        finally:
            self.wake_writer()
            self._poke_timer.set()
