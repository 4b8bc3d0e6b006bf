"""PublishMany: many publishes to one topic handle in one frame, from a
client whose Hello asked for it and whose Welcome allowed it (a worker's
link to a topic's owner forwards its publishes so).

The frame is one channel message on ``[2, t]``: its whole size counts once
against the guarantees and it is accepted or dropped whole, but each entry
counts as one publish everywhere else (references to the handle, the
session's received and confirmed counts). The client keeps each entry as a
Publish frame of its own for a resume (what a resumed session sends again
is plain Publish frames). PublishMany is never sent on a staged handle.
"""

from __future__ import annotations

from .._errors import RemoteProtocolError
from .._events import Event, PublishManyReceived
from .._origins import OriginRun, origins_size_bound, slice_origins
from .._types import LENGTH_PREFIX, TOPIC_BINDS, Role
from ..frames._encode import (
    MAX_PUBLISH_MANY,
    encode_origins,
    fitting_run,
    publish_many_head,
    publish_tail_frames,
)
from ..frames._messages import PublishMany
from ._binds import Handles
from ._channels import NoGuarantees
from ._flow import Flow
from ._handle_state import TopicState
from ._handles import HandleState, HandleTable
from ._handshake import ConnectionState, Handshake
from ._receiving import receive_publishes
from ._traffic import Traffic
from ._writer import FrameWriter

__all__ = ["ManyPublishing"]

#: The longest a PublishMany head (length prefix included) can be.
_HEAD_MAX = LENGTH_PREFIX + 3 + 2 + 9


class ManyPublishing:
    """Sending (client) and receiving (broker) PublishMany frames; a part
    of the connection, which references the parts it is given (the traffic
    part, whose ``publish_tails`` sends what goes as Publish frames), never
    the connection."""

    def __init__(
        self,
        role: Role,
        *,
        handshake: Handshake,
        writer: FrameWriter,
        flow: Flow,
        handles: Handles,
        traffic: Traffic,
        topics: HandleTable[TopicState],
    ) -> None:
        self.role = role
        self._handshake = handshake
        self._writer = writer
        self._flow = flow
        self._handles = handles
        self._traffic = traffic
        self.topics = topics
        #: PublishMany frames may be sent (client) / received (broker): the
        #: Hello asked for them and the Welcome allowed them (``_opening``).
        self.allowed = False
        #: Broker: the peer is another worker's link, whose PublishMany frames
        #: may say whose publishes they carry (origin runs); set by the broker.
        self.accept_origins = False
        #: PublishMany frames referencing a handle whose bind was dropped.
        self.discarded_frames = 0

    def publish_many_tails(
        self,
        topic: int,
        tails: list[bytes],
        start: int = 0,
        origins: list[OriginRun] | None = None,
    ) -> int:
        """See :meth:`Connection.publish_many_tails` (its public form)."""
        if not self.allowed or self._flow.bind_senders[TOPIC_BINDS].retransmit:
            return self._traffic.publish_tails(topic, tails, start)
        if self._handshake.state is not ConnectionState.OPEN:
            self._handshake.require_open()
        state = self.topics.bindings.get(topic)
        if (
            state is None
            or state.state is not HandleState.BOUND
            or state.sender is None
            or state.stage is not None
            or state.sender.sending_limit is not None
            or type(topic) is not int
        ):
            return self._traffic.publish_tails(topic, tails, start)  # (which says what is wrong)
        sender = state.sender
        room = sender.room()
        limit = self._writer.peer_max_frame + LENGTH_PREFIX
        out = self._writer.run_of(topic)
        count = len(tails)
        sent = frames = total = 0
        while start + sent < count:
            capacity = min(room, limit) - _HEAD_MAX
            first = start + sent
            stop = min(count, first + MAX_PUBLISH_MANY)
            if origins is None:
                # The usual case: all of them fit one frame (summed in one go).
                end, body = fitting_run(tails, first, stop, capacity, whole=not frames)
                if end == first:
                    break  # out of room (or a tail too large: publish_tails says so)
                head = publish_many_head(topic, end - first, body)
                out.append(head)
                out += tails[first:end]
            else:
                end, body, runs = _fit_with_origins(tails, first, stop, capacity, origins, frames)
                if end == first:
                    break
                body += len(runs)
                head = publish_many_head(topic, end - first, body, origins=True)
                out.append(head)
                out += tails[first:end]
                out.append(runs)
            size = len(head) + body
            room -= size
            total += size
            frames += 1
            sent += end - first
        if frames:
            sender.record_within_guarantees(frames, total)
            self._writer.count(frames, total)
            if self._traffic.keep_unconfirmed:
                # Each kept as a Publish of its own, for a resume.
                state.retain_all(
                    publish_tail_frames(topic, tails[start : start + sent], 0, 1 << 62)
                )
            else:
                state.unkept += sent
        if sent == 0 and start < count:
            if origins is not None:
                return self._publish_one_beyond(state, topic, tails[start], origins, start)
            return self._traffic.publish_tails(topic, tails, start)  # (one, or what is wrong)
        return sent

    def _publish_one_beyond(
        self, state: TopicState, topic: int, tail: bytes, origins: list[OriginRun], at: int
    ) -> int:
        """Send ``tail`` alone, with its origin (entry ``at`` of
        ``origins``), where the guarantees have no room for it: beyond
        them if the optimism allows (as :meth:`publish_tails` would send
        it, but as a PublishMany, which keeps its origin); how many were sent."""
        own = slice_origins(origins, at, at + 1)
        runs = encode_origins(own)
        head = publish_many_head(topic, 1, len(tail) + len(runs), origins=True)
        if len(head) - LENGTH_PREFIX + len(tail) + len(runs) > self._writer.peer_max_frame:
            return self._traffic.publish_tails(topic, [tail])  # (which says it is too large)
        sender = state.sender
        assert sender is not None
        message = PublishMany(topic, [tail], [None], own)
        try:
            self._flow.send_frame(sender, message, head + tail + runs)
        except NoGuarantees:
            return 0
        if self._traffic.keep_unconfirmed:
            state.retain_all(publish_tail_frames(topic, [tail], 0, 1 << 62))
        else:
            state.unkept += 1
        return 1

    def on_publish_many(self, message: PublishMany, size: int, events: list[Event]) -> None:
        if self.role is not Role.BROKER or not self.allowed:
            raise RemoteProtocolError(
                "PublishMany is sent by clients, and only by one whose Welcome allows it"
            )
        if self._handshake.state is not ConnectionState.OPEN:
            self._handshake.check_open(message)
        if message.origins is not None and not self.accept_origins:
            raise RemoteProtocolError("only a worker's link may say whose publishes it sends")
        handle = message.topic
        count = len(message.entries)
        topic = self.topics.bindings.get(handle)
        if (
            topic is not None
            and topic.state is HandleState.BOUND
            and not topic.peer_done
            and topic.stage is None
        ):
            # The usual case, in short: a bound topic, within the guarantees.
            receiver = topic.receiver
            if receiver is not None and receiver.accept_guaranteed(size):
                topic.references += count
                topic.received += count
                events.append(PublishManyReceived(message, topic.value, receiver.channel, size))
                return
        topic = self._handles.resolve_topic(handle, events)
        if topic is None:
            # An optimistic reference whose bind was dropped (and announced).
            self.discarded_frames += 1
            return
        if topic.stage is not None:
            raise RemoteProtocolError(f"PublishMany on staged topic handle {handle}")
        if receive_publishes(self._writer, self._flow, topic, count, size):
            receiver = topic.receiver
            assert receiver is not None  # (checked by _receive_publishes)
            events.append(PublishManyReceived(message, topic.value, receiver.channel, size))


def _fit_with_origins(
    tails: list[bytes], first: int, stop: int, capacity: int, origins: list[OriginRun], frames: int
) -> tuple[int, int, bytes]:
    """The end of the run of ``tails`` from ``first`` (to ``stop`` at most)
    that fits ``capacity`` with its origin runs, the run's bytes, and the
    runs encoded. Room is kept for every run of the rest; when that leaves
    none, the frame carries the publishes of one run (the room for one is
    kept), so that many origins never keep a frame from going."""
    runs = slice_origins(origins, first, stop)
    end, body = fitting_run(
        tails, first, stop, capacity - origins_size_bound(len(runs)), whole=not frames
    )
    if end == first and len(runs) > 1:
        stop = first + runs[0][3]
        end, body = fitting_run(tails, first, stop, capacity - origins_size_bound(1), whole=False)
    return end, body, encode_origins(slice_origins(runs, 0, end - first))
