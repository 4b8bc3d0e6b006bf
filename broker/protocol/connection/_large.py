"""Messages larger than a frame: sent as ``FramePart`` frames on their own
channel and reassembled by the receiver (Aeron's fragments).

A ``Publish`` (client) or ``Deliver`` (broker; or a ``DeliverTimed`` or
``DeliverGroup`` of one entry) whose frame body exceeds the peer's
``max_frame`` is cut into parts: each part is a channel frame of its
own, within the channel's guarantees like any other, so a large message
needs no more room on its channel than a small one. The receiver frees
each part's guarantee bytes as soon as it has copied the chunk, and holds
the chunks instead (at most its ``max_message`` bytes, over all channels);
the last part carries the whole message, which is then buffered, accounted
and released as one message of the last part's frame size.

Both sides agree first: the client's Hello gives its ``max_message``, and
the broker's Welcome its own; a side that did not (an older client) never
gets a part, and never sends one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .._errors import LocalProtocolError, RemoteProtocolError
from .._events import DeliverManyReceived, DeliverReceived, Event, PublishReceived
from .._types import LENGTH_PREFIX, Channel, ChannelKind, GoodbyeCode, Role
from ..frames._decode import PART_BEGIN, PART_END, decode_body
from ..frames._encode import encode, encode_body, encode_publish_tail
from ..frames._messages import (
    Deliver,
    DeliverGroup,
    DeliverMatched,
    DeliverTimed,
    FramePart,
    Gap,
    Headers,
    Publish,
    check_publish_fields,
)
from ..guarantees._receiver import ChannelSender
from ._binds import Handles
from ._channels import NoGuarantees
from ._flow import Flow
from ._handle_state import TopicState
from ._handles import HandleTable
from ._handshake import ConnectionState, Handshake
from ._parts import MessageParts
from ._receiving import accept_delivery, receive_publishes, record_deliveries
from ._writer import FrameWriter

#: The largest message the reference client takes in parts (its Hello's
#: ``max_message``); what it publishes is bounded by the broker's, in Welcome.
MAX_MESSAGE = 64 * 1024 * 1024
#: The most a FramePart's fields take besides its chunk.
PART_HEAD = 25
#: A part is not cut smaller than this (unless it is the last): less room
#: than that waits for more guarantees.
MIN_PART = 4096


@dataclass(slots=True, eq=False)
class OutgoingMessage:
    """A message being sent in parts on one channel."""

    #: What identifies it: the publish's payload object, or the delivery's seq.
    key: object
    body: bytes
    offset: int = 0
    #: The part frames sent (kept for a resume: publishes only).
    frames: list[bytes] = field(default_factory=list)


def part_frames(channel: Channel, body: bytes, chunk: int) -> list[bytes]:
    """``body`` cut into FramePart frames of chunks of ``chunk`` bytes."""
    frames = []
    for start in range(0, len(body), chunk):
        piece = body[start : start + chunk]
        flags = (PART_BEGIN if start == 0 else 0) | (
            PART_END if start + len(piece) == len(body) else 0
        )
        frames.append(encode(FramePart(channel, flags, piece), max_frame=chunk + PART_HEAD))
    return frames


class LargeMessages:
    """Sending and receiving messages in FramePart frames (a part of the
    connection: it references the parts it is given, never the connection)."""

    def __init__(
        self,
        role: Role,
        max_message: int,
        *,
        handshake: Handshake,
        writer: FrameWriter,
        flow: Flow,
        handles: Handles,
        parts: MessageParts,
        topics: HandleTable[TopicState],
    ) -> None:
        self.role = role
        #: Largest message body this side takes in FramePart frames (0: none).
        self.max_message = max_message
        #: The largest message body the peer takes in parts (0: it takes none;
        #: set by the handshake, ``_opening``).
        self.peer_max_message = 0
        #: Client: publishes are kept until confirmed, for a resume (set by
        #: the Hello, ``_opening``, as the traffic part's is).
        self.keep_unconfirmed = True
        #: FramePart frames referencing a handle whose bind was dropped.
        self.discarded_frames = 0
        self._handshake = handshake
        self._writer = writer
        self._flow = flow
        self._handles = handles
        self._parts = parts
        self.topics = topics

    def _push_parts(self, sender: ChannelSender, pending: OutgoingMessage, *, keep: bool) -> bool:
        """Send the next parts of ``pending`` as far as ``sender``'s room
        allows; True once its last part is out."""
        body = pending.body
        limit = self._writer.peer_max_frame - PART_HEAD
        while pending.offset < len(body):
            left = len(body) - pending.offset
            room = min(self._flow.room_of(sender) - LENGTH_PREFIX - PART_HEAD, limit)
            if room < min(MIN_PART, left, limit):
                return False
            start = pending.offset
            piece = body[start : start + room]
            end = start + len(piece)
            flags = (PART_BEGIN if start == 0 else 0) | (PART_END if end == len(body) else 0)
            frame = encode(
                FramePart(sender.channel, flags, piece), max_frame=self._writer.peer_max_frame
            )
            if sender.channel.kind == ChannelKind.DELIVER:
                # Within the guarantees (no optimism on [3, s]): nothing kept.
                self._writer.out.append(frame)
                record_deliveries(self._writer, sender, 1, len(frame))
            else:
                self._flow.send_frame(sender, None, frame)
            if keep:
                pending.frames.append(frame)
            pending.offset = end
        return True

    # ---------------------------------------------------------------- publishing (client)

    def publish_in_parts(
        self,
        state: TopicState,
        sender: ChannelSender,
        payload: bytes,
        key: bytes | None,
        headers: Headers | None,
    ) -> int | None:
        """Client: :meth:`publish`, while a message in parts is being sent
        (on any handle) or for one that may not fit a frame: None if this one
        goes as a plain Publish."""
        pending = self._parts.out.get(sender.channel)
        if pending is None and self._parts.done.get(sender.channel) is not payload:
            if len(payload) + 64 <= self._writer.peer_max_frame or not self.peer_max_message:
                return None
            check_publish_fields(payload, key, headers)
            body = encode_body(Publish(sender.channel.index, payload, key, headers))
            if len(body) <= self._writer.peer_max_frame:
                return None
        return self.publish_large(state, sender, payload, key, headers)

    def publish_large(
        self,
        state: TopicState,
        sender: ChannelSender,
        payload: bytes,
        key: bytes | None,
        headers: Headers | None,
    ) -> int:
        """See :meth:`Connection.publish_large` (its public form)."""
        channel = sender.channel
        out, done = self._parts.out, self._parts.done
        if done.get(channel) is payload:
            del done[channel]
            return 0
        pending = out.get(channel)
        if pending is not None and pending.key is not payload:
            if not self._finish_publish(state, sender, pending):
                raise NoGuarantees(f"{channel}: a message in parts is being sent")
            done[channel] = pending.key
            pending = None
        if pending is None:
            body = encode_body(Publish(channel.index, payload, key, headers))
            if len(body) > self.peer_max_message:
                raise LocalProtocolError(
                    f"a message of {len(body)} bytes is larger than the broker's "
                    f"max_message ({self.peer_max_message} bytes)"
                )
            pending = out[channel] = OutgoingMessage(payload, body)
        if not self._finish_publish(state, sender, pending):
            raise NoGuarantees(f"{channel}: the rest of a message in parts waits for room")
        return sum(map(len, pending.frames))

    def publish_tail_in_parts(self, topic: int, tail: bytes) -> bool:
        """See :meth:`Connection.publish_tail_in_parts` (its public form)."""
        state = self.topics.bindings.get(topic)
        if state is None or state.sender is None:
            raise LocalProtocolError(f"this side does not send on topic handle {topic}")
        sender = state.sender
        pending = self._parts.out.get(sender.channel)
        if pending is None or pending.key is not tail:
            if pending is not None and not self._finish_publish(state, sender, pending):
                return False
            body = encode_publish_tail(topic, tail, max_frame=1 << 62)[LENGTH_PREFIX:]
            if len(body) > self.peer_max_message:
                raise LocalProtocolError(
                    f"a message of {len(body)} bytes is larger than the peer's "
                    f"max_message ({self.peer_max_message} bytes)"
                )
            pending = self._parts.out[sender.channel] = OutgoingMessage(tail, body)
        return self._finish_publish(state, sender, pending)

    def _finish_publish(
        self, state: TopicState, sender: ChannelSender, pending: OutgoingMessage
    ) -> bool:
        """Push ``pending``'s parts; once all are out, count it as one publish."""
        if not self._push_parts(sender, pending, keep=True):
            return False
        del self._parts.out[sender.channel]
        if self.keep_unconfirmed:
            state.retain(b"".join(pending.frames))  # a resume sends its parts again
        else:
            state.unkept += 1
        return True

    # ---------------------------------------------------------------- delivering (broker)

    def deliver_large(self, sender: ChannelSender, seq: int, frame: list[bytes]) -> int:
        """Broker: a delivery whose frame (``frame``'s pieces, length prefix
        first) exceeds the client's ``max_frame``, in parts: 1 once its last
        part is queued, else 0 (call again as room comes). A client that
        takes no parts, or not that many bytes, is told of it by a Gap."""
        channel = sender.channel
        size = sum(map(len, frame)) - LENGTH_PREFIX
        if size > self.peer_max_message:
            self._writer.queue(Gap(channel.index, seq, 1))
            return 1
        out = self._parts.out
        pending = out.get(channel)
        if pending is None or pending.key != seq:
            # (A message begun and not finished, then dropped from a lossy
            # queue, is abandoned: the next part's begin flag says so.)
            pending = out[channel] = OutgoingMessage(seq, b"".join(frame)[LENGTH_PREFIX:])
        if not self._push_parts(sender, pending, keep=False):
            return 0
        del out[channel]
        return 1

    # ---------------------------------------------------------------- receiving

    def on_frame_part(self, message: FramePart, size: int, events: list[Event]) -> None:
        channel = message.channel
        broker = self.role is Role.BROKER
        kind = ChannelKind.PUBLISH if broker else ChannelKind.DELIVER
        if not self.peer_max_message or channel.kind != kind:
            raise RemoteProtocolError(
                f"FramePart on {channel}: parts come only on "
                f"{'publish' if broker else 'delivery'} channels, after a Hello and "
                "Welcome that both gave max_message"
            )
        if self._handshake.state is not ConnectionState.OPEN:
            raise RemoteProtocolError("FramePart before the handshake completed")
        topic: TopicState | None = None
        if broker:
            topic = self._handles.resolve_topic(channel.index, events)
            if topic is None:
                self.discarded_frames += 1  # its bind was dropped (and announced)
                return
            receiver = topic.receiver
            assert receiver is not None
            if receiver.dropping:
                receive_publishes(
                    self._writer, self._flow, topic, 0, size
                )  # dropped: sent again later
                return
        partial = self._parts.incoming.get(channel)
        chunk = message.chunk
        if message.flags & PART_BEGIN:
            held = 0 if partial is None else len(partial)
        elif partial is None:
            raise RemoteProtocolError(f"{channel}: a FramePart without 'begin' continues nothing")
        else:
            held = len(partial)
        total = (0 if message.flags & PART_BEGIN else held) + len(chunk)
        if total > self.max_message:
            raise RemoteProtocolError(
                f"{channel}: a message of more than {self.max_message} bytes (max_message)",
                GoodbyeCode.FRAME_TOO_LARGE,
            )
        if self._parts.held - held + total > self.max_message:
            raise RemoteProtocolError(
                f"messages in parts hold more than {self.max_message} bytes (max_message)",
                GoodbyeCode.LIMIT_EXCEEDED,
            )
        if message.flags & PART_END:
            self._on_last_part(message, size, held, topic, events)
            return
        if topic is not None:
            if not receive_publishes(self._writer, self._flow, topic, 0, size):
                return  # dropped: sent again later, from where the drop began
        else:
            accept_delivery(self._handles, "FramePart", channel.index, size, 0, events)
        if message.flags & PART_BEGIN or partial is None:
            partial = self._parts.incoming[channel] = bytearray()
        partial += chunk
        self._parts.held += total - held
        # Copied: its guarantee bytes are free again at once.
        receiver = self._flow.receiver(channel)
        receiver.release(size)
        self._flow.issue(receiver)

    def _on_last_part(
        self,
        message: FramePart,
        size: int,
        held: int,
        topic: TopicState | None,
        events: list[Event],
    ) -> None:
        """The part that ends a message: the message, whole, is received
        as if it had come in one frame of ``size`` bytes."""
        channel = message.channel
        partial = self._parts.incoming.get(channel)
        if message.flags & PART_BEGIN or partial is None:
            body = bytes(message.chunk)
        else:
            body = bytes(partial) + message.chunk
        inner = decode_body(body)
        if topic is not None:  # (the broker's)
            if type(inner) is not Publish or inner.topic != channel.index:
                raise RemoteProtocolError(f"{channel}: its parts make no Publish on it")
            assert topic.receiver is not None
            if not receive_publishes(self._writer, self._flow, topic, 1, size):
                return  # dropped: this part comes again
            events.append(PublishReceived(inner, topic.value, topic.receiver.channel, size))
        elif type(inner) is Deliver and inner.subscription == channel.index:
            accept_delivery(self._handles, "FramePart", channel.index, size, 1, events)
            events.append(DeliverReceived(inner, channel, size))
        elif (
            isinstance(inner, DeliverTimed | DeliverGroup | DeliverMatched)
            and inner.subscription == channel.index
            and len(inner.entries) == 1
        ):
            # (A record of a subscription that gets only these frames.)
            accept_delivery(self._handles, "FramePart", channel.index, size, 1, events)
            events.append(DeliverManyReceived(inner, channel, size))
        else:
            raise RemoteProtocolError(
                f"{channel}: its parts make no Deliver (or DeliverTimed, DeliverGroup "
                "or DeliverMatched of one entry) on it"
            )
        self._parts.incoming.pop(channel, None)
        self._parts.held -= held
