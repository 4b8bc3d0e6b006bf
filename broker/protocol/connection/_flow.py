"""Guarantees: the flow of every channel of a connection, as a part.

:class:`Flow` owns the bind channels' guarantee state (a handle's channel
state lives in the handle's state, in the handle tables it is given), and
does everything a connection does to its channels' buffers and promises:
issuing, growing, shrinking, pleading, releasing; sending a channel frame
within the guarantees (or beyond, as optimism allows) and sending again
what was dropped; and what happens to a handle's channels when the handle
goes away. It references the parts it needs (the handshake's state, the
output queue, the handle tables, the messages in parts), none of which
references it.

Control messages *received* about guarantees are handled by the connection
(``_control``), which resolves their handles first.
"""

from __future__ import annotations

from typing import Any

from .._errors import LocalProtocolError
from .._events import (
    DeliverManyReceived,
    DeliverReceived,
    EncodedDeliveriesReceived,
    Event,
    FramesAbandoned,
    HandleDeleted,
    PublishManyReceived,
    PublishReceived,
)
from .._policy import Policy
from .._types import (
    LENGTH_PREFIX,
    OPTIMISM_FRAMES,
    TOPIC_BINDS,
    Channel,
    ChannelKind,
    HandleType,
    Role,
)
from ..frames._encode import encode
from ..frames._messages import FreeHandle
from ..guarantees._receiver import ChannelReceiver, ChannelSender, SentFrame
from ._channels import (
    BIND_CHANNEL,
    DELIVER_SLACK,
    HANDLE_TYPE_OF_BIND_CHANNEL,
    HANDLE_TYPE_OF_KIND,
    NoGuarantees,
    handle_channel,
)
from ._handle_state import SubscriptionState, TopicState
from ._handles import HandleState, HandleTable
from ._handshake import ConnectionState, Handshake
from ._parts import MessageParts
from ._writer import FrameWriter


class Flow:
    """The guarantees of one connection's channels (see the module)."""

    def __init__(
        self,
        role: Role,
        policy: Policy,
        max_frame: int,
        *,
        handshake: Handshake,
        writer: FrameWriter,
        topics: HandleTable[TopicState],
        subscriptions: HandleTable[SubscriptionState],
        parts: MessageParts,
    ) -> None:
        self.role = role
        self.policy = policy
        #: Largest frame body this side accepts.
        self.max_frame = max_frame
        self._handshake = handshake
        self._writer = writer
        self.topics = topics
        self.subscriptions = subscriptions
        self._parts = parts
        #: The bind channels' guarantee state (the broker receives on them,
        #: the client sends); a handle's channel is in the handle's state.
        self.bind_receivers: dict[Channel, ChannelReceiver] = {}
        self.bind_senders: dict[Channel, ChannelSender] = {}
        #: Client: FreeHandles of resumed topics, sent once their resends are.
        #: A queue of messages, not handle state: the broker may delete the
        #: handle first (its own proposal), and still awaits the answer.
        self.frees_after_resend: dict[int, FreeHandle] = {}

    def table(self, handle_type: HandleType | int) -> HandleTable[Any]:
        return self.topics if handle_type == HandleType.TOPIC else self.subscriptions

    # ---------------------------------------------------------------- channel state

    def receiver_of(self, channel: Channel) -> ChannelReceiver | None:
        """This side's receiving state of ``channel``, if it receives on it."""
        kind = channel[0]
        if kind == ChannelKind.PUBLISH:
            topic = self.topics.bindings.get(channel[1])
            return None if topic is None else topic.receiver
        if kind == ChannelKind.DELIVER:
            subscription = self.subscriptions.bindings.get(channel[1])
            return None if subscription is None else subscription.receiver
        return self.bind_receivers.get(channel)

    def sender_of(self, channel: Channel) -> ChannelSender | None:
        """This side's sending state of ``channel``, if it sends on it."""
        kind = channel[0]
        if kind == ChannelKind.PUBLISH:
            topic = self.topics.bindings.get(channel[1])
            return None if topic is None else topic.sender
        if kind == ChannelKind.DELIVER:
            subscription = self.subscriptions.bindings.get(channel[1])
            return None if subscription is None else subscription.sender
        return self.bind_senders.get(channel)

    def receiver(self, channel: Channel) -> ChannelReceiver:
        receiver = self.receiver_of(channel)
        if receiver is None:
            raise LocalProtocolError(f"this side does not receive on {channel}")
        return receiver

    def sender(self, channel: Channel) -> ChannelSender:
        sender = self.sender_of(channel)
        if sender is None:
            raise LocalProtocolError(f"this side does not send on {channel}")
        return sender

    def all_receivers(self) -> list[ChannelReceiver]:
        """Every channel this side receives on: bind channels, then handles' channels."""
        receivers = list(self.bind_receivers.values())
        for table in (self.topics, self.subscriptions):
            receivers += [s.receiver for s in table.bindings.values() if s.receiver is not None]
        return receivers

    def all_senders(self) -> list[ChannelSender]:
        """Every channel this side sends on: bind channels, then handles' channels."""
        senders = list(self.bind_senders.values())
        for table in (self.topics, self.subscriptions):
            senders += [s.sender for s in table.bindings.values() if s.sender is not None]
        return senders

    # ---------------------------------------------------------------- referencing channels

    def confirmed(self, handle_type: HandleType, handle: int) -> bool:
        """See :meth:`Connection.confirmed` (its public form)."""
        table = self.table(handle_type)
        if handle not in table:
            return False
        if self.role is Role.BROKER:
            return True
        sender = self.bind_senders[BIND_CHANNEL[handle_type]]
        pending = len(sender.unconfirmed) + len(sender.retransmit)
        return handle < table.next_handle - pending

    def referable(self, channel: Channel) -> bool:
        """Whether this side may still send control messages about ``channel``."""
        handle_type = HANDLE_TYPE_OF_KIND.get(channel.kind)
        if handle_type is None:
            return True  # a bind channel
        binding = self.table(handle_type).get(channel.index)
        if binding is None or binding.state is not HandleState.BOUND:
            return False
        return self.confirmed(handle_type, channel.index)

    def may_reference(self, channel: Channel) -> bool:
        """See :meth:`Connection.may_reference` (its public form)."""
        return self._handshake.state is not ConnectionState.CLOSED and self.referable(channel)

    def require_referable(self, channel: Channel) -> None:
        """Refuse a control message about a handle this side may not reference
        (unconfirmed, or being freed): the peer would close the connection."""
        self._handshake.require_open()
        if (
            self.sender_of(channel) is not None or self.receiver_of(channel) is not None
        ) and not self.referable(channel):
            raise LocalProtocolError(f"{channel}: its handle is not confirmed or is being freed")

    def issue(self, receiver: ChannelReceiver) -> None:
        """Issue what the policy allows on ``receiver``'s channel, if this
        side may reference it."""
        amount = self.policy.amount_to_issue(receiver)
        if amount > 0 and self.referable(receiver.channel):
            message = receiver.issue(amount)
            if message is not None:
                self._writer.queue(message)

    def new_receiver(self, channel: Channel, capacity: int | None = None) -> ChannelReceiver:
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
        self.issue(receiver)
        return receiver

    # ---------------------------------------------------------------- receiving channels

    def issue_guarantees(self, channel: Channel | None = None) -> None:
        """See :meth:`Connection.issue_guarantees` (its public form)."""
        if self._handshake.state is not ConnectionState.OPEN:
            return
        if channel is not None:
            self.issue(self.receiver(channel))
            return
        for receiver in self.all_receivers():
            self.issue(receiver)

    def grow(self, channel: Channel, amount: int) -> None:
        """See :meth:`Connection.grow` (its public form)."""
        self._handshake.require_open()
        receiver = self.receiver(channel)
        receiver.grow(amount)
        self.issue(receiver)

    def set_capacity(self, channel: Channel, target: int, *, plead: bool | None = None) -> None:
        """See :meth:`Connection.set_capacity` (its public form)."""
        if plead is None:
            plead = self.policy.plead_on_shrink
        self._handshake.require_open()
        receiver = self.receiver(channel)
        receiver.set_capacity(target)
        self.issue(receiver)
        if plead and self.referable(channel):
            message = receiver.plead_for_target()
            if message is not None:
                self._writer.queue(message)

    def plead(self, channel: Channel, target: int) -> None:
        """See :meth:`Connection.plead` (its public form)."""
        self.require_referable(channel)
        self._writer.queue(self.receiver(channel).plead(target))

    def limit_receiving(self, channel: Channel, bound: int) -> None:
        """See :meth:`Connection.limit_receiving` (its public form)."""
        self.require_referable(channel)
        self._writer.queue(self.receiver(channel).limit_receiving(bound))

    def release(
        self,
        event: PublishReceived
        | PublishManyReceived
        | DeliverReceived
        | DeliverManyReceived
        | EncodedDeliveriesReceived,
    ) -> list[Event]:
        """See :meth:`Connection.release` (its public form)."""
        if type(event) is PublishReceived or type(event) is DeliverReceived:
            return self.release_frame(event.channel, event.size)
        assert not isinstance(event, PublishReceived | DeliverReceived)
        return self.release_frames(event.channel, event.size, len(event.message.entries))

    def release_frame(self, channel: Channel, size: int) -> list[Event]:
        """See :meth:`Connection.release_frame` (its public form)."""
        return self.release_frames(channel, size, 1)

    def release_frames(self, channel: Channel, size: int, count: int) -> list[Event]:
        """See :meth:`Connection.release_frames` (its public form)."""
        if channel.kind not in (ChannelKind.PUBLISH, ChannelKind.DELIVER):
            raise LocalProtocolError("bind channels are released by the protocol itself")
        if count < 1:
            raise LocalProtocolError(f"cannot release {count} frames")
        receiver = self.receiver(channel)
        handle_type = HANDLE_TYPE_OF_KIND[channel.kind]
        table = self.table(handle_type)
        if table.references(channel.index) < count:
            raise LocalProtocolError(f"{channel}: {count} frames are not buffered")
        receiver.release(size)
        events: list[Event] = []
        state = table.bindings[channel.index]
        if table.release(channel.index, count):
            self.on_deleted(handle_type, channel.index, state, events)
        elif self._handshake.state is ConnectionState.OPEN:
            self.issue(receiver)
        return events

    # ---------------------------------------------------------------- sending channels

    def limit_sending(self, channel: Channel, bound: int) -> None:
        """See :meth:`Connection.limit_sending` (its public form)."""
        self.require_referable(channel)
        self._writer.queue(self.sender(channel).limit_sending(bound))

    def absolve(self, channel: Channel, amount: int) -> None:
        """See :meth:`Connection.absolve` (its public form)."""
        self.require_referable(channel)
        self._writer.queue(self.sender(channel).absolve(amount))

    def room(self, channel: Channel) -> int:
        """See :meth:`Connection.room` (its public form)."""
        return self.room_of(self.sender(channel))

    def room_of(self, sender: ChannelSender) -> int:
        channel = sender.channel
        if channel.kind == ChannelKind.PUBLISH and self.bind_awaits_retransmission(channel.index):
            # The broker discards publishes on a handle it has not bound; wait
            # until the dropped bind has been sent again.
            return 0
        return sender.room(self.optimism(channel))

    def bind_awaits_retransmission(self, topic: int) -> bool:
        waiting = len(self.bind_senders[TOPIC_BINDS].retransmit)
        return waiting > 0 and topic >= self.topics.next_handle - waiting

    def optimism(self, channel: Channel) -> int:
        # The broker never sends beyond a subscriber's guarantees.
        if channel.kind == ChannelKind.DELIVER:
            return 0
        # At most OPTIMISM_FRAMES frames of the peer's max_frame: a receiver
        # may cut off a sender that drops more (see ``Policy.max_dropping``).
        return min(
            self.policy.optimism_for(channel),
            OPTIMISM_FRAMES * (self._writer.peer_max_frame + LENGTH_PREFIX),
        )

    def send_frame(
        self, sender: ChannelSender, message: Any, frame: bytes | None = None, tail: bytes = b""
    ) -> int:
        """Send a channel frame (default: ``message`` encoded) if it fits."""
        if frame is None:
            frame = encode(message, max_frame=self._writer.peer_max_frame)
        size = len(frame) + len(tail)
        room = self.room_of(sender)
        if size > room:
            raise NoGuarantees(
                f"{sender.channel}: {size}-byte frame does not fit (room {room} bytes)"
            )
        # Only deliveries come with a tail, and they never go beyond the guarantees
        # (no optimism on [3, s]), so they are never kept for retransmission.
        sender.record_sent(SentFrame(size, b"" if tail else frame, message))
        self._writer.put(frame, tail)
        return size

    def pump_retransmissions(self, sender: ChannelSender, events: list[Event]) -> None:
        """Send again what ``sender`` may send now; report what it never will."""
        while (entry := sender.next_retransmission()) is not None:
            sender.record_sent(entry)
            self._writer.put(entry.frame)
        self.send_deferred_frees()
        abandoned = sender.abandon_stuck_retransmissions()
        if abandoned:
            events.append(FramesAbandoned(sender.channel, len(abandoned)))
            if self.role is Role.CLIENT and sender.channel in HANDLE_TYPE_OF_BIND_CHANNEL:
                self.undo_binds(sender.channel, len(abandoned), events)

    def send_deferred_frees(self) -> None:
        """Client: re-propose freeing the resumed topics whose resends are all sent."""
        if not self.frees_after_resend:
            return
        for handle, message in list(self.frees_after_resend.items()):
            sender = self.sender_of(Channel(ChannelKind.PUBLISH, handle))
            if (sender is None or not sender.retransmit) and not self.bind_awaits_retransmission(
                handle
            ):
                del self.frees_after_resend[handle]
                self._writer.queue(message)

    # ---------------------------------------------------------------- the end of a handle

    def undo_binds(self, channel: Channel, count: int, events: list[Event]) -> None:
        """Client: bind frames that will never be sent bind nothing at the broker.

        They are the newest binds of their type, so undoing them keeps both
        sides' handle numbers in step.
        """
        handle_type = HANDLE_TYPE_OF_BIND_CHANNEL[channel]
        table = self.table(handle_type)
        states = {h: table.bindings[h] for h in range(table.next_handle - count, table.next_handle)}
        for handle in table.unbind_last(count):
            lost = states[handle].sender
            if lost is not None and (lost.unconfirmed or lost.retransmit):
                events.append(
                    FramesAbandoned(lost.channel, len(lost.unconfirmed) + len(lost.retransmit))
                )
            events.append(HandleDeleted(int(handle_type), handle))

    def on_deleted(
        self,
        handle_type: HandleType,
        handle: int,
        state: TopicState | SubscriptionState,
        events: list[Event],
    ) -> None:
        """``handle``'s binding left its table, and its ``state`` with it:
        report what its channel never sent, give its bind frame's space back
        on the bind channel."""
        sender = state.sender
        channel = handle_channel(handle_type, handle)
        if sender is not None and (sender.unconfirmed or sender.retransmit):
            lost = len(sender.unconfirmed) + len(sender.retransmit)
            events.append(FramesAbandoned(channel, lost))
        # A message in parts on its channel is over too (a handle reused must
        # not go on with it).
        self._parts.drop(channel)
        size = state.bind_size
        if size is not None:
            receiver = self.bind_receivers[BIND_CHANNEL[handle_type]]
            if state.restored:
                receiver.grow(size)  # its space was taken off the capacity
            else:
                receiver.release(size)
            self.issue(receiver)
        events.append(HandleDeleted(int(handle_type), handle))

    def release_reference(self, handle_type: HandleType, handle: int, events: list[Event]) -> None:
        """A buffered message referencing ``handle`` is done with it."""
        table = self.table(handle_type)
        state = table.bindings[handle]
        if table.release(handle):
            self.on_deleted(handle_type, handle, state, events)
