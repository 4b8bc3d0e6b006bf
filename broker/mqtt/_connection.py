"""One MQTT connection, server role, sans-IO: bytes in, events out, bytes
to send (like h11's ``Connection``).

The application feeds received bytes with :meth:`ServerConnection.receive_data`
(``b""`` at end of stream), takes events with
:meth:`~ServerConnection.next_event` until it returns ``None``, answers
with the sending methods, and writes :meth:`~ServerConnection.data_to_send`.
Nothing here calls back into the application; time is passed in.

What it enforces (a broken rule closes the connection: a 5.0 client gets a
DISCONNECT, or a CONNACK while connecting, with the reason code; a 3.1.1
client gets nothing, or a CONNACK return code where 3.1.1 has one):

- CONNECT first and once; protocol levels 4 (3.1.1) and 5 (5.0), others get
  a 3.1.1 CONNACK with return code 1; a 3.1.1 empty client id without
  Clean Session gets return code 2; 5.0 enhanced authentication (an
  Authentication Method, or an AUTH packet) is refused: 0x8C in CONNACK,
  0x82 for AUTH; a will topic must be a valid topic name (0x90).
- After CONNECT, no packet is read until the application answers with
  :meth:`~ServerConnection.connack` (5.0 clients may send before CONNACK).
- The server's Maximum Packet Size (0x95), Receive Maximum on inbound
  QoS 1 and 2 (0x93, 5.0 only: 3.1.1 clients are not told one), Topic Alias
  Maximum both ways (0x94), the Maximum QoS (0x9B) and Retain Available
  (0x9A) the application put in CONNACK, topic names (0x90), packet
  identifiers in use (0x82), no Subscription Identifier from a client, no
  No Local on a shared subscription, a session expiry set in DISCONNECT
  only if CONNECT set one (0x82).
- QoS 2 inbound: a PUBLISH whose packet id awaits PUBREL is answered with
  PUBREC again and not handed out twice; an unknown PUBREL gets PUBCOMP
  (5.0: 0x92). Outbound: an unknown PUBREC gets PUBREL (5.0: 0x92);
  unknown PUBACKs and PUBCOMPs are ignored.
- PINGREQ is answered with PINGRESP by the connection itself.
- Keepalive: :meth:`~ServerConnection.check_keepalive` closes (5.0: 0x8D)
  once no packet came for 1.5 times the keepalive.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

from ._codec import connect_protocol_level, decode_packet, encode_packet
from ._codes import MQTT_3_1_1, MQTT_5, REASONS_ALLOWED, PacketType, ReasonCode
from ._errors import MQTTProtocolError, MQTTUsageError, PacketTooLargeForPeer
from ._framing import DEFAULT_MAX_PACKET_SIZE, MAX_PACKET_SIZE, Framer
from ._packets import (
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    PingReq,
    PingResp,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    UnsubAck,
    Unsubscribe,
    new_publish,
)
from ._properties import NO_PROPERTIES, Properties
from ._topics import topic_name_problem
from ._wire import string, varint

__all__ = ["ConnectionClosed", "ConnectionState", "Event", "ServerConnection", "SessionState"]

R = ReasonCode
#: Topic names a connection remembers as valid, each way.
_NAMES_KEPT = 1024
#: The events of plain PUBACKs, by packet id (made once: they are values).
_PUBACKS: dict[int, PubAck] = {}
#: A PUBACK's fixed header (its packet id follows).
_PUBACK = bytes((PacketType.PUBACK << 4, 2))


class ConnectionState(Enum):
    """Where a connection is in its life."""

    #: Nothing but CONNECT may come.
    AWAITING_CONNECT = "awaiting CONNECT"
    #: CONNECT was handed out; nothing is read until :meth:`connack`.
    AWAITING_CONNACK = "awaiting the application's CONNACK"
    #: CONNACK accepted the client.
    CONNECTED = "connected"
    #: Closed: flush :meth:`data_to_send`, then close the transport.
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class ConnectionClosed:
    """The connection is over without a DISCONNECT from the client: the
    client closed its end (``reason`` is ``None``), or it broke the protocol
    and the connection closed with ``reason`` (sent to a 5.0 client)."""

    reason: ReasonCode | None
    message: str


#: What :meth:`ServerConnection.next_event` hands out.
Event = (
    Connect
    | Publish
    | PubAck
    | PubRec
    | PubRel
    | PubComp
    | Subscribe
    | Unsubscribe
    | PingReq
    | Disconnect
    | ConnectionClosed
)


@dataclass(frozen=True, slots=True)
class SessionState:
    """The packet-identifier state a session keeps across connections (and
    a broker restart), from :meth:`ServerConnection.session_state`."""

    #: Inbound QoS 2 ids whose PUBREC was sent and PUBCOMP not yet: a
    #: PUBLISH with one of them again is a duplicate, not a new message.
    inbound_qos2: frozenset[int] = frozenset()
    #: Outbound PUBLISHes not acknowledged yet: packet id -> QoS. The
    #: application resends them with ``publish(..., packet_id=id)``.
    outbound_unacked: dict[int, int] = dataclasses.field(default_factory=dict)
    #: Outbound QoS 2 ids released (PUBREC received), PUBCOMP not yet: the
    #: application resends ``pubrel(id)``.
    outbound_released: frozenset[int] = frozenset()


class ServerConnection:
    """The server's end of one MQTT 3.1.1 or 5.0 connection (see the module).

    ``max_packet_size`` bounds what the client may send (fixed header
    included; 5.0 clients are told it in CONNACK); ``receive_maximum``
    bounds its unacknowledged QoS 1 and 2 PUBLISHes (5.0);
    ``send_maximum`` bounds the server's to the client (with the client's
    own Receive Maximum, if lower: a 3.1.1 client has none), and new
    packet ids are taken from 1 to four times it (at most 65,535);
    ``topic_alias_maximum`` is how many topic aliases the client may use
    (5.0; 0: none); ``outbound_topic_aliases`` lets :meth:`publish` give
    topics aliases, as many as the client allows.
    """

    def __init__(
        self,
        *,
        max_packet_size: int = DEFAULT_MAX_PACKET_SIZE,
        receive_maximum: int = 65_535,
        send_maximum: int = 65_535,
        topic_alias_maximum: int = 64,
        outbound_topic_aliases: bool = True,
    ) -> None:
        if not 1 <= receive_maximum <= 65_535:
            raise ValueError("receive_maximum must be 1-65535")
        if not 1 <= send_maximum <= 65_535:
            raise ValueError("send_maximum must be 1-65535")
        if not 0 <= topic_alias_maximum <= 65_535:
            raise ValueError("topic_alias_maximum must be 0-65535")
        self._framer = Framer(max_packet_size)
        self.max_packet_size = max_packet_size
        self.receive_maximum = receive_maximum
        self.topic_alias_maximum = topic_alias_maximum
        self._outbound_aliases_on = outbound_topic_aliases
        self._out = bytearray()
        self._state = ConnectionState.AWAITING_CONNECT
        self._eof = False
        #: The protocol level (4 or 5) once CONNECT says it.
        self.version: int | None = None
        #: The client's CONNECT once received.
        self.connect: Connect | None = None
        self._accepted = False
        self._client_disconnect: ReasonCode | None = None
        self._keepalive = 0
        self._last_seen: float | None = None
        # What the client allows (5.0 CONNECT properties).
        self._client_receive_maximum = send_maximum
        self._send_maximum = send_maximum
        #: New outbound packet ids cycle through 1 to this.
        self._last_id = min(0xFFFF, 4 * send_maximum)
        self._client_max_packet = MAX_PACKET_SIZE
        self._client_alias_max = 0
        # What the application's CONNACK allows.
        self._max_qos = 2
        self._retain_available = True
        # Inbound flows by packet id.
        self._in_qos1: set[int] = set()
        self._in_qos2_new: set[int] = set()
        self._in_qos2_rec: set[int] = set()
        self._in_qos2_rel: set[int] = set()
        self._restored: set[int] = set()
        self._in_quota_used = 0
        self._in_aliases: dict[int, str] = {}
        # Outbound flows by packet id.
        self._out_unacked: dict[int, int] = {}
        self._out_released: set[int] = set()
        self._next_id = 1
        self._out_aliases: dict[str, int] = {}
        # Topic names seen valid: as received (bytes) and as sent (the
        # string's wire form), so that the usual PUBLISH skips the checks.
        self._names_in: dict[bytes, str] = {}
        self._names_out: dict[str, bytes] = {}

    # -- reading -----------------------------------------------------------

    @property
    def state(self) -> ConnectionState:
        """Where the connection is (:class:`ConnectionState`)."""
        return self._state

    def receive_data(self, data: bytes) -> None:
        """Add bytes received from the client; ``b""`` means the client
        closed its end. Bytes after the connection closed are ignored."""
        if self._state is ConnectionState.CLOSED:
            return
        if data:
            self._framer.feed(data)
        else:
            self._eof = True

    def next_event(self, now: float) -> Event | None:
        """The next event, or ``None`` when more bytes are needed (or, after
        a :class:`Connect`, until :meth:`connack`; or after closing). ``now``
        (any monotonic clock, seconds) is when the packet counts as received
        for keepalive. Never raises for what the client sent: a violation
        returns :class:`ConnectionClosed` and queues the answer."""
        framer = self._framer
        while True:
            state = self._state
            if state is ConnectionState.AWAITING_CONNECT:
                first = framer.first_byte
                if first is not None and first >> 4 != PacketType.CONNECT:
                    # (Known from its first byte: no need to wait for the rest.)
                    return self._fail(R.PROTOCOL_ERROR, "the first packet must be CONNECT")
            elif state is not ConnectionState.CONNECTED:
                return None
            try:
                span = framer.next_span()
            except MQTTProtocolError as error:
                return self._fail(error.reason, error.message)
            if span is None:
                if not self._eof:
                    return None
                self._state = ConnectionState.CLOSED
                inside = " inside a packet" if framer.buffered else ""
                return ConnectionClosed(None, f"the client closed the connection{inside}")
            self._last_seen = now
            first, data, start, end = span
            if first == 0x40 and end - start == 2 and (data[start] or data[start + 1]):
                # (The usual PUBACK, read directly.)
                packet_id = data[start] << 8 | data[start + 1]
                if self._out_unacked.get(packet_id) == 1:
                    del self._out_unacked[packet_id]
                    ack = _PUBACKS.get(packet_id)
                    if ack is None:
                        ack = _PUBACKS[packet_id] = PubAck(packet_id)
                    return ack
                continue  # (unknown, or a repeat: ignored)
            if first >> 4 == PacketType.PUBLISH and state is ConnectionState.CONNECTED:
                fast = self._fast_publish(first, data, start, end)
                if fast is not None:
                    return fast
            try:
                event = self._handle(first, data, start, end)
            except MQTTProtocolError as error:
                return self._fail(error.reason, error.message)
            if event is not None:
                return event

    def events(self, now: float) -> list[Event]:
        """Every event :meth:`next_event` has now, in order."""
        out: list[Event] = []
        while (event := self.next_event(now)) is not None:
            out.append(event)
        return out

    @property
    def bytes_to_send(self) -> int:
        """How many bytes are queued for the client (what :meth:`data_to_send`
        would return now)."""
        return len(self._out)

    def data_to_send(self) -> bytes:
        """The bytes queued for the client since the last call (the caller
        writes them in order)."""
        data = bytes(self._out)
        self._out.clear()
        return data

    # -- keepalive ---------------------------------------------------------

    def keepalive_deadline(self) -> float | None:
        """When the client is late (1.5 times the keepalive after the last
        packet), or ``None`` without keepalive."""
        if not self._keepalive or self._last_seen is None:
            return None
        if self._state is ConnectionState.CLOSED:
            return None
        return self._last_seen + 1.5 * self._keepalive

    def check_keepalive(self, now: float) -> bool:
        """Whether the client is late at ``now``; if so the connection is
        closed (5.0: DISCONNECT 0x8D Keep Alive timeout queued)."""
        deadline = self.keepalive_deadline()
        if deadline is None or now <= deadline:
            return False
        self._fail(R.KEEP_ALIVE_TIMEOUT, "no packet within 1.5 times the keepalive")
        return True

    # -- the session ---------------------------------------------------------

    @property
    def will_due(self) -> bool:
        """Whether the application should publish the client's will now that
        the connection is closed: the client was accepted, had a will, and
        did not end with a normal DISCONNECT (0x00)."""
        return (
            self._accepted
            and self.connect is not None
            and self.connect.will is not None
            and self._client_disconnect is not R.NORMAL_DISCONNECTION
        )

    def session_state(self) -> SessionState:
        """The packet-identifier state to keep in the client's session."""
        return SessionState(
            frozenset(self._in_qos2_rec | self._in_qos2_rel),
            dict(self._out_unacked),
            frozenset(self._out_released),
        )

    def forget_outbound(self, packet_id: int) -> bool:
        """Give up an unacknowledged outbound PUBLISH of a restored session
        that cannot be resent (its message is gone): its packet id is free
        again and no longer counts against the client's Receive Maximum.
        Whether it was one."""
        return self._out_unacked.pop(packet_id, None) is not None

    @property
    def send_quota(self) -> int:
        """How many more QoS 1 or 2 PUBLISHes the client's Receive Maximum
        lets :meth:`publish` send now."""
        in_flight = len(self._out_unacked) + len(self._out_released)
        return max(0, self._client_receive_maximum - in_flight)

    @property
    def client_maximum_packet_size(self) -> int:
        """The largest packet the client accepts (5.0), fixed header included."""
        return self._client_max_packet

    # -- sending -----------------------------------------------------------

    def connack(
        self,
        reason: ReasonCode = R.SUCCESS,
        *,
        session_present: bool = False,
        properties: Properties = NO_PROPERTIES,
        session: SessionState | None = None,
    ) -> None:
        """Answer the :class:`Connect`: accept (``reason`` 0x00) or refuse
        (0x80 and above, then the connection is closed; a 3.1.1 client gets
        the nearest return code). ``session`` restores a kept session's
        packet ids (with ``session_present``). The connection adds the 5.0
        properties it owns: Receive Maximum, Topic Alias Maximum and Maximum
        Packet Size; the application may set Maximum QoS, Retain Available,
        Server Keep Alive (which then applies) and the others CONNACK allows.
        """
        self._need(ConnectionState.AWAITING_CONNACK, "CONNACK")
        assert self.connect is not None and self.version is not None
        if reason.is_error:
            if session_present or session is not None:
                raise MQTTUsageError(R.PROTOCOL_ERROR, "a refusal has no session")
            self._send(ConnAck(reason, False, properties))
            self._state = ConnectionState.CLOSED
            return
        if session is not None and not session_present:
            raise MQTTUsageError(R.PROTOCOL_ERROR, "a restored session is a present session")
        owned = {"receive_maximum", "topic_alias_maximum", "maximum_packet_size"}
        if owned & set(properties.present()):
            raise MQTTUsageError(R.PROTOCOL_ERROR, f"the connection sets {sorted(owned)} itself")
        if self.version == MQTT_5:
            if not self.connect.client_id and properties.assigned_client_identifier is None:
                raise MQTTUsageError(
                    R.CLIENT_IDENTIFIER_NOT_VALID,
                    "an empty client id needs an assigned_client_identifier in CONNACK",
                )
            properties = dataclasses.replace(
                properties,
                receive_maximum=None if self.receive_maximum == 65_535 else self.receive_maximum,
                topic_alias_maximum=self.topic_alias_maximum or None,
                maximum_packet_size=(
                    None if self.max_packet_size >= MAX_PACKET_SIZE else self.max_packet_size
                ),
            )
            if properties.maximum_qos is not None:
                self._max_qos = properties.maximum_qos
            self._retain_available = properties.retain_available != 0
            if properties.server_keep_alive is not None:
                self._keepalive = properties.server_keep_alive
        if session is not None:
            self._in_qos2_rec = set(session.inbound_qos2)
            self._restored = set(session.inbound_qos2)
            self._out_unacked = dict(session.outbound_unacked)
            self._out_released = set(session.outbound_released)
        self._send(ConnAck(reason, session_present, properties))
        self._accepted = True
        self._state = ConnectionState.CONNECTED

    def publish(
        self,
        topic: str,
        payload: bytes,
        qos: int = 0,
        *,
        retain: bool = False,
        properties: Properties = NO_PROPERTIES,
        packet_id: int | None = None,
    ) -> int | None:
        """Send a PUBLISH; its packet id for QoS 1 and 2 (else ``None``).

        A new QoS 1 or 2 PUBLISH takes a free packet id and needs
        :attr:`send_quota` (else :class:`MQTTUsageError`). ``packet_id``
        resends an unacknowledged one (a restored session's) with DUP set.
        A packet larger than the client accepts raises
        :class:`PacketTooLargeForPeer` and sends nothing: MQTT says to drop
        it. Topic aliases are used as the client allows (5.0).
        """
        if self._state is not ConnectionState.CONNECTED:
            self._need(ConnectionState.CONNECTED, "PUBLISH")
        wire = self._names_out.get(topic)
        if wire is None:
            problem = topic_name_problem(topic)
            if problem is not None:
                raise MQTTUsageError(R.TOPIC_NAME_INVALID, problem)
            wire = self._wire_name(topic)
        if qos not in (0, 1, 2):
            raise MQTTUsageError(R.PROTOCOL_ERROR, f"QoS {qos} is not 0, 1 or 2")
        if properties.topic_alias is not None:
            raise MQTTUsageError(R.PROTOCOL_ERROR, "the connection chooses topic aliases")
        dup = False
        if packet_id is not None:
            if self._out_unacked.get(packet_id) != qos or not qos:
                raise MQTTUsageError(
                    R.PACKET_IDENTIFIER_NOT_FOUND,
                    f"packet id {packet_id} has no unacknowledged QoS {qos} PUBLISH to resend",
                )
            dup = True
        elif qos:
            in_flight = len(self._out_unacked) + len(self._out_released)
            if in_flight >= self._client_receive_maximum:
                raise MQTTUsageError(
                    R.RECEIVE_MAXIMUM_EXCEEDED, "the client's receive maximum is reached"
                )
            packet_id = self._free_id()
        v5 = self.version == MQTT_5
        if properties is NO_PROPERTIES and not (
            v5 and self._outbound_aliases_on and self._client_alias_max
        ):
            # The usual PUBLISH, written directly (as encode_packet writes it).
            size = len(wire) + len(payload) + (2 if qos else 0) + v5
            first = 0x30 | dup << 3 | qos << 1 | retain
            head = bytes((first, size)) if size < 0x80 else bytes((first,)) + varint(size)
            if len(head) + size > self._client_max_packet:
                raise PacketTooLargeForPeer(
                    R.PACKET_TOO_LARGE,
                    f"a PUBLISH of {len(head) + size} bytes is larger than the client's "
                    f"maximum of {self._client_max_packet}",
                )
            out = self._out
            out += head
            out += wire
            if qos:
                assert packet_id is not None
                out += packet_id.to_bytes(2, "big")
                self._out_unacked[packet_id] = qos
                self._next_id = packet_id % self._last_id + 1
            if v5:
                out.append(0)
            out += payload
            return packet_id
        new_alias: int | None = None
        wire_topic = topic
        if self.version == MQTT_5 and self._outbound_aliases_on and self._client_alias_max:
            alias = self._out_aliases.get(topic)
            if alias is None and len(self._out_aliases) < self._client_alias_max:
                alias = new_alias = len(self._out_aliases) + 1
            elif alias is not None:
                wire_topic = ""
            if alias is not None:
                properties = dataclasses.replace(properties, topic_alias=alias)
        data = encode_packet(
            Publish(wire_topic, payload, qos, retain, dup, packet_id, properties), self._version()
        )
        if len(data) > self._client_max_packet:
            raise PacketTooLargeForPeer(
                R.PACKET_TOO_LARGE,
                f"a PUBLISH of {len(data)} bytes is larger than the client's maximum "
                f"of {self._client_max_packet}",
            )
        if new_alias is not None:
            self._out_aliases[topic] = new_alias
        if qos:
            assert packet_id is not None
            self._out_unacked[packet_id] = qos
            self._next_id = packet_id % self._last_id + 1
        self._out += data
        return packet_id

    def puback(
        self, packet_id: int, reason: ReasonCode = R.SUCCESS, properties: Properties = NO_PROPERTIES
    ) -> None:
        """Acknowledge an inbound QoS 1 PUBLISH (5.0: with ``reason``)."""
        if self._state is not ConnectionState.CONNECTED:
            self._need(ConnectionState.CONNECTED, "PUBACK")
        if packet_id not in self._in_qos1:
            self._take(self._in_qos1, packet_id, "QoS 1 PUBLISH awaiting PUBACK")
        self._in_qos1.discard(packet_id)
        self._inbound_done(packet_id)
        if reason is R.SUCCESS and properties is NO_PROPERTIES:
            self._out += _PUBACK + packet_id.to_bytes(2, "big")  # (the usual one, directly)
        else:
            self._send(PubAck(packet_id, reason, properties))

    def pubrec(
        self, packet_id: int, reason: ReasonCode = R.SUCCESS, properties: Properties = NO_PROPERTIES
    ) -> None:
        """Answer an inbound QoS 2 PUBLISH: received (then PUBREL is
        awaited), or refused with a reason of 0x80 and above (5.0; the flow
        ends)."""
        self._need(ConnectionState.CONNECTED, "PUBREC")
        self._take(self._in_qos2_new, packet_id, "QoS 2 PUBLISH awaiting PUBREC")
        if reason.is_error:
            self._inbound_done(packet_id)
        else:
            self._in_qos2_rec.add(packet_id)
        self._send(PubRec(packet_id, reason, properties))

    def pubcomp(
        self, packet_id: int, reason: ReasonCode = R.SUCCESS, properties: Properties = NO_PROPERTIES
    ) -> None:
        """Complete an inbound QoS 2 flow after its :class:`PubRel`."""
        self._need(ConnectionState.CONNECTED, "PUBCOMP")
        self._take(self._in_qos2_rel, packet_id, "QoS 2 flow awaiting PUBCOMP")
        self._inbound_done(packet_id)
        self._send(PubComp(packet_id, reason, properties))

    def pubrel(
        self, packet_id: int, reason: ReasonCode = R.SUCCESS, properties: Properties = NO_PROPERTIES
    ) -> None:
        """Release an outbound QoS 2 PUBLISH after its :class:`PubRec` (or
        resend the release of a restored session's)."""
        self._need(ConnectionState.CONNECTED, "PUBREL")
        if packet_id not in self._out_released:
            raise MQTTUsageError(
                R.PACKET_IDENTIFIER_NOT_FOUND, f"packet id {packet_id} awaits no PUBREL"
            )
        self._send(PubRel(packet_id, reason, properties))

    def suback(
        self,
        packet_id: int,
        reasons: Iterable[ReasonCode],
        properties: Properties = NO_PROPERTIES,
    ) -> None:
        """Answer a :class:`Subscribe`: one granted QoS (0x00-0x02) or error
        per subscription, in order (3.1.1 sends every error as 0x80)."""
        self._need(ConnectionState.CONNECTED, "SUBACK")
        self._send(SubAck(packet_id, tuple(reasons), properties))

    def unsuback(
        self,
        packet_id: int,
        reasons: Iterable[ReasonCode] = (),
        properties: Properties = NO_PROPERTIES,
    ) -> None:
        """Answer an :class:`Unsubscribe` (5.0: one reason per filter)."""
        self._need(ConnectionState.CONNECTED, "UNSUBACK")
        self._send(UnsubAck(packet_id, tuple(reasons), properties))

    def disconnect(
        self, reason: ReasonCode = R.NORMAL_DISCONNECTION, properties: Properties = NO_PROPERTIES
    ) -> None:
        """Close the connection: a 5.0 client is sent DISCONNECT with
        ``reason`` (3.1.1 has no server DISCONNECT). The will stays due."""
        if self._state is ConnectionState.CLOSED:
            return
        if self._state is ConnectionState.CONNECTED and self.version == MQTT_5:
            self._send(Disconnect(reason, properties))
        self._state = ConnectionState.CLOSED

    # -- inside ------------------------------------------------------------

    def _version(self) -> int:
        assert self.version is not None
        return self.version

    def _need(self, state: ConnectionState, what: str) -> None:
        if self._state is not state:
            raise MQTTUsageError(R.PROTOCOL_ERROR, f"{what} may not be sent {self._state.value}")

    @staticmethod
    def _take(ids: set[int], packet_id: int, what: str) -> None:
        if packet_id not in ids:
            raise MQTTUsageError(
                R.PACKET_IDENTIFIER_NOT_FOUND, f"packet id {packet_id} is no {what}"
            )
        ids.discard(packet_id)

    def _inbound_done(self, packet_id: int) -> None:
        if packet_id in self._restored:
            self._restored.discard(packet_id)
        else:
            self._in_quota_used -= 1

    @staticmethod
    def _topic_checked(topic: str) -> None:
        problem = topic_name_problem(topic)
        if problem is not None:
            raise MQTTProtocolError(R.TOPIC_NAME_INVALID, problem)

    def _note_name_in(self, topic: str) -> None:
        """Remember valid topic name ``topic`` for :meth:`_fast_publish`."""
        names = self._names_in
        if len(names) >= _NAMES_KEPT:
            names.clear()
        names[topic.encode()] = topic
        self._wire_name(topic)

    def _wire_name(self, topic: str) -> bytes:
        """``topic`` (a valid topic name, already checked) as an MQTT string."""
        wire = self._names_out.get(topic)
        if wire is None:
            names = self._names_out
            if len(names) >= _NAMES_KEPT:
                names.clear()
            wire = names[topic] = string(topic)
        return wire

    def _free_id(self) -> int:
        packet_id = self._next_id
        while packet_id in self._out_unacked or packet_id in self._out_released:
            packet_id = packet_id % self._last_id + 1
        return packet_id

    def _send(self, packet: Packet) -> None:
        """Queue ``packet``; in 5.0, too large for the client, without its
        reason string and user properties (as MQTT says), else dropped."""
        version = self._version()
        data = encode_packet(packet, version)
        props = getattr(packet, "properties", NO_PROPERTIES)
        if len(data) > self._client_max_packet and props != NO_PROPERTIES:
            smaller = dataclasses.replace(props, reason_string=None, user_properties=())
            data = encode_packet(dataclasses.replace(packet, properties=smaller), version)  # type: ignore[arg-type]
        if len(data) <= self._client_max_packet:
            self._out += data

    def _fail(self, reason: ReasonCode, message: str) -> ConnectionClosed:
        """Close for a violation (or keepalive), queuing what the version
        and state allow."""
        if self._state is ConnectionState.AWAITING_CONNECT and self.version is not None:
            if self.version == MQTT_5:
                code = reason if reason in REASONS_ALLOWED[PacketType.CONNACK] else R.PROTOCOL_ERROR
                self._send(ConnAck(code, False, Properties(reason_string=message)))
            elif reason in (R.CLIENT_IDENTIFIER_NOT_VALID, R.UNSUPPORTED_PROTOCOL_VERSION):
                self._send(ConnAck(reason))
        elif self._state is ConnectionState.CONNECTED and self.version == MQTT_5:
            allowed = REASONS_ALLOWED[PacketType.DISCONNECT]
            code = reason if reason in allowed else R.PROTOCOL_ERROR
            self._send(Disconnect(code, Properties(reason_string=message)))
        self._state = ConnectionState.CLOSED
        return ConnectionClosed(reason, message)

    def _handle(self, first: int, data: bytes, start: int, end: int) -> Event | None:
        """The event of the packet of first byte ``first`` whose body is
        ``data[start:end]``."""
        body = data[start:end]
        if self._state is ConnectionState.AWAITING_CONNECT:
            return self._handle_connect(first, body)
        packet = decode_packet(first, body, self._version())
        if isinstance(packet, Publish):
            return self._handle_publish(packet)
        if isinstance(packet, PubAck):
            if self._out_unacked.get(packet.packet_id) != 1:
                return None
            del self._out_unacked[packet.packet_id]
            return packet
        if isinstance(packet, PubRec):
            return self._handle_pubrec(packet)
        if isinstance(packet, PubRel):
            packet_id = packet.packet_id
            if packet_id in self._in_qos2_rec:
                self._in_qos2_rec.discard(packet_id)
                self._in_qos2_rel.add(packet_id)
                return packet
            if packet_id not in self._in_qos2_rel:  # else a repeat: PUBCOMP is on its way
                self._send(PubComp(packet_id, R.PACKET_IDENTIFIER_NOT_FOUND))
            return None
        if isinstance(packet, PubComp):
            if packet.packet_id not in self._out_released:
                return None
            self._out_released.discard(packet.packet_id)
            return packet
        if isinstance(packet, Subscribe):
            for sub in packet.subscriptions:
                if sub.no_local and sub.topic_filter.startswith("$share/"):
                    raise MQTTProtocolError(R.PROTOCOL_ERROR, "No Local on a shared subscription")
            return packet
        if isinstance(packet, Unsubscribe):
            return packet
        if isinstance(packet, PingReq):
            self._send(PingResp())
            return packet
        if isinstance(packet, Disconnect):
            return self._handle_disconnect(packet)
        if isinstance(packet, Auth):
            raise MQTTProtocolError(R.PROTOCOL_ERROR, "AUTH without an authentication method")
        name = PacketType(first >> 4).name
        if isinstance(packet, Connect):
            raise MQTTProtocolError(R.PROTOCOL_ERROR, "a second CONNECT")
        raise MQTTProtocolError(R.PROTOCOL_ERROR, f"a client may not send {name}")

    def _handle_connect(self, first: int, body: bytes) -> Event:
        if first >> 4 != PacketType.CONNECT:
            raise MQTTProtocolError(R.PROTOCOL_ERROR, "the first packet must be CONNECT")
        if first & 0x0F:
            raise MQTTProtocolError(R.MALFORMED_PACKET, "CONNECT has reserved flags set")
        level = connect_protocol_level(body)
        if level not in (MQTT_3_1_1, MQTT_5):
            if level is not None:  # MQTT, MQIsdp: answer as 3.1.1 does
                self.version = MQTT_3_1_1
            raise MQTTProtocolError(
                R.UNSUPPORTED_PROTOCOL_VERSION,
                "only MQTT 3.1.1 (level 4) and 5.0 (level 5) are supported",
            )
        self.version = level
        packet = decode_packet(first, body, level)
        assert isinstance(packet, Connect)
        if level == MQTT_3_1_1 and not packet.client_id and not packet.clean_start:
            raise MQTTProtocolError(
                R.CLIENT_IDENTIFIER_NOT_VALID, "an empty client id needs Clean Session"
            )
        props = packet.properties
        if props.authentication_method is not None:
            raise MQTTProtocolError(
                R.BAD_AUTHENTICATION_METHOD, "enhanced authentication is not supported"
            )
        if packet.will is not None:
            problem = topic_name_problem(packet.will.topic)
            if problem is not None:
                raise MQTTProtocolError(R.TOPIC_NAME_INVALID, f"will topic: {problem}")
        if props.receive_maximum is not None:
            self._client_receive_maximum = min(props.receive_maximum, self._send_maximum)
        if props.maximum_packet_size is not None:
            self._client_max_packet = props.maximum_packet_size
        if props.topic_alias_maximum is not None:
            self._client_alias_max = props.topic_alias_maximum
        self._keepalive = packet.keepalive
        self.connect = packet
        self._state = ConnectionState.AWAITING_CONNACK
        return packet

    def _fast_publish(self, first: int, data: bytes, start: int, end: int) -> Publish | None:
        """The usual PUBLISH (body ``data[start:end]``) read and applied
        directly: a topic name already seen valid, no properties, a new
        packet id within the limits, a QoS and retain flag allowed; None
        for anything else, and nothing changed (read the general way)."""
        flags = first & 0x0F
        qos = flags >> 1 & 0b11
        if qos == 3 or (flags & 0b1000 and not qos) or end - start < 2 or qos > self._max_qos:
            return None
        if flags & 1 and not self._retain_available:
            return None
        pos = start + 2 + (data[start] << 8 | data[start + 1])
        if pos + (2 if qos else 0) + (self.version == MQTT_5) > end:
            return None
        topic = self._names_in.get(data[start + 2 : pos])
        if topic is None:
            return None
        packet_id = None
        if qos:
            packet_id = data[pos] << 8 | data[pos + 1]
            if (
                not packet_id
                or packet_id in self._in_qos1
                or packet_id in self._in_qos2_new
                or packet_id in self._in_qos2_rec
                or packet_id in self._in_qos2_rel
            ):
                return None
            pos += 2
        if self.version == MQTT_5:
            if data[pos] or (qos and self._in_quota_used >= self.receive_maximum):
                return None
            pos += 1
        if packet_id is not None:
            self._in_quota_used += 1
            (self._in_qos1 if qos == 1 else self._in_qos2_new).add(packet_id)
        return new_publish(
            topic, data[pos:end], qos, bool(flags & 1), bool(flags & 0b1000), packet_id
        )

    def _handle_publish(self, packet: Publish) -> Publish | None:
        props = packet.properties
        if props.subscription_identifiers:
            raise MQTTProtocolError(R.PROTOCOL_ERROR, "a client may not send subscription ids")
        topic = packet.topic
        alias = props.topic_alias
        if alias is None and props is NO_PROPERTIES and topic in self._names_out:
            pass  # (a topic name seen valid)
        elif alias is not None:
            if not 1 <= alias <= self.topic_alias_maximum:
                raise MQTTProtocolError(
                    R.TOPIC_ALIAS_INVALID,
                    f"topic alias {alias} is not 1-{self.topic_alias_maximum}",
                )
            if topic:
                self._in_aliases[alias] = topic
            elif alias in self._in_aliases:
                topic = self._in_aliases[alias]
            else:
                raise MQTTProtocolError(R.PROTOCOL_ERROR, f"topic alias {alias} is not set")
            self._topic_checked(topic)
        else:
            self._topic_checked(topic)
            self._note_name_in(topic)
        if packet.qos > self._max_qos:
            raise MQTTProtocolError(R.QOS_NOT_SUPPORTED, f"QoS {packet.qos} is not supported")
        if packet.retain and not self._retain_available:
            raise MQTTProtocolError(R.RETAIN_NOT_SUPPORTED, "retained messages are not supported")
        packet_id = packet.packet_id
        if packet_id is not None:
            if packet.qos == 2 and packet_id in self._in_qos2_rec:
                self._send(PubRec(packet_id))  # a duplicate: received already
                return None
            if packet.qos == 2 and packet_id in self._in_qos2_new:
                return None  # a duplicate the application is answering
            if packet_id in self._in_qos1 or packet_id in self._in_qos2_rel:
                raise MQTTProtocolError(R.PROTOCOL_ERROR, f"packet id {packet_id} is in use")
            if packet_id in self._in_qos2_new or packet_id in self._in_qos2_rec:
                raise MQTTProtocolError(R.PROTOCOL_ERROR, f"packet id {packet_id} is in use")
            if self.version == MQTT_5 and self._in_quota_used >= self.receive_maximum:
                raise MQTTProtocolError(
                    R.RECEIVE_MAXIMUM_EXCEEDED,
                    f"more than {self.receive_maximum} unacknowledged QoS 1 and 2 PUBLISHes",
                )
            self._in_quota_used += 1
            (self._in_qos1 if packet.qos == 1 else self._in_qos2_new).add(packet_id)
        if topic != packet.topic:
            packet = dataclasses.replace(packet, topic=topic)
        return packet

    def _handle_pubrec(self, packet: PubRec) -> PubRec | None:
        packet_id = packet.packet_id
        if self._out_unacked.get(packet_id) == 2:
            del self._out_unacked[packet_id]
            if not packet.reason.is_error:
                self._out_released.add(packet_id)
            return packet
        if packet_id in self._out_released:
            self._send(PubRel(packet_id))  # a repeated PUBREC: release again
        else:
            self._send(PubRel(packet_id, R.PACKET_IDENTIFIER_NOT_FOUND))
        return None

    def _handle_disconnect(self, packet: Disconnect) -> Disconnect:
        assert self.connect is not None
        expiry = packet.properties.session_expiry_interval
        if expiry and not self.connect.properties.session_expiry_interval:
            raise MQTTProtocolError(
                R.PROTOCOL_ERROR, "a session expiry in DISCONNECT after none in CONNECT"
            )
        self._client_disconnect = packet.reason
        self._state = ConnectionState.CLOSED
        return packet
