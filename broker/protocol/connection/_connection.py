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

The connection owns parts, each with its own state, each referencing only
the parts it is given, never the connection (so that a connection is
never a reference cycle, and is freed as soon as it is dropped):

- ``_writer``: the output queue (:class:`FrameWriter`);
- ``_handshake``: the lifecycle (:class:`ConnectionState`), Hello and
  Welcome, keepalive (:class:`Handshake`, with its ``Liveness``);
- ``_opening``: the Hello and Welcome's effects on the other parts
  (:class:`Opening`);
- ``_flow``: the guarantees of every channel, sending within them, and
  the end of a handle's channels (:class:`Flow`);
- ``_binds``: binding, resolving and freeing handles (:class:`Handles`);
- ``_resume``: sessions saved and restored (:class:`Sessions`);
- ``_requests``: staging, offsets and admin requests (:class:`Requests`);
- ``_control``: received control messages (guarantees, Ping, Pong,
  Goodbye, Throttled) (:class:`Control`);
- ``_traffic``: publish and deliver, and their notices (:class:`Traffic`);
- ``_publish_many``: PublishMany frames (:class:`ManyPublishing`);
- ``_large``: messages in parts (:class:`LargeMessages`, on the state of
  ``_parts``, :class:`MessageParts`).

This module reads frames and dispatches each to the handler of the part
it concerns: a per-connection table of the parts' bound methods, made
once (no cycle: the parts never reference the connection). The public
methods delegate to the parts, except the hottest two, :meth:`publish`
and :meth:`deliver_encoded_many`, which are written here on the parts'
state, so that they cost no call more than before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from .._errors import LocalProtocolError, RemoteProtocolError
from .._events import (
    ConnectionClosed,
    DeliverManyReceived,
    DeliverReceived,
    EncodedDeliveriesReceived,
    Event,
    PublishManyReceived,
    PublishReceived,
)
from .._origins import OriginRun
from .._owners import Cluster
from .._policy import Policy
from .._types import (
    DEFAULT_MAX_FRAME,
    LENGTH_PREFIX,
    TOPIC_BINDS,
    U64_MAX,
    Channel,
    DeliveryMode,
    GoodbyeCode,
    HandleType,
    Role,
    SettleOutcome,
)
from ..frames._encode import deliver_heads, encode, encode_publish, publish_prefix
from ..frames._framing import FrameDecoder
from ..frames._messages import (
    Abort,
    Absolve,
    Ack,
    Admin,
    AdminAnswer,
    AdminValue,
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
    Headers,
    Hello,
    IssueGuarantee,
    LimitReceiving,
    LimitSending,
    ListOffsets,
    Matched,
    MatchedGap,
    Offsets,
    Options,
    Outcome,
    Ping,
    Plead,
    Pong,
    Publish,
    PublishMany,
    Settle,
    Stage,
    Subscribe,
    Throttled,
    Welcome,
    check_publish_fields,
)
from ..guarantees._receiver import (
    ChannelReceiver,
    ChannelSender,
)
from ._binds import Handles
from ._channels import DELIVER_SLACK, NoGuarantees
from ._control import Control
from ._core import DEFAULT_HEARTBEAT, DEFAULT_LEASE, MAX_HELLO_FRAME, ConnectionStatistics
from ._flow import Flow
from ._handle_state import SubscriptionState, TopicState
from ._handles import HandleState, HandleTable
from ._handshake import ConnectionState, Handshake, require_role
from ._large import LargeMessages
from ._liveness import Liveness
from ._opening import Opening
from ._parts import MessageParts, PartAttribute
from ._publish_many import ManyPublishing
from ._requests import Requests
from ._resume import Sessions
from ._session import BrokerSessionState, ClientSessionState
from ._short_run import ShortRun
from ._traffic import Traffic
from ._writer import MAX_REASON, PIECE_OVERHEAD, FrameWriter

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

#: A received frame's handler: a part's bound method.
_Handler = Callable[[Any, int, list[Event]], None]


class Connection:
    """The protocol state of one connection, for either role."""

    def __init__(
        self,
        role: Role,
        *,
        policy: Policy | None = None,
        max_frame: int = DEFAULT_MAX_FRAME,
        max_message: int = 0,
        heartbeat: float = DEFAULT_HEARTBEAT,
        lease: float = DEFAULT_LEASE,
        now: float = 0.0,
    ) -> None:
        self.role = role
        #: The output queue (bytes out, and their counters).
        self._writer = writer = FrameWriter()
        #: Messages in parts, both ways (``_large``).
        self._parts = parts = MessageParts()
        #: The lifecycle: its state, Hello and Welcome, keepalive timers.
        self._handshake = handshake = Handshake(role, heartbeat=heartbeat, lease=lease, now=now)
        here = role is Role.CLIENT
        #: Topic handles -> their state (the binding's value is the topic name).
        self.topics: HandleTable[TopicState] = HandleTable(
            HandleType.TOPIC, created_here=here, make=TopicState
        )
        #: Subscription handles -> their state (the value: what they subscribe to).
        self.subscriptions: HandleTable[SubscriptionState] = HandleTable(
            HandleType.SUBSCRIPTION, created_here=here, make=SubscriptionState
        )
        topics, subscriptions = self.topics, self.subscriptions
        self.frames_received = 0
        self.bytes_received = 0
        # A broker accepts only a small frame (the Hello) before the Hello.
        first = min(max_frame, MAX_HELLO_FRAME) if role is Role.BROKER else max_frame
        self._decoder = decoder = FrameDecoder(max_frame=first)
        #: The guarantees of every channel.
        self._flow = flow = Flow(
            role,
            policy if policy is not None else Policy(),
            max_frame,
            handshake=handshake,
            writer=writer,
            topics=topics,
            subscriptions=subscriptions,
            parts=parts,
        )
        #: Binding, resolving and freeing handles.
        self._handles = handles = Handles(
            role,
            handshake=handshake,
            writer=writer,
            flow=flow,
            topics=topics,
            subscriptions=subscriptions,
        )
        #: Requests and their answers (staging, offsets, administration).
        self._requests = requests = Requests(role, handshake=handshake, writer=writer)
        #: Sessions saved and restored.
        self._sessions = sessions = Sessions(
            role,
            handshake=handshake,
            writer=writer,
            flow=flow,
            topics=topics,
            subscriptions=subscriptions,
        )
        #: Received control messages.
        self._control = control = Control(
            role,
            handshake=handshake,
            writer=writer,
            flow=flow,
            handles=handles,
            topics=topics,
            subscriptions=subscriptions,
        )
        #: Messages in parts (FramePart frames), on the state of ``_parts``.
        self._large = large = LargeMessages(
            role,
            max_message,
            handshake=handshake,
            writer=writer,
            flow=flow,
            handles=handles,
            parts=parts,
            topics=topics,
        )
        #: Publish, deliver and their notices.
        self._traffic = traffic = Traffic(
            role,
            handshake=handshake,
            writer=writer,
            flow=flow,
            handles=handles,
            parts=parts,
            large=large,
            topics=topics,
            subscriptions=subscriptions,
        )
        #: PublishMany frames.
        self._many = many = ManyPublishing(
            role,
            handshake=handshake,
            writer=writer,
            flow=flow,
            handles=handles,
            traffic=traffic,
            topics=topics,
        )
        #: The Hello and Welcome's effects on the parts.
        self._opening = opening = Opening(
            max_frame=max_frame,
            handshake=handshake,
            writer=writer,
            decoder=decoder,
            flow=flow,
            sessions=sessions,
            traffic=traffic,
            many=many,
            large=large,
            parts=parts,
        )
        #: How each received message is handled: the parts' bound methods
        #: (no cycle: no part references the connection).
        self._handlers: dict[type, _Handler] = {
            Publish: traffic.on_publish,
            PublishMany: many.on_publish_many,
            Deliver: traffic.on_deliver,
            DeliverMany: traffic.on_deliver_many,
            EncodedDeliveries: traffic.on_encoded_deliveries,
            DeliverTimed: traffic.on_deliver_prefixed,
            DeliverGroup: traffic.on_deliver_prefixed,
            DeliverMatched: traffic.on_deliver_prefixed,
            Matched: traffic.on_matched,
            MatchedGap: traffic.on_matched,
            FramePart: large.on_frame_part,
            IssueGuarantee: control.on_issue_guarantee,
            Ack: traffic.on_notice,
            Settle: traffic.on_notice,
            Gap: traffic.on_notice,
            Confirm: traffic.on_notice,
            Ping: control.on_ping,
            Pong: control.on_passthrough,
            Throttled: control.on_throttled,
            Goodbye: control.on_goodbye,
            Absolve: control.on_absolve,
            Plead: control.on_plead,
            LimitSending: control.on_limit_sending,
            LimitReceiving: control.on_limit_receiving,
            AnnounceDropping: control.on_announce_dropping,
            Apologise: control.on_apologise,
            FreeHandle: handles.on_free_handle,
            BindTopic: handles.on_bind_frame,
            Subscribe: handles.on_bind_frame,
            Hello: opening.on_hello,
            Welcome: opening.on_welcome,
            Commit: requests.on_request,
            Abort: requests.on_request,
            Outcome: requests.on_request,
            ListOffsets: requests.on_request,
            Offsets: requests.on_request,
            Admin: requests.on_request,
            AdminAnswer: requests.on_request,
        }

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
        handlers = self._handlers
        traffic = self._traffic
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
                traffic.run = None
                handlers[kind](message, size, events)
                run = cast("ShortRun | None", traffic.run)  # (the handler may set it)
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

    # ---------------------------------------------------------------- lifecycle

    def data_to_send(self, now: float | None = None) -> bytes:
        """Everything queued for the peer, as one buffer (empty if nothing).

        Passing ``now`` records the moment for heartbeat bookkeeping.
        """
        writer = self._writer
        if writer.runs:
            writer.close_runs()
        if not writer.out:
            return b""
        data = writer.take_output()
        if now is not None:
            self._handshake.liveness.on_sent(now)
        return data

    def pieces_to_send(self, now: float | None = None) -> list[bytes]:
        """:meth:`data_to_send` as buffers to write in order, without copying
        large message tails into one buffer (see ``SHARED_PIECE``): what a
        writer to a peer that may not read should use. Empty if nothing."""
        writer = self._writer
        if writer.runs:
            writer.close_runs()
        if not writer.out:
            return []
        pieces = writer.take_pieces()
        if now is not None:
            self._handshake.liveness.on_sent(now)
        return pieces

    @property
    def peer_max_frame(self) -> int:
        """Largest frame body the peer accepts."""
        return self._writer.peer_max_frame

    @property
    def frames_sent(self) -> int:
        return self._writer.frames_sent

    @property
    def bytes_sent(self) -> int:
        return self._writer.bytes_sent

    @property
    def bytes_to_send(self) -> int:
        """Bytes queued for the peer that ``data_to_send`` has not returned yet."""
        return self._writer.out_size

    @property
    def memory_to_send(self) -> int:
        """An upper estimate of the memory the output queue holds (see
        :attr:`FrameWriter.memory_to_send`): bound this, not
        :attr:`bytes_to_send`, for a peer that does not read."""
        return self._writer.memory_to_send

    @property
    def state(self) -> ConnectionState:
        """Where the connection is in its life."""
        return self._handshake.state

    @property
    def liveness(self) -> Liveness:
        """The keepalive timers (heartbeat, lease)."""
        return self._handshake.liveness

    @property
    def hello_message(self) -> Hello | None:
        """The Hello sent (client) or received (broker), once it was."""
        return self._handshake.hello_message

    @property
    def welcome_message(self) -> Welcome | None:
        """The Welcome received (client) or sent (broker), once it was."""
        return self._handshake.welcome_message

    @property
    def closed(self) -> bool:
        """A Goodbye was sent or received; nothing more is processed."""
        return self._handshake.state is ConnectionState.CLOSED

    # ---------------------------------------------------------------- per-handle state

    @property
    def publishes_received(self) -> dict[int, int]:
        """Broker: per topic handle, Publish frames accepted in the session
        (resume data); a snapshot (empty on a client)."""
        if self.role is not Role.BROKER:
            return {}
        return {h: state.received for h, state in self.topics.bindings.items()}

    @property
    def processed(self) -> dict[int, int]:
        """Client: per subscription handle, the last sequence acknowledged
        (0: none yet); a snapshot (empty on a broker)."""
        if self.role is not Role.CLIENT:
            return {}
        return {h: state.processed for h, state in self.subscriptions.bindings.items()}

    def stage_of(self, topic: int) -> Stage | None:
        """Where publishes on topic handle ``topic`` are staged (None: routed at once)."""
        state = self.topics.bindings.get(topic)
        return None if state is None else state.stage

    # ---------------------------------------------------------------- handles (the Handles part)

    def bind_topic(self, name: str, stage: Stage | None = None) -> int:
        """Client: bind the next topic handle to ``name``; returns the handle.

        Publishing on it may start at once (optimistically, if the policy
        allows); the broker issues the topic's guarantees once it has
        processed the bind. With a ``stage``, the broker stages what is
        published on the handle until a :meth:`commit` of the stage's batch.
        A name that breaks the topic-name rule raises :class:`TopicNameError`
        and sends nothing.
        """
        return self._handles.bind_topic(name, stage)

    def subscribe(
        self, topic: int, mode: str = DeliveryMode.RELIABLE, options: Options | None = None
    ) -> int:
        """Client: subscribe to a confirmed topic handle; returns the subscription handle.

        The delivery channel's guarantees are issued as soon as the Subscribe
        is confirmed.
        """
        return self._handles.subscribe(topic, mode, options)

    def subscribe_pattern(
        self, pattern: str, mode: str = DeliveryMode.RELIABLE, options: Options | None = None
    ) -> int:
        """Client: subscribe to every topic ``pattern`` matches (see
        :class:`TopicPattern`), existing or created later; returns the
        subscription handle. Its deliveries come as DeliverMatched frames,
        each naming its topic through a Matched. A pattern that breaks the
        rule raises :class:`TopicPatternError` and sends nothing."""
        return self._handles.subscribe_pattern(pattern, mode, options)

    def free_handle(self, handle_type: HandleType, handle: int) -> None:
        """Propose freeing a handle; this side stops using it at once.

        A client may free only confirmed handles, and a topic handle only
        once every Publish sent on it is confirmed.
        """
        self._handles.free_handle(handle_type, handle)

    def process_binds(self) -> list[Event]:
        """Broker: process every buffered bind now (with deferred bind processing)."""
        return self._handles.process_binds()

    # ---------------------------------------------------------------- guarantees (the Flow part)

    @property
    def policy(self) -> Policy:
        """The policy that sizes and issues this side's guarantees."""
        return self._flow.policy

    def receiver(self, channel: Channel) -> ChannelReceiver:
        """The receiving state of ``channel`` (read it; change it through this class)."""
        return self._flow.receiver(channel)

    def sender(self, channel: Channel) -> ChannelSender:
        """The sending state of ``channel`` (read it; change it through this class)."""
        return self._flow.sender(channel)

    @property
    def receiving_channels(self) -> list[Channel]:
        return [receiver.channel for receiver in self._flow.all_receivers()]

    @property
    def sending_channels(self) -> list[Channel]:
        return [sender.channel for sender in self._flow.all_senders()]

    def confirmed(self, handle_type: HandleType, handle: int) -> bool:
        """Client: the bind of ``handle`` is known to be processed by the broker.

        Only confirmed handles may be referenced in control messages (and in
        Subscribe); Publish may reference a handle optimistically.
        """
        return self._flow.confirmed(handle_type, handle)

    def may_reference(self, channel: Channel) -> bool:
        """Whether this side may still send control messages about ``channel``
        (``confirm``, ``throttled``, guarantees): the connection is open and
        the channel's handle is confirmed and not being freed."""
        return self._flow.may_reference(channel)

    def issue_guarantees(self, channel: Channel | None = None) -> None:
        """Issue what the policy allows on ``channel`` (default: every channel).

        Call it when a policy answer changes, e.g. when an account that
        withheld a channel's guarantees falls below its watermark.
        """
        self._flow.issue_guarantees(channel)

    def grow(self, channel: Channel, amount: int) -> None:
        """Add buffer capacity to a receiving channel (issued per policy)."""
        self._flow.grow(channel, amount)

    def set_capacity(self, channel: Channel, target: int, *, plead: bool | None = None) -> None:
        """Resize a receiving channel's buffer.

        Growing issues per policy. Shrinking reclaims unpromised space at
        once, then processed frames, and (with ``plead``, by default the
        policy's ``plead_on_shrink``) asks the sender to absolve what neither
        can reclaim.
        """
        self._flow.set_capacity(channel, target, plead=plead)

    def plead(self, channel: Channel, target: int) -> None:
        """Ask the sender of ``channel`` to keep only ``target`` bytes of guarantees."""
        self._flow.plead(channel, target)

    def limit_receiving(self, channel: Channel, bound: int) -> None:
        """Promise to issue at most ``bound`` more guarantee bytes on ``channel``."""
        self._flow.limit_receiving(channel, bound)

    def release(
        self,
        event: PublishReceived
        | PublishManyReceived
        | DeliverReceived
        | DeliverManyReceived
        | EncodedDeliveriesReceived,
    ) -> list[Event]:
        """A received Publish, Deliver or DeliverMany has been processed
        (all of a DeliverMany's entries): free its buffer space.

        Returns the events this causes: a :class:`HandleDeleted` when the
        frame was the last reference to a handle being freed.
        """
        return self._flow.release(event)

    def release_frame(self, channel: Channel, size: int) -> list[Event]:
        """Free ``size`` bytes of a processed frame on ``channel``; see :meth:`release`."""
        return self._flow.release_frames(channel, size, 1)

    def release_frames(self, channel: Channel, size: int, count: int) -> list[Event]:
        """Free ``count`` processed frames of ``size`` bytes in all on ``channel``.

        The same as releasing each frame in turn (:meth:`release_frame`),
        with guarantees issued once for the lot. A DeliverMany counts as one
        frame per entry here (each entry references its subscription).
        """
        return self._flow.release_frames(channel, size, count)

    def limit_sending(self, channel: Channel, bound: int) -> None:
        """Promise to send (or absolve) at most ``bound`` more bytes on ``channel``."""
        self._flow.limit_sending(channel, bound)

    def absolve(self, channel: Channel, amount: int) -> None:
        """Give back ``amount`` bytes of guarantees on ``channel``."""
        self._flow.absolve(channel, amount)

    def room(self, channel: Channel) -> int:
        """The largest frame this side may send on ``channel`` now."""
        return self._flow.room(channel)

    def statistics(self) -> ConnectionStatistics:
        """Counters, per-channel state and handle counts, for metrics."""
        return ConnectionStatistics(
            role=self.role,
            state=self._handshake.state,
            frames_received=self.frames_received,
            bytes_received=self.bytes_received,
            frames_sent=self._writer.frames_sent,
            bytes_sent=self._writer.bytes_sent,
            discarded_frames=self.discarded_frames,
            topics_bound=len(self.topics),
            subscriptions_bound=len(self.subscriptions),
            receivers=[r.statistics() for r in self._flow.all_receivers()],
            senders=[s.statistics() for s in self._flow.all_senders()],
        )

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
        self._opening.hello(
            client,
            session=session,
            processed=processed,
            token=token,
            resume=resume,
            deliver_many=deliver_many,
            metadata=metadata,
            encoded_deliveries=encoded_deliveries,
            publish_many=publish_many,
            keep_unconfirmed=keep_unconfirmed,
        )

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
        self._opening.welcome(
            session=session,
            epoch=epoch,
            resumed=resumed,
            lease_ms=lease_ms,
            heartbeat_ms=heartbeat_ms,
            received=received,
            restore=restore,
            offsets=offsets,
            cluster=cluster,
        )

    def session_state(self) -> BrokerSessionState | ClientSessionState:
        """What this side must keep of the session to resume it on a new
        connection (a broker: its live handles and publish counts; a client:
        its handles, processed sequence numbers and unconfirmed publishes).

        Valid at any time after the handshake, the connection closed or not.
        Handles being freed are left out (a client keeps topic handles it
        proposed to free, and proposes again on resume). A broker that defers
        bind processing calls :meth:`process_binds` first.
        """
        return self._sessions.session_state(keep_unconfirmed=self._traffic.keep_unconfirmed)

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

    # ---------------------------------------------------------------- settings, counters

    #: Largest frame body this side accepts (announced in Welcome by a broker).
    max_frame = PartAttribute[int]("_opening", "max_frame")
    #: Largest message body this side takes in FramePart frames (0: none;
    #: a broker announces it in Welcome, a client in Hello).
    max_message = PartAttribute[int]("_large", "max_message")
    #: Broker: the peer is another worker's link, whose PublishMany frames
    #: may say whose publishes they carry (origin runs); set by the broker.
    accept_origins = PartAttribute[bool]("_many", "accept_origins")

    @property
    def peer_max_message(self) -> int:
        """The largest message body the peer takes in parts (0: it takes none)."""
        return self._large.peer_max_message

    @property
    def discarded_frames(self) -> int:
        """Frames referencing a handle whose bind was dropped, discarded silently."""
        return (
            self._traffic.discarded_frames
            + self._many.discarded_frames
            + self._large.discarded_frames
        )

    @property
    def publish_many(self) -> bool:
        """Client: the Welcome allowed PublishMany frames (broker: the Hello
        asked for them and the Welcome said so)."""
        return self._many.allowed

    @property
    def reassembling(self) -> int:
        """Bytes of messages received in part, not whole yet."""
        return self._parts.held

    # ---------------------------------------------------------------- publish, deliver (Traffic)

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
            require_role(self.role, Role.CLIENT, "publish")
        if self._handshake.state is not ConnectionState.OPEN:
            self._handshake.require_open()
        state = self.topics.bindings.get(topic)
        if state is None or state.state is not HandleState.BOUND or state.sender is None:
            self.topics.resolve_local(topic)  # says what is wrong
            raise LocalProtocolError(f"this side does not send on topic handle {topic}")
        sender = state.sender
        if self._parts.out or (type(payload) is bytes and len(payload) > self._parts.plain_payload):
            size = self._large.publish_in_parts(state, sender, payload, key, headers)
            if size is not None:
                return size
        writer = self._writer
        if (
            headers is None
            and type(payload) is bytes
            and (key is None or type(key) is bytes)
            and type(topic) is int
        ):
            frame = encode_publish(topic, payload, key, max_frame=writer.peer_max_frame)
        else:
            check_publish_fields(payload, key, headers)
            frame = encode(Publish(topic, payload, key, headers), max_frame=writer.peer_max_frame)
        size = len(frame)
        if not self._flow.bind_senders[TOPIC_BINDS].retransmit and sender.send_guaranteed(size):
            # The usual case, in short: within the guarantees, in the topic's run.
            run = writer.runs.get(topic)
            if run is None:
                writer.runs[topic] = [frame]
            else:
                run.append(frame)
            writer.frames_sent += 1
            writer.bytes_sent += size
            writer.out_size += size
        else:
            self._flow.send_frame(sender, Publish(topic, payload, key, headers), frame)
        if self._traffic.keep_unconfirmed:
            state.retain(frame)  # to be sent again on a resume, until confirmed
        else:
            state.unkept += 1
        return size

    def publish_tails(self, topic: int, tails: list[bytes], start: int = 0) -> int:
        """Client: :meth:`publish` of the messages whose payload, key and
        headers are ``tails[start:]``, Deliver tails
        (:func:`encode_deliver_tail`), without decoding them, in order and
        as far as the guarantees go; returns how many were sent (fewer than
        asked when the channel ran out of room: the rest were not sent).
        Raises as :meth:`publish`, except that running out of room ends the
        run instead of raising :class:`NoGuarantees`; a tail too large for
        the peer's ``max_frame`` ends the run before it, and raises
        :class:`LocalProtocolError` when it comes first.

        (The checks and fast path are :meth:`publish`'s, repeated rather than
        shared: ``publish`` is the clients' hottest call, kept free of an
        extra call per message; here they are paid once per run.)"""
        return self._traffic.publish_tails(topic, tails, start)

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
        return self._traffic.deliver(subscription, seq, payload, key=key, headers=headers)

    def deliver_encoded(self, subscription: int, seq: int, tail: bytes) -> int:
        """Broker: :meth:`deliver` with the shared part pre-encoded once per publish.

        ``tail`` comes from :func:`encode_deliver_tail`; only a few bytes are
        encoded per subscriber.
        """
        return self._traffic.deliver_encoded(subscription, seq, tail)

    def deliver_encoded_many(self, subscription: int, first_seq: int, tails: list[bytes]) -> int:
        """Broker: :meth:`deliver_encoded` for ``tails`` with consecutive
        sequence numbers from ``first_seq``, as many as the subscriber's
        guarantees allow, in order; returns how many were queued (0 if none
        fits). Raises :class:`LocalProtocolError` if the first frame could
        never be sent (larger than the peer's ``max_frame``); a later one
        ends the batch before it, and raises on the next call.
        """
        traffic = self._traffic
        sender = traffic.delivery_sender(subscription)
        if first_seq < 0 or first_seq + len(tails) - 1 > U64_MAX:
            raise LocalProtocolError("seq must be u64")
        if traffic.many and len(tails) > 1:
            return traffic.deliver_in_many(sender, subscription, first_seq, tails)
        room = self._flow.room_of(sender)
        limit = self._writer.peer_max_frame + LENGTH_PREFIX
        seq = first_seq
        total = 0
        put = self._writer.out.append
        for head, tail in zip(deliver_heads(subscription, first_seq, tails), tails, strict=True):
            size = len(head) + len(tail)
            if size > room or size > limit:
                if size > limit and seq == first_seq:
                    taken = self._large.deliver_large(sender, seq, [head, tail])
                    return taken and 1 + self.deliver_encoded_many(subscription, seq + 1, tails[1:])
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
            self._writer.count(count, total)
        return count

    def deliver_timed(
        self, subscription: int, first_seq: int, tails: list[bytes], times: list[int]
    ) -> int:
        """Broker: :meth:`deliver_encoded_many` with each record's receive
        time (``times[i]``, ms since the epoch, for ``tails[i]``), as
        DeliverTimed frames (one entry or many, whatever the client's Hello
        said): for a subscription whose Subscribe asked for ``"timestamps"``.
        Returns how many were queued (0 if none fits); raises
        :class:`LocalProtocolError` if the first could never be sent."""
        return self._traffic.deliver_timed(subscription, first_seq, tails, times)

    def deliver_group(
        self,
        subscription: int,
        first_seq: int,
        tails: list[bytes],
        offsets: list[int],
        delivered: list[int],
    ) -> int:
        """Broker: :meth:`deliver_encoded_many` for a group subscription,
        each delivery with its record's topic offset (``offsets[i]`` for
        ``tails[i]``) and how many times that record was delivered before
        (``delivered[i]``, 0 the first time), as DeliverGroup frames (one
        entry or many, whatever the client's Hello said); ``first_seq + i``
        is the delivery number a Settle names ``tails[i]`` by. Returns how
        many were queued (0 if none fits); raises
        :class:`LocalProtocolError` if the first could never be sent."""
        return self._traffic.deliver_group(subscription, first_seq, tails, offsets, delivered)

    def deliver_matched(
        self,
        subscription: int,
        first_seq: int,
        tails: list[bytes],
        match: int,
        first_offset: int,
    ) -> int:
        """Broker: :meth:`deliver_encoded_many` for a pattern subscription:
        records of the topic matched as ``match`` (see :meth:`matched`),
        numbered ``first_offset`` on in that topic, as DeliverMatched frames
        numbered ``first_seq`` on (what an Ack names). Returns how many were
        queued (0 if none fits); raises :class:`LocalProtocolError` if the
        first could never be sent."""
        return self._traffic.deliver_matched(subscription, first_seq, tails, match, first_offset)

    def matched(self, subscription: int, match: int, topic: str | None) -> None:
        """Broker: on pattern subscription ``subscription``, match index
        ``match`` is topic ``topic`` (None: that topic was deleted)."""
        self._traffic.matched(subscription, match, topic)

    def matched_gap(self, subscription: int, match: int, first: int, count: int) -> None:
        """Broker: on pattern subscription ``subscription``, ``count``
        records of match ``match`` from offset ``first`` were dropped."""
        self._traffic.matched_gap(subscription, match, first, count)

    def ack(self, subscription: int, seq: int) -> None:
        """Client: everything up to ``seq`` on ``subscription`` is processed."""
        self._traffic.ack(subscription, seq)

    def settle(
        self,
        subscription: int,
        outcome: SettleOutcome,
        ranges: list[tuple[int, int]],
        detail: int | str | None = None,
    ) -> None:
        """Client: say what became of the deliveries ``ranges`` names on a
        group subscription (ascending, non-overlapping ``(first, count)``
        pairs of delivery numbers, see :func:`settle_ranges`): ``detail`` is
        the delay in ms before a RETRY, the reason of a REJECT (at most 1024
        bytes of UTF-8), else None. Queued at once, like :meth:`ack`.
        Raises :class:`LocalProtocolError` (nothing sent) for anything the
        broker would refuse, or a frame larger than the broker's
        ``max_frame`` (see :func:`max_settle_ranges`)."""
        self._traffic.settle(subscription, outcome, ranges, detail)

    def gap(self, subscription: int, first_seq: int, count: int) -> None:
        """Broker: tell the subscriber ``count`` deliveries from ``first_seq`` were dropped."""
        self._traffic.gap(subscription, first_seq, count)

    def confirm(self, topic: int, count: int) -> None:
        """Broker: ``count`` publishes on ``topic`` are fully routed (cumulative)."""
        self._traffic.confirm(topic, count)

    # ---------------------------------------------------------------- PublishMany, in parts

    def publish_many_tails(
        self,
        topic: int,
        tails: list[bytes],
        start: int = 0,
        origins: list[OriginRun] | None = None,
    ) -> int:
        """Client: :meth:`publish_tails`, but as few PublishMany frames as the
        guarantees and the peer's ``max_frame`` allow, where the Welcome
        allowed them (else, or when the channel is not plainly within its
        guarantees, as :meth:`publish_tails` sends them); returns how many
        were sent, in order.

        A worker's link passes ``origins``, the runs of ``tails`` (see
        :mod:`._origins`): each frame then carries those of its entries.
        Publishes sent as Publish frames carry none."""
        return self._many.publish_many_tails(topic, tails, start, origins)

    def publish_large(
        self,
        state: TopicState,
        sender: ChannelSender,
        payload: bytes,
        key: bytes | None,
        headers: Headers | None,
    ) -> int:
        """Client: :meth:`publish` of a message too large for one frame, in
        parts. Raises :class:`NoGuarantees` until its last part is sent (call
        again with the same ``payload`` object to go on); a publish of another
        message on the handle meanwhile sends the first one's parts first."""
        return self._large.publish_large(state, sender, payload, key, headers)

    def publish_tail_in_parts(self, topic: int, tail: bytes) -> bool:
        """Client: the publish whose Deliver tail (:func:`encode_deliver_tail`)
        is ``tail``, too large for one frame, in parts: True once its last
        part is sent, False while it (or one begun before it on the handle)
        waits for room; call again with the same ``tail`` object. (A worker's
        link passes a publish on so, without its origin.)"""
        return self._large.publish_tail_in_parts(topic, tail)

    # ---------------------------------------------------------------- control, requests

    def throttled(self, channel: Channel, throttled: bool) -> None:
        """Broker: advise the client that ``channel`` is (no longer) withheld.

        Refused (:class:`LocalProtocolError`, nothing sent) for the channel of
        a topic handle being freed: the client may have deleted it already.
        """
        self._control.throttled(channel, throttled)

    def commit(self, batch: str, members: list[tuple[str, int]]) -> int:
        """Client: ask the broker to make the listed members of ``batch``
        visible, each with the number of publishes it staged, and to discard
        the batch's other members; returns the request number its
        :class:`Outcome` will carry."""
        return self._requests.commit(batch, members)

    def abort(self, batch: str) -> int:
        """Client: ask the broker to discard everything staged in ``batch``;
        returns the request number its :class:`Outcome` will carry."""
        return self._requests.abort(batch)

    def outcome(self, request: int, status: int, messages: int, reason: str = "") -> None:
        """Broker: answer Commit or Abort number ``request``."""
        self._requests.outcome(request, status, messages, reason)

    def list_offsets(self, topics: list[str] | None = None) -> int:
        """Client: ask for the first and next offsets of ``topics`` (None: of
        every topic with a log the client may subscribe to); returns the
        request number its :class:`Offsets` will carry."""
        return self._requests.list_offsets(topics)

    def offsets(self, request: int, topics: list[tuple[str, int, int]], reason: str = "") -> None:
        """Broker: answer ListOffsets number ``request``."""
        self._requests.offsets(request, topics, reason)

    def admin(self, command: str, arguments: dict[str, AdminValue] | None = None) -> int:
        """Client: ask for topic administration ``command`` (see the protocol
        document); returns the request number its :class:`AdminAnswer` will
        carry."""
        return self._requests.admin(command, arguments)

    def admin_answer(
        self,
        request: int,
        status: int,
        rows: list[dict[str, AdminValue]],
        after: str | None = None,
        reason: str = "",
    ) -> None:
        """Broker: answer Admin number ``request``."""
        self._requests.admin_answer(request, status, rows, after, reason)
