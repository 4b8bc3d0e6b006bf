"""Guarantees, from this side: what a connection does to its channels'
buffers and promises, how it sends a channel frame within them, and what
happens to a handle's channels when the handle goes away.

Control messages *received* about guarantees are handled in ``_control``.
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
from ..guarantees._receiver import ChannelSender, SentFrame
from ._core import (
    BIND_CHANNEL,
    HANDLE_TYPE_OF_BIND_CHANNEL,
    HANDLE_TYPE_OF_KIND,
    ConnectionCore,
    NoGuarantees,
    handle_channel,
)
from ._handle_state import SubscriptionState, TopicState
from ._handshake import ConnectionState


class FlowControl(ConnectionCore):
    """Guarantee operations this side starts, sending within guarantees,
    and the end of a handle's channels."""

    # ---------------------------------------------------------------- receiving channels

    def issue_guarantees(self, channel: Channel | None = None) -> None:
        """Issue what the policy allows on ``channel`` (default: every channel).

        Call it when a policy answer changes, e.g. when an account that
        withheld a channel's guarantees falls below its watermark.
        """
        if self._handshake.state is not ConnectionState.OPEN:
            return
        if channel is not None:
            self._issue(self._receiver(channel))
            return
        for receiver in self._all_receivers():
            self._issue(receiver)

    def grow(self, channel: Channel, amount: int) -> None:
        """Add buffer capacity to a receiving channel (issued per policy)."""
        self._require_open()
        receiver = self._receiver(channel)
        receiver.grow(amount)
        self._issue(receiver)

    def set_capacity(self, channel: Channel, target: int, *, plead: bool | None = None) -> None:
        """Resize a receiving channel's buffer.

        Growing issues per policy. Shrinking reclaims unpromised space at
        once, then processed frames, and (with ``plead``, by default the
        policy's ``plead_on_shrink``) asks the sender to absolve what neither
        can reclaim.
        """
        if plead is None:
            plead = self.policy.plead_on_shrink
        self._require_open()
        receiver = self._receiver(channel)
        receiver.set_capacity(target)
        self._issue(receiver)
        if plead and self._may_reference(channel):
            message = receiver.plead_for_target()
            if message is not None:
                self._writer.queue(message)

    def plead(self, channel: Channel, target: int) -> None:
        """Ask the sender of ``channel`` to keep only ``target`` bytes of guarantees."""
        self._require_referable(channel)
        self._writer.queue(self._receiver(channel).plead(target))

    def limit_receiving(self, channel: Channel, bound: int) -> None:
        """Promise to issue at most ``bound`` more guarantee bytes on ``channel``."""
        self._require_referable(channel)
        self._writer.queue(self._receiver(channel).limit_receiving(bound))

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
        if type(event) is PublishReceived or type(event) is DeliverReceived:
            return self.release_frame(event.channel, event.size)
        assert not isinstance(event, PublishReceived | DeliverReceived)
        return self.release_frames(event.channel, event.size, len(event.message.entries))

    def release_frame(self, channel: Channel, size: int) -> list[Event]:
        """Free ``size`` bytes of a processed frame on ``channel``; see :meth:`release`."""
        return self.release_frames(channel, size, 1)

    def release_frames(self, channel: Channel, size: int, count: int) -> list[Event]:
        """Free ``count`` processed frames of ``size`` bytes in all on ``channel``.

        The same as releasing each frame in turn (:meth:`release_frame`),
        with guarantees issued once for the lot. A DeliverMany counts as one
        frame per entry here (each entry references its subscription).
        """
        if channel.kind not in (ChannelKind.PUBLISH, ChannelKind.DELIVER):
            raise LocalProtocolError("bind channels are released by the protocol itself")
        if count < 1:
            raise LocalProtocolError(f"cannot release {count} frames")
        receiver = self._receiver(channel)
        handle_type = HANDLE_TYPE_OF_KIND[channel.kind]
        table = self._table(handle_type)
        if table.references(channel.index) < count:
            raise LocalProtocolError(f"{channel}: {count} frames are not buffered")
        receiver.release(size)
        events: list[Event] = []
        state = table.bindings[channel.index]
        if table.release(channel.index, count):
            self._on_deleted(handle_type, channel.index, state, events)
        elif self._handshake.state is ConnectionState.OPEN:
            self._issue(receiver)
        return events

    # ---------------------------------------------------------------- sending channels

    def limit_sending(self, channel: Channel, bound: int) -> None:
        """Promise to send (or absolve) at most ``bound`` more bytes on ``channel``."""
        self._require_referable(channel)
        self._writer.queue(self._sender(channel).limit_sending(bound))

    def absolve(self, channel: Channel, amount: int) -> None:
        """Give back ``amount`` bytes of guarantees on ``channel``."""
        self._require_referable(channel)
        self._writer.queue(self._sender(channel).absolve(amount))

    def room(self, channel: Channel) -> int:
        """The largest frame this side may send on ``channel`` now."""
        return self._room(self._sender(channel))

    def _room(self, sender: ChannelSender) -> int:
        channel = sender.channel
        if channel.kind == ChannelKind.PUBLISH and self._bind_awaits_retransmission(channel.index):
            # The broker discards publishes on a handle it has not bound; wait
            # until the dropped bind has been sent again.
            return 0
        return sender.room(self._optimism(channel))

    def _bind_awaits_retransmission(self, topic: int) -> bool:
        waiting = len(self._bind_senders[TOPIC_BINDS].retransmit)
        return waiting > 0 and topic >= self.topics.next_handle - waiting

    def _optimism(self, channel: Channel) -> int:
        # The broker never sends beyond a subscriber's guarantees.
        if channel.kind == ChannelKind.DELIVER:
            return 0
        # At most OPTIMISM_FRAMES frames of the peer's max_frame: a receiver
        # may cut off a sender that drops more (see ``Policy.max_dropping``).
        return min(
            self.policy.optimism_for(channel),
            OPTIMISM_FRAMES * (self._writer.peer_max_frame + LENGTH_PREFIX),
        )

    def _send_frame(
        self, sender: ChannelSender, message: Any, frame: bytes | None = None, tail: bytes = b""
    ) -> int:
        """Send a channel frame (default: ``message`` encoded) if it fits."""
        if frame is None:
            frame = encode(message, max_frame=self._writer.peer_max_frame)
        size = len(frame) + len(tail)
        room = self._room(sender)
        if size > room:
            raise NoGuarantees(
                f"{sender.channel}: {size}-byte frame does not fit (room {room} bytes)"
            )
        # Only deliveries come with a tail, and they never go beyond the guarantees
        # (no optimism on [3, s]), so they are never kept for retransmission.
        sender.record_sent(SentFrame(size, b"" if tail else frame, message))
        self._writer.put(frame, tail)
        return size

    def _pump_retransmissions(self, sender: ChannelSender, events: list[Event]) -> None:
        """Send again what ``sender`` may send now; report what it never will."""
        while (entry := sender.next_retransmission()) is not None:
            sender.record_sent(entry)
            self._writer.put(entry.frame)
        self._send_deferred_frees()
        abandoned = sender.abandon_stuck_retransmissions()
        if abandoned:
            events.append(FramesAbandoned(sender.channel, len(abandoned)))
            if self.role is Role.CLIENT and sender.channel in HANDLE_TYPE_OF_BIND_CHANNEL:
                self._undo_binds(sender.channel, len(abandoned), events)

    def _send_deferred_frees(self) -> None:
        """Client: re-propose freeing the resumed topics whose resends are all sent."""
        if not self._frees_after_resend:
            return
        for handle, message in list(self._frees_after_resend.items()):
            sender = self._sender_of(Channel(ChannelKind.PUBLISH, handle))
            if (sender is None or not sender.retransmit) and not self._bind_awaits_retransmission(
                handle
            ):
                del self._frees_after_resend[handle]
                self._writer.queue(message)

    # ---------------------------------------------------------------- the end of a handle

    def _undo_binds(self, channel: Channel, count: int, events: list[Event]) -> None:
        """Client: bind frames that will never be sent bind nothing at the broker.

        They are the newest binds of their type, so undoing them keeps both
        sides' handle numbers in step.
        """
        handle_type = HANDLE_TYPE_OF_BIND_CHANNEL[channel]
        table = self._table(handle_type)
        states = {h: table.bindings[h] for h in range(table.next_handle - count, table.next_handle)}
        for handle in table.unbind_last(count):
            lost = states[handle].sender
            if lost is not None and (lost.unconfirmed or lost.retransmit):
                events.append(
                    FramesAbandoned(lost.channel, len(lost.unconfirmed) + len(lost.retransmit))
                )
            events.append(HandleDeleted(int(handle_type), handle))

    def _on_deleted(
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
        self._parts_out.pop(channel, None)
        partial = self._parts_in.pop(channel, None)
        if partial is not None:
            self._parts_held -= len(partial)
        size = state.bind_size
        if size is not None:
            receiver = self._bind_receivers[BIND_CHANNEL[handle_type]]
            if state.restored:
                receiver.grow(size)  # its space was taken off the capacity
            else:
                receiver.release(size)
            self._issue(receiver)
        events.append(HandleDeleted(int(handle_type), handle))

    def _release_reference(self, handle_type: HandleType, handle: int, events: list[Event]) -> None:
        """A buffered message referencing ``handle`` is done with it."""
        table = self._table(handle_type)
        state = table.bindings[handle]
        if table.release(handle):
            self._on_deleted(handle_type, handle, state, events)
