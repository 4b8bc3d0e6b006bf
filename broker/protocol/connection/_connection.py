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

The connection owns parts, each with its own state and referencing none
of the parts that own it:

- ``_writer``: the output queue (:class:`FrameWriter`);
- ``_handshake``: the lifecycle (:class:`ConnectionState`), Hello and
  Welcome, keepalive (:class:`Handshake`, with its ``Liveness``); the
  connection queues what it makes and applies what it settled;
- ``_flow``: the guarantees of every channel, sending within them, and
  the end of a handle's channels (:class:`Flow`);
- ``_binds``: binding, resolving and freeing handles (:class:`Handles`);
- ``_resume``: sessions saved and restored (:class:`Sessions`);
- ``_requests``: staging, offsets and admin requests (:class:`Requests`);
- ``_parts``: the state of messages in parts (:class:`MessageParts`).

The rest of its jobs are still layered on ``_core`` (the handle tables and
counters, which the parts are given, and the thin public methods that
delegate to the parts; per-handle state lives in one object per handle,
``_handle_state``), one module per job:

- ``_control``: received control messages;
- ``_traffic``, ``_publish_many``, ``_large``: publish and deliver, and
  their notices;
- this module: reading frames and dispatching each to its handler, and
  the handshake's effects on the connection.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from .._errors import LocalProtocolError, RemoteProtocolError
from .._events import ConnectionClosed, Event, HelloReceived, WelcomeReceived
from .._owners import Cluster
from .._types import SUBSCRIPTION_BINDS, TOPIC_BINDS, GoodbyeCode
from ..frames._encode import publish_prefix
from ..frames._messages import (
    Abort,
    Absolve,
    Ack,
    Admin,
    AdminAnswer,
    AnnounceDropping,
    Apologise,
    BindTopic,
    Commit,
    Confirm,
    Deliver,
    DeliverGroup,
    DeliverMany,
    DeliverMatched,
    DeliverTimed,
    EncodedDeliveries,
    FramePart,
    FreeHandle,
    Gap,
    Goodbye,
    Hello,
    IssueGuarantee,
    LimitReceiving,
    LimitSending,
    ListOffsets,
    Matched,
    MatchedGap,
    Offsets,
    Outcome,
    Ping,
    Plead,
    Pong,
    Publish,
    PublishMany,
    Settle,
    Subscribe,
    Throttled,
    Welcome,
)
from ..guarantees._receiver import ChannelSender
from ._channels import DELIVER_SLACK, NoGuarantees
from ._control import ControlHandling
from ._core import MAX_HELLO_FRAME, ConnectionStatistics
from ._handshake import ConnectionState
from ._large import LargeMessages
from ._publish_many import ManyPublishing
from ._session import BrokerSessionState, ClientSessionState
from ._short_run import ShortRun
from ._writer import MAX_REASON, PIECE_OVERHEAD

__all__ = [
    "DELIVER_SLACK",
    "MAX_HELLO_FRAME",
    "MAX_REASON",
    "PIECE_OVERHEAD",
    "Connection",
    "ConnectionState",
    "ConnectionStatistics",
    "NoGuarantees",
]


class Connection(ManyPublishing, LargeMessages, ControlHandling):
    """The protocol state of one connection, for either role."""

    def receive_data(
        self,
        data: bytes | bytearray | memoryview,
        now: float,
        *,
        max_frames: int | None = None,
    ) -> list[Event]:
        """Process bytes from the peer; returns what happened, in order.

        With ``max_frames``, at most that many frames are handled; the rest
        stay buffered (:attr:`frames_waiting`) for the next call, which may
        pass no new bytes: so that a caller can bound the work of one turn
        whatever a read brought (a read of tiny frames holds thousands). A
        run of Publish frames on one handle that began within the limit is
        finished past it, up to ``max_frames`` frames of its own (at most
        ``2 * max_frames - 1`` in all): so the broker appends it as one batch.

        A protocol violation ends the list with :class:`ConnectionClosed`
        (with ``error`` set) after queueing a ``Goodbye``; frames before the
        bad one stay applied, the bad one changes nothing.
        """
        if self._handshake.state is ConnectionState.CLOSED:
            return []
        if self._handshake.state is ConnectionState.IDLE:
            raise LocalProtocolError("call hello() before receiving data")
        events: list[Event] = []
        self._decoder.feed(data)
        if data:
            self._handshake.liveness.on_received(now)
        handlers = _HANDLERS
        closed = ConnectionState.CLOSED
        frames = received = 0
        run: ShortRun | None = None
        decoder = self._decoder
        handshake = self._handshake
        try:
            for message, size in decoder.messages(max_frames):
                frames += 1
                received += size
                kind = type(message)
                if run is not None and kind is run.kind and run.take(message, size, events):
                    continue
                self._run = None
                handlers[kind](self, message, size, events)
                run = cast("ShortRun | None", self._run)  # (the handler may set it)
                if max_frames is not None:
                    # A run of publishes begun within the limit may go past
                    # it, up to ``max_frames`` of its own: one batch for the
                    # broker, not two (a cut run costs a second batch).
                    decoder.extend = (
                        None
                        if run is None or run.topic is None or frames > max_frames
                        else (publish_prefix(run.handle), frames - 1 + max_frames)
                    )
                if handshake.state is closed:
                    break
        except RemoteProtocolError as error:
            reason = self._writer.queue_goodbye(int(error.code), error.reason)
            self._handshake.close()
            events.append(ConnectionClosed(int(error.code), reason, False, error))
        finally:
            decoder.extend = None
            self.frames_received += frames
            self.bytes_received += received
        return events

    @property
    def frames_waiting(self) -> bool:
        """Whole frames received are still to be handled (``receive_data``
        stopped at its ``max_frames``): call it again, with or without new
        bytes."""
        return self._handshake.state is not ConnectionState.CLOSED and self._decoder.frame_ready

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
        message = self._handshake.hello(
            client,
            session=session,
            processed=processed,
            token=token,
            resume=resume,
            deliver_many=deliver_many,
            metadata=metadata,
            publish_many=publish_many,
            max_message=self.max_message,
        )
        self._writer.queue(message)
        self._many = deliver_many
        self._keep_unconfirmed = keep_unconfirmed
        self._decoder.encoded_deliveries = deliver_many and encoded_deliveries

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
        message = self._handshake.welcome(
            session=session,
            epoch=epoch,
            resumed=resumed,
            lease_ms=lease_ms,
            heartbeat_ms=heartbeat_ms,
            received=received,
            restore=restore,
            offsets=offsets,
            cluster=cluster,
            max_frame=self.max_frame,
            max_message=self.max_message,
        )
        self._writer.queue(message)
        self._publish_many = message.publish_many
        self._writer.peer_max_frame = self.max_frame + DELIVER_SLACK
        if message.max_message:
            hello = self._handshake.hello_message
            assert hello is not None
            self.peer_max_message = hello.max_message
        if restore is not None:
            self._sessions.restore_broker(restore)
            return
        for channel in (TOPIC_BINDS, SUBSCRIPTION_BINDS):
            self._flow.bind_receivers[channel] = self._flow.new_receiver(channel)

    def _on_hello(self, message: Hello, size: int, events: list[Event]) -> None:
        self._handshake.on_hello(message)
        self._many = message.deliver_many
        self._decoder.max_frame = self.max_frame
        events.append(HelloReceived(message))

    def _on_welcome(self, message: Welcome, size: int, events: list[Event]) -> None:
        resume = self._handshake.on_welcome(message)  # (a refused Welcome changes nothing)
        hello = self._handshake.hello_message
        self._publish_many = message.publish_many and hello is not None and hello.publish_many
        self._writer.peer_max_frame = message.max_frame
        self.peer_max_message = message.max_message if self.max_message else 0
        if self.peer_max_message:
            self._parts.plain_payload = message.max_frame - 64
        self._decoder.max_frame = max(self.max_frame, message.max_frame + DELIVER_SLACK)
        for channel in (TOPIC_BINDS, SUBSCRIPTION_BINDS):
            self._flow.bind_senders[channel] = ChannelSender(channel)
        resent = 0
        dropped: list[Event] = []
        if resume is not None:
            resent = self._sessions.restore_client(resume, message, dropped)
        events.append(WelcomeReceived(message, resent))
        events += dropped

    def session_state(self) -> BrokerSessionState | ClientSessionState:
        """What this side must keep of the session to resume it on a new
        connection (a broker: its live handles and publish counts; a client:
        its handles, processed sequence numbers and unconfirmed publishes).

        Valid at any time after the handshake, the connection closed or not.
        Handles being freed are left out (a client keeps topic handles it
        proposed to free, and proposes again on resume). A broker that defers
        bind processing calls :meth:`process_binds` first.
        """
        return self._sessions.session_state(keep_unconfirmed=self._keep_unconfirmed)

    # ---------------------------------------------------------------- keepalive

    def ping(self) -> int:
        """Queue a Ping; returns its nonce (the Pong event carries it back)."""
        message = self._handshake.ping()
        self._writer.queue(message)
        return message.nonce

    def ping_due(self, now: float) -> bool:
        """This side has sent nothing for a heartbeat interval."""
        return self._handshake.liveness.ping_due(now)

    def peer_gone(self, now: float) -> bool:
        """The peer has been silent for its whole lease."""
        return self._handshake.liveness.peer_gone(now)

    def next_deadline(self) -> float:
        """When to call :meth:`handle_timer` next."""
        return self._handshake.liveness.next_deadline()

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
        handshake = self._handshake
        if handshake.state is ConnectionState.CLOSED:
            return []
        reason = handshake.lease_expired(now)
        if reason is not None:
            code = int(GoodbyeCode.LEASE_EXPIRED)
            reason = self._writer.queue_goodbye(code, reason)
            handshake.close()
            return [ConnectionClosed(code, reason, False)]
        if handshake.liveness.ping_due(now):
            if handshake.state is ConnectionState.OPEN:
                self.ping()
            handshake.liveness.on_sent(now)
        return []

    def suspend_reading(self, now: float) -> None:
        """This side stopped reading (e.g. its account is in debt): the peer's
        silence from ``now`` on does not count against its lease."""
        self._handshake.liveness.suspend(now)

    def resume_reading(self, now: float) -> None:
        """This side reads again; the time spent suspended is forgiven."""
        self._handshake.liveness.resume(now)

    # ---------------------------------------------------------------- closing

    def goodbye(self, code: GoodbyeCode | int = GoodbyeCode.NORMAL, reason: str = "") -> None:
        """Queue a Goodbye and close; received data is ignored from now on."""
        if self._handshake.state is ConnectionState.CLOSED:
            return
        self._writer.queue_goodbye(int(code), reason)
        self._handshake.close()


#: How each received message is handled: unbound, as a per-connection table of
#: bound methods would make every connection a cycle only the collector frees.
_HANDLERS: dict[type, Callable[[Connection, Any, int, list[Event]], None]] = {
    Publish: Connection._on_publish,
    PublishMany: Connection._on_publish_many,
    Deliver: Connection._on_deliver,
    DeliverMany: Connection._on_deliver_many,
    EncodedDeliveries: Connection._on_encoded_deliveries,
    DeliverTimed: Connection._on_deliver_prefixed,
    DeliverGroup: Connection._on_deliver_prefixed,
    DeliverMatched: Connection._on_deliver_prefixed,
    Matched: Connection._on_matched,
    MatchedGap: Connection._on_matched,
    FramePart: Connection._on_frame_part,
    IssueGuarantee: Connection._on_issue_guarantee,
    Ack: Connection._on_notice,
    Settle: Connection._on_notice,
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
    ListOffsets: Connection._on_staging_notice,
    Offsets: Connection._on_staging_notice,
    Admin: Connection._on_staging_notice,
    AdminAnswer: Connection._on_staging_notice,
}
