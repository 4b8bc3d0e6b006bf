"""What every part of a connection shares: its state, and how to find a
channel's or a handle's state in it.

:class:`ConnectionCore` holds the whole state of one connection (the handle
tables, whose bindings are the per-handle state objects of ``_handle_state``;
the bind channels; the lifecycle; the counters) and the small checks and
look-ups every job of the connection uses. The jobs themselves (guarantees,
binds, control messages, the handshake, publish/deliver, reading frames) are
layered on it in their own modules; ``_connection`` assembles them.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from .._errors import LocalProtocolError, RemoteProtocolError
from .._policy import Policy
from .._types import (
    DEFAULT_MAX_FRAME,
    LENGTH_PREFIX,
    SUBSCRIPTION_BINDS,
    TOPIC_BINDS,
    Channel,
    ChannelKind,
    HandleType,
    Role,
)
from ..frames._framing import FrameDecoder
from ..frames._messages import BindTopic, FreeHandle, Hello, Message, Stage, Subscribe, Welcome
from ..guarantees._receiver import (
    ChannelReceiver,
    ChannelSender,
    ReceiverStatistics,
    SenderStatistics,
)
from ._handle_state import SubscriptionState, TopicState
from ._handles import HandleState, HandleTable
from ._handshake import ConnectionState, Handshake
from ._liveness import Liveness
from ._short_run import ShortRun
from ._writer import FrameWriter

#: The handle type a publish/deliver channel's index names, and back.
HANDLE_TYPE_OF_KIND: dict[int, HandleType] = {
    ChannelKind.PUBLISH: HandleType.TOPIC,
    ChannelKind.DELIVER: HandleType.SUBSCRIPTION,
}
KIND_OF_HANDLE_TYPE: dict[HandleType, int] = {
    handle_type: kind for kind, handle_type in HANDLE_TYPE_OF_KIND.items()
}
#: The channel that binds each handle type, and back.
BIND_CHANNEL = {HandleType.TOPIC: TOPIC_BINDS, HandleType.SUBSCRIPTION: SUBSCRIPTION_BINDS}
HANDLE_TYPE_OF_BIND_CHANNEL = {
    channel: handle_type for handle_type, channel in BIND_CHANNEL.items()
}

#: A Deliver may exceed ``max_frame`` by this much (its per-subscriber fields),
#: so that any Publish the broker accepted can be delivered.
DELIVER_SLACK = 32
#: The largest frame body a broker accepts before the client's Hello: what an
#: unauthenticated peer can make it buffer (``max_frame`` applies after it).
MAX_HELLO_FRAME = 16 * 1024
DEFAULT_HEARTBEAT = 5.0
DEFAULT_LEASE = 15.0


def handle_channel(handle_type: HandleType, handle: int) -> Channel:
    """The publish or deliver channel of a handle."""
    return Channel(KIND_OF_HANDLE_TYPE[handle_type], handle)


class NoGuarantees(LocalProtocolError):
    """The channel has no room for this frame now.

    Nothing was sent and nothing changed; try again after a
    :class:`GuaranteesReceived` event for the channel.
    """


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
        self.policy = policy if policy is not None else Policy()
        #: Largest frame body this side accepts (announced in Welcome by a broker).
        self.max_frame = max_frame
        #: Largest message body this side takes in FramePart frames (0: none;
        #: a broker announces it in Welcome, a client in Hello).
        self.max_message = max_message
        #: The largest message body the peer takes in parts (0: it takes none).
        self.peer_max_message = 0
        #: Messages being sent in parts, per channel (``_large.OutgoingMessage``).
        self._parts_out: dict[Channel, Any] = {}
        #: Client: a publish in parts finished by another call (``_large``).
        self._parts_done: dict[Channel, object] = {}
        #: Messages being received in parts, per channel, and their bytes.
        self._parts_in: dict[Channel, bytearray] = {}
        self._parts_held = 0
        #: Client: a publish of a larger payload may need parts (see ``_large``).
        self._plain_payload = 1 << 64
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
        #: Client: FreeHandles of resumed topics, sent once their resends are.
        #: A queue of messages, not handle state: the broker may delete the
        #: handle first (its own proposal), and still awaits the answer.
        self._frees_after_resend: dict[int, FreeHandle] = {}
        self.frames_received = 0
        self.bytes_received = 0
        #: Frames referencing a handle whose bind was dropped, discarded silently.
        self.discarded_frames = 0
        # A broker accepts only a small frame (the Hello) before the Hello.
        first = min(max_frame, MAX_HELLO_FRAME) if role is Role.BROKER else max_frame
        self._decoder = FrameDecoder(max_frame=first)
        #: The bind channels' guarantee state (the broker receives on them,
        #: the client sends); a handle's channel is in the handle's state.
        self._bind_receivers: dict[Channel, ChannelReceiver] = {}
        self._bind_senders: dict[Channel, ChannelSender] = {}
        self._pending_binds: dict[HandleType, deque[tuple[BindTopic | Subscribe, int]]] = {
            HandleType.TOPIC: deque(),
            HandleType.SUBSCRIPTION: deque(),
        }
        #: Client: the number of the last Commit or Abort sent.
        self._last_request = 0
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

    def _table(self, handle_type: HandleType | int) -> HandleTable[Any]:
        return self.topics if handle_type == HandleType.TOPIC else self.subscriptions

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

    # ---------------------------------------------------------------- channel state

    def _receiver_of(self, channel: Channel) -> ChannelReceiver | None:
        """This side's receiving state of ``channel``, if it receives on it."""
        kind = channel[0]
        if kind == ChannelKind.PUBLISH:
            topic = self.topics.bindings.get(channel[1])
            return None if topic is None else topic.receiver
        if kind == ChannelKind.DELIVER:
            subscription = self.subscriptions.bindings.get(channel[1])
            return None if subscription is None else subscription.receiver
        return self._bind_receivers.get(channel)

    def _sender_of(self, channel: Channel) -> ChannelSender | None:
        """This side's sending state of ``channel``, if it sends on it."""
        kind = channel[0]
        if kind == ChannelKind.PUBLISH:
            topic = self.topics.bindings.get(channel[1])
            return None if topic is None else topic.sender
        if kind == ChannelKind.DELIVER:
            subscription = self.subscriptions.bindings.get(channel[1])
            return None if subscription is None else subscription.sender
        return self._bind_senders.get(channel)

    def _receiver(self, channel: Channel) -> ChannelReceiver:
        receiver = self._receiver_of(channel)
        if receiver is None:
            raise LocalProtocolError(f"this side does not receive on {channel}")
        return receiver

    def _sender(self, channel: Channel) -> ChannelSender:
        sender = self._sender_of(channel)
        if sender is None:
            raise LocalProtocolError(f"this side does not send on {channel}")
        return sender

    def _all_receivers(self) -> list[ChannelReceiver]:
        """Every channel this side receives on: bind channels, then handles' channels."""
        receivers = list(self._bind_receivers.values())
        for table in (self.topics, self.subscriptions):
            receivers += [s.receiver for s in table.bindings.values() if s.receiver is not None]
        return receivers

    def _all_senders(self) -> list[ChannelSender]:
        """Every channel this side sends on: bind channels, then handles' channels."""
        senders = list(self._bind_senders.values())
        for table in (self.topics, self.subscriptions):
            senders += [s.sender for s in table.bindings.values() if s.sender is not None]
        return senders

    def receiver(self, channel: Channel) -> ChannelReceiver:
        """The receiving state of ``channel`` (read it; change it through this class)."""
        return self._receiver(channel)

    def sender(self, channel: Channel) -> ChannelSender:
        """The sending state of ``channel`` (read it; change it through this class)."""
        return self._sender(channel)

    @property
    def receiving_channels(self) -> list[Channel]:
        return [receiver.channel for receiver in self._all_receivers()]

    @property
    def sending_channels(self) -> list[Channel]:
        return [sender.channel for sender in self._all_senders()]

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
            receivers=[r.statistics() for r in self._all_receivers()],
            senders=[s.statistics() for s in self._all_senders()],
        )

    # ---------------------------------------------------------------- referencing channels

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
        sender = self._bind_senders[BIND_CHANNEL[handle_type]]
        pending = len(sender.unconfirmed) + len(sender.retransmit)
        return handle < table.next_handle - pending

    def _may_reference(self, channel: Channel) -> bool:
        """Whether this side may still send control messages about ``channel``."""
        handle_type = HANDLE_TYPE_OF_KIND.get(channel.kind)
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
        if (
            self._sender_of(channel) is not None or self._receiver_of(channel) is not None
        ) and not self._may_reference(channel):
            raise LocalProtocolError(f"{channel}: its handle is not confirmed or is being freed")

    def _issue(self, receiver: ChannelReceiver) -> None:
        """Issue what the policy allows on ``receiver``'s channel, if this
        side may reference it."""
        amount = self.policy.amount_to_issue(receiver)
        if amount > 0 and self._may_reference(receiver.channel):
            message = receiver.issue(amount)
            if message is not None:
                self._writer.queue(message)

    def _new_receiver(self, channel: Channel, capacity: int | None = None) -> ChannelReceiver:
        """A receiving state for ``channel`` (capacity: the policy's initial
        one), with its first guarantees issued. The caller keeps it."""
        deliver = channel.kind == ChannelKind.DELIVER
        # The largest frame the sender may send: a Deliver of the broker's
        # max_frame, or a frame of ours.
        largest = LENGTH_PREFIX + (
            self._writer.peer_max_frame + DELIVER_SLACK if deliver else self.max_frame
        )
        if capacity is None:
            capacity = self.policy.initial_capacity(channel)
            if deliver and self.policy.deliver_capacity is None:
                # A window smaller than the largest Deliver the broker may send
                # would never take such a message, nor any after it: stalled.
                capacity = max(capacity, largest)
        receiver = ChannelReceiver(channel, capacity)
        receiver.max_dropping = self.policy.max_dropping
        receiver.largest_frame = largest
        self._issue(receiver)
        return receiver
