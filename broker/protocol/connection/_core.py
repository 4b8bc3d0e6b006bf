"""What the jobs of a connection still layered on it share: the handle
tables (whose bindings are the per-handle state objects of
``_handle_state``), the counters, the frame decoder, and the parts the
connection owns (:class:`ConnectionCore`).

Each part has its own state, made in its own ``__init__``, and references
only the parts it is given: the output queue (``_writer``), the handshake
and liveness (``_handshake``), the messages in parts (``_parts``), the
guarantees (``_flow``), the handles (``_binds``), sessions (``_resume``),
requests (``_requests``). The public methods of those parts that are the
connection's API are thin methods here, which delegate; the hot paths of
the jobs layered on this class reach the parts' state directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .._errors import LocalProtocolError, RemoteProtocolError
from .._events import (
    DeliverManyReceived,
    DeliverReceived,
    EncodedDeliveriesReceived,
    Event,
    PublishManyReceived,
    PublishReceived,
)
from .._policy import Policy
from .._types import (
    DEFAULT_MAX_FRAME,
    Channel,
    DeliveryMode,
    HandleType,
    Role,
)
from ..frames._framing import FrameDecoder
from ..frames._messages import (
    BindTopic,
    FreeHandle,
    Hello,
    Message,
    Options,
    Stage,
    Subscribe,
    Welcome,
)
from ..guarantees._receiver import (
    ChannelReceiver,
    ChannelSender,
    ReceiverStatistics,
    SenderStatistics,
)
from ._binds import Handles
from ._flow import Flow
from ._handle_state import SubscriptionState, TopicState
from ._handles import HandleTable
from ._handshake import ConnectionState, Handshake
from ._liveness import Liveness
from ._parts import MessageParts
from ._requests import Requests
from ._resume import Sessions
from ._short_run import ShortRun
from ._writer import FrameWriter

#: The largest frame body a broker accepts before the client's Hello: what an
#: unauthenticated peer can make it buffer (``max_frame`` applies after it).
MAX_HELLO_FRAME = 16 * 1024
DEFAULT_HEARTBEAT = 5.0
DEFAULT_LEASE = 15.0


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


class ConnectionCore:
    """The state of one connection, for either role, and the look-ups and
    checks shared by every job of the connection."""

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
        #: The output queue (bytes out, and their counters).
        self._writer = FrameWriter()
        self.role = role
        #: Largest frame body this side accepts (announced in Welcome by a broker).
        self.max_frame = max_frame
        #: Largest message body this side takes in FramePart frames (0: none;
        #: a broker announces it in Welcome, a client in Hello).
        self.max_message = max_message
        #: The largest message body the peer takes in parts (0: it takes none).
        self.peer_max_message = 0
        #: Messages in parts, both ways (``_large``).
        self._parts = MessageParts()
        #: The lifecycle: its state, Hello and Welcome, keepalive timers.
        self._handshake = Handshake(role, heartbeat=heartbeat, lease=lease, now=now)
        here = role is Role.CLIENT
        #: Topic handles -> their state (the binding's value is the topic name).
        self.topics: HandleTable[TopicState] = HandleTable(
            HandleType.TOPIC, created_here=here, make=TopicState
        )
        #: Subscription handles -> their state (the value: what they subscribe to).
        self.subscriptions: HandleTable[SubscriptionState] = HandleTable(
            HandleType.SUBSCRIPTION, created_here=here, make=SubscriptionState
        )
        self.frames_received = 0
        self.bytes_received = 0
        #: Frames referencing a handle whose bind was dropped, discarded silently.
        self.discarded_frames = 0
        # A broker accepts only a small frame (the Hello) before the Hello.
        first = min(max_frame, MAX_HELLO_FRAME) if role is Role.BROKER else max_frame
        self._decoder = FrameDecoder(max_frame=first)
        #: The guarantees of every channel.
        self._flow = Flow(
            role,
            policy if policy is not None else Policy(),
            max_frame,
            handshake=self._handshake,
            writer=self._writer,
            topics=self.topics,
            subscriptions=self.subscriptions,
            parts=self._parts,
        )
        #: Binding, resolving and freeing handles.
        self._handles = Handles(
            role,
            handshake=self._handshake,
            writer=self._writer,
            flow=self._flow,
            topics=self.topics,
            subscriptions=self.subscriptions,
        )
        #: Requests and their answers (staging, offsets, administration).
        self._requests = Requests(role, handshake=self._handshake, writer=self._writer)
        #: Sessions saved and restored.
        self._sessions = Sessions(
            role,
            handshake=self._handshake,
            writer=self._writer,
            flow=self._flow,
            topics=self.topics,
            subscriptions=self.subscriptions,
        )
        #: Set by the short path of the frame just handled (see ShortRun).
        self._run: ShortRun | None = None
        #: The client reads DeliverMany frames (its Hello said so / this one's does).
        self._many = False
        #: PublishMany frames may be sent (client) / received (broker): the
        #: Hello asked for them and the Welcome allowed them.
        self._publish_many = False
        #: Broker: the peer is another worker's link, whose PublishMany frames
        #: may say whose publishes they carry (origin runs); set by the broker.
        self.accept_origins = False
        #: Client: sent publishes are kept until confirmed, for a resume
        #: (``hello(keep_unconfirmed=False)``: only counted).
        self._keep_unconfirmed = True

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

    def _require_open(self) -> None:
        self._handshake.require_open()

    def _require_role(self, role: Role, what: str) -> None:
        if self.role is not role:
            raise LocalProtocolError(f"only a {role.name.lower()} can {what}")

    def _check_open(self, message: Message) -> None:
        if self._handshake.state is not ConnectionState.OPEN:
            raise RemoteProtocolError(f"{type(message).__name__} before the handshake completed")

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

    def _on_bind_frame(
        self, message: BindTopic | Subscribe, size: int, events: list[Event]
    ) -> None:
        self._handles.on_bind_frame(message, size, events)

    def _on_free_handle(self, message: FreeHandle, size: int, events: list[Event]) -> None:
        self._handles.on_free_handle(message, size, events)

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
