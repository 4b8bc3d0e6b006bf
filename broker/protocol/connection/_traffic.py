"""Messages: publishing (client) and delivering (broker), each on its
handle's channel within the guarantees, and the notices about them (Ack,
Settle, Gap, Confirm).

The usual case of each is a short path: one look-up of the handle's state
(:mod:`._handle_state`) gives the binding, the channel's guarantee state and
the session counts. Anything unusual (an unbound or optimistic handle, a
frame beyond the guarantees) takes the long path, which checks everything.
"""

from __future__ import annotations

from collections.abc import Callable

from .._errors import LocalProtocolError, RemoteProtocolError
from .._events import (
    DeliverManyReceived,
    DeliverReceived,
    EncodedDeliveriesReceived,
    Event,
    PublishReceived,
)
from .._types import (
    LENGTH_PREFIX,
    TOPIC_BINDS,
    U64_MAX,
    Channel,
    HandleType,
    Role,
    SettleOutcome,
)
from ..frames._decode import decode_body
from ..frames._encode import (
    MAX_DELIVER_GROUP,
    MAX_DELIVER_MANY,
    MAX_DELIVER_TIMED,
    deliver_group_head,
    deliver_heads,
    deliver_many_head,
    deliver_many_head_size,
    deliver_matched_head,
    deliver_timed_head,
    encode_deliver,
    encode_publish_tail,
    fitting_run,
    group_heads,
    matched_heads,
    publish_tail_frames,
    time_heads,
)
from ..frames._messages import (
    Ack,
    Confirm,
    Deliver,
    DeliverGroup,
    DeliverMany,
    DeliverMatched,
    DeliverTimed,
    EncodedDeliveries,
    Gap,
    Headers,
    Matched,
    MatchedGap,
    Publish,
    Settle,
)
from ..frames._settle import settle_problem
from ..guarantees._receiver import ChannelSender
from ._binds import Handles
from ._channels import NoGuarantees
from ._flow import Flow
from ._handle_state import SubscriptionState, TopicState
from ._handles import HandleState, HandleTable
from ._handshake import ConnectionState, Handshake, require_role
from ._large import LargeMessages
from ._parts import MessageParts
from ._receiving import accept_delivery, receive_publishes, record_deliveries
from ._short_run import ShortRun
from ._writer import FrameWriter

#: A frame of entries with fields before their Deliver tails (DeliverTimed,
#: DeliverGroup): the most entries one carries, and what makes its head.
_PrefixedFrame = tuple[int, Callable[[int, int, int, int], bytes]]
_TIMED: _PrefixedFrame = (MAX_DELIVER_TIMED, deliver_timed_head)
_GROUP: _PrefixedFrame = (MAX_DELIVER_GROUP, deliver_group_head)
_MATCHED: _PrefixedFrame = (MAX_DELIVER_GROUP, deliver_matched_head)


class Traffic:
    """Publish (in runs), Deliver, DeliverMany (Timed, Group, Matched),
    their notices; a part of the connection, which references the parts it
    is given (larger messages: the ``LargeMessages`` part), never the
    connection. (The connection's hottest calls, ``publish`` and
    ``deliver_encoded_many``, are the connection's own methods, on this
    part's state: a delegating call would cost each publish one more call.)"""

    def __init__(
        self,
        role: Role,
        *,
        handshake: Handshake,
        writer: FrameWriter,
        flow: Flow,
        handles: Handles,
        parts: MessageParts,
        large: LargeMessages,
        topics: HandleTable[TopicState],
        subscriptions: HandleTable[SubscriptionState],
    ) -> None:
        self.role = role
        self._handshake = handshake
        self._writer = writer
        self._flow = flow
        self._handles = handles
        self._parts = parts
        self._large = large
        self.topics = topics
        self.subscriptions = subscriptions
        #: Set by the short path of the frame just handled (see ShortRun).
        self.run: ShortRun | None = None
        #: The client reads DeliverMany frames (its Hello said so / this one's does).
        self.many = False
        #: Client: sent publishes are kept until confirmed, for a resume
        #: (``hello(keep_unconfirmed=False)``: only counted).
        self.keep_unconfirmed = True
        #: Frames referencing a handle whose bind was dropped, discarded silently.
        self.discarded_frames = 0

    # ---------------------------------------------------------------- publish

    def publish_tails(self, topic: int, tails: list[bytes], start: int = 0) -> int:
        """See :meth:`Connection.publish_tails` (its public form)."""
        if self.role is not Role.CLIENT:
            require_role(self.role, Role.CLIENT, "publish")
        if self._handshake.state is not ConnectionState.OPEN:
            self._handshake.require_open()
        state = self.topics.bindings.get(topic)
        if state is None or state.state is not HandleState.BOUND or state.sender is None:
            self.topics.resolve_local(topic)  # says what is wrong
            raise LocalProtocolError(f"this side does not send on topic handle {topic}")
        sender = state.sender
        writer = self._writer
        max_frame = writer.peer_max_frame
        out = writer.run_of(topic)
        retain = state.retain
        sent = 0
        if not self._flow.bind_senders[TOPIC_BINDS].retransmit and sender.sending_limit is None:
            # The usual case: the frames plainly within the guarantees (and
            # max_frame), encoded and accounted for in one go.
            frames = publish_tail_frames(topic, tails, start, sender.room())
            for count, frame in enumerate(frames):
                if len(frame) - LENGTH_PREFIX > max_frame:
                    del frames[count:]
                    break
            if frames:
                size = sum(map(len, frames))
                sender.record_within_guarantees(len(frames), size)
                out += frames
                self._writer.count(len(frames), size)
                sent = len(frames)
                if self.keep_unconfirmed:
                    state.retain_all(frames)
                else:
                    state.unkept += sent
                start += sent
        for index in range(start, len(tails)):
            try:
                frame = encode_publish_tail(topic, tails[index], max_frame=max_frame)
            except LocalProtocolError:
                if sent:
                    break  # (it raises on the next call, as the first)
                raise
            size = len(frame)
            if not self._flow.bind_senders[TOPIC_BINDS].retransmit and sender.send_guaranteed(size):
                out.append(frame)
                writer.frames_sent += 1
                writer.bytes_sent += size
                writer.out_size += size
            else:
                if size > self._flow.room_of(sender):
                    break  # (what _send_frame would refuse: no decoding for nothing)
                try:
                    self._flow.send_frame(sender, decode_body(frame[LENGTH_PREFIX:]), frame)
                except NoGuarantees:
                    break
                out = self._writer.run_of(topic)  # (the frame closed the runs: a new one)
            if self.keep_unconfirmed:
                retain(frame)  # to be sent again on a resume, until confirmed
            else:
                state.unkept += 1
            sent += 1
        return sent

    def on_publish(self, message: Publish, size: int, events: list[Event]) -> None:
        if self.role is not Role.BROKER:
            raise RemoteProtocolError("Publish is sent by clients")
        if self._handshake.state is not ConnectionState.OPEN:
            self._handshake.check_open(message)
        handle = message.topic
        topic = self.topics.bindings.get(handle)
        if topic is not None and topic.state is HandleState.BOUND and not topic.peer_done:
            # The usual case, in short: a bound topic, within the guarantees.
            receiver = topic.receiver
            if receiver is not None and receiver.accept_guaranteed(size):
                topic.references += 1
                topic.received += 1
                events.append(PublishReceived(message, topic.value, receiver.channel, size))
                self.run = ShortRun(Publish, handle, topic, receiver, topic)
                return
        topic = self._handles.resolve_topic(handle, events)
        if topic is None:
            # An optimistic reference whose bind was dropped (and announced).
            self.discarded_frames += 1
            return
        if receive_publishes(self._writer, self._flow, topic, 1, size):
            receiver = topic.receiver
            assert receiver is not None  # (checked by _receive_publishes)
            events.append(PublishReceived(message, topic.value, receiver.channel, size))

    # ---------------------------------------------------------------- deliver

    def deliver(
        self,
        subscription: int,
        seq: int,
        payload: bytes,
        *,
        key: bytes | None = None,
        headers: Headers | None = None,
    ) -> int:
        """See :meth:`Connection.deliver` (its public form)."""
        sender = self.delivery_sender(subscription)
        return self._flow.send_frame(sender, Deliver(subscription, seq, payload, key, headers))

    def delivery_sender(self, subscription: int) -> ChannelSender:
        require_role(self.role, Role.BROKER, "deliver")
        self._handshake.require_open()
        sender = self.subscriptions.resolve_local(subscription).sender
        assert sender is not None  # a broker sends on every bound subscription
        return sender

    def deliver_encoded(self, subscription: int, seq: int, tail: bytes) -> int:
        """See :meth:`Connection.deliver_encoded` (its public form)."""
        sender = self.delivery_sender(subscription)
        head, tail = encode_deliver(subscription, seq, tail)
        size = len(head) + len(tail)
        if size - LENGTH_PREFIX > self._writer.peer_max_frame:
            raise LocalProtocolError(f"Deliver frame of {size} bytes exceeds max_frame")
        return self._flow.send_frame(sender, None, head, tail)

    def deliver_in_many(
        self, sender: ChannelSender, subscription: int, first_seq: int, tails: list[bytes]
    ) -> int:
        """:meth:`deliver_encoded_many` to a client that reads DeliverMany:
        as few frames as the guarantees and ``max_frame`` allow (a frame of
        one entry goes as a plain Deliver)."""
        room = self._flow.room_of(sender)
        limit = self._writer.peer_max_frame + LENGTH_PREFIX
        out = self._writer.out
        count = len(tails)
        sent = frames = total = 0
        while sent < count:
            capacity = min(room, limit)
            seq = first_seq + sent
            stop = min(count, sent + MAX_DELIVER_MANY)
            # What fits in one frame, its head counted at the longest it can be...
            cap = capacity - deliver_many_head_size(subscription, seq, MAX_DELIVER_MANY)
            # The usual case: all of them fit the first frame (summed in one
            # go; once a batch needs several frames, they are measured one by one).
            end, body = fitting_run(tails, sent, stop, cap, whole=not frames)
            # ...then at its real size, a byte or two shorter for fewer entries.
            while (
                end < stop
                and deliver_many_head_size(subscription, seq, end + 1 - sent)
                + body
                + len(tails[end])
                <= capacity
            ):
                body += len(tails[end])
                end += 1
            if end - sent >= 2:
                head = deliver_many_head(subscription, seq, end - sent, body)
                size = len(head) + body
                out.append(head)
                out += tails[sent:end]
            else:
                tail = tails[sent]
                head = next(deliver_heads(subscription, seq, [tail]))
                size = len(head) + len(tail)
                if size > room or size > limit:
                    if size > limit and sent == 0:
                        taken = self._large.deliver_large(sender, seq, [head, tail])
                        return taken and 1 + self.deliver_in_many(
                            sender, subscription, seq + 1, tails[1:]
                        )
                    break
                out.append(head)
                out.append(tail)
                end = sent + 1
            room -= size
            total += size
            frames += 1
            sent = end
        if sent:
            record_deliveries(self._writer, sender, frames, total)
        return sent

    def deliver_timed(
        self, subscription: int, first_seq: int, tails: list[bytes], times: list[int]
    ) -> int:
        """See :meth:`Connection.deliver_timed` (its public form)."""
        sender = self.delivery_sender(subscription)
        count = len(tails)
        if first_seq < 0 or first_seq + count - 1 > U64_MAX or len(times) != count:
            raise LocalProtocolError("seq must be u64, with one time per delivery")
        return self._deliver_prefixed(
            sender, subscription, first_seq, tails, time_heads(times), _TIMED
        )

    def deliver_group(
        self,
        subscription: int,
        first_seq: int,
        tails: list[bytes],
        offsets: list[int],
        delivered: list[int],
    ) -> int:
        """See :meth:`Connection.deliver_group` (its public form)."""
        sender = self.delivery_sender(subscription)
        count = len(tails)
        if (
            first_seq < 0
            or first_seq + count - 1 > U64_MAX
            or len(offsets) != count
            or len(delivered) != count
            or (count and (min(offsets) < 0 or max(offsets) > U64_MAX))
            or (count and (min(delivered) < 0 or max(delivered) > U64_MAX))
        ):
            raise LocalProtocolError(
                "seq must be u64, with one u64 offset and delivered count per delivery"
            )
        return self._deliver_prefixed(
            sender, subscription, first_seq, tails, group_heads(offsets, delivered), _GROUP
        )

    def deliver_matched(
        self,
        subscription: int,
        first_seq: int,
        tails: list[bytes],
        match: int,
        first_offset: int,
    ) -> int:
        """See :meth:`Connection.deliver_matched` (its public form)."""
        sender = self.delivery_sender(subscription)
        count = len(tails)
        if (
            first_seq < 0
            or first_seq + count - 1 > U64_MAX
            or first_offset < 0
            or first_offset + count - 1 > U64_MAX
            or not 0 <= match <= U64_MAX
        ):
            raise LocalProtocolError("seq, match and offsets must be u64")
        heads = matched_heads(match, first_offset, count)
        return self._deliver_prefixed(sender, subscription, first_seq, tails, heads, _MATCHED)

    def matched(self, subscription: int, match: int, topic: str | None) -> None:
        """See :meth:`Connection.matched` (its public form)."""
        require_role(self.role, Role.BROKER, "match topics")
        self._handshake.require_open()
        self.subscriptions.resolve_local(subscription)
        self._writer.queue(Matched(subscription, match, topic))

    def matched_gap(self, subscription: int, match: int, first: int, count: int) -> None:
        """See :meth:`Connection.matched_gap` (its public form)."""
        require_role(self.role, Role.BROKER, "report gaps")
        self._handshake.require_open()
        self.subscriptions.resolve_local(subscription)
        self._writer.queue(MatchedGap(subscription, match, first, count))

    def _deliver_prefixed(
        self,
        sender: ChannelSender,
        subscription: int,
        first_seq: int,
        tails: list[bytes],
        prefixes: list[bytes],
        kind: _PrefixedFrame,
    ) -> int:
        """:meth:`deliver_timed` and :meth:`deliver_group`: ``tails``, each
        after its ``prefixes[i]`` (its entry's fields before the Deliver
        tail), in frames of ``kind`` (one entry or many) as far as the
        guarantees go; how many were queued."""
        count = len(tails)
        most, make_head = kind
        room = self._flow.room_of(sender)
        limit = self._writer.peer_max_frame + LENGTH_PREFIX
        out = self._writer.out
        sent = frames = total = 0
        while sent < count:
            capacity = min(room, limit)
            seq = first_seq + sent
            stop = min(count, sent + most)
            # The head counted at its longest (27 bytes): a few bytes of room
            # may go unused. The usual case: all of them fit, summed in one go.
            body = sum(map(len, tails[sent:stop])) + sum(map(len, prefixes[sent:stop]))
            if 27 + body <= capacity:
                end = stop
            else:
                body = len(prefixes[sent]) + len(tails[sent])  # (at least one, to try)
                end = sent + 1
                while end < stop:
                    size = len(prefixes[end]) + len(tails[end])
                    if 27 + body + size > capacity:
                        break
                    body += size
                    end += 1
            pieces: list[bytes] = [b""] * (2 * (end - sent))
            pieces[0::2] = prefixes[sent:end]
            pieces[1::2] = tails[sent:end]
            head = make_head(subscription, seq, end - sent, body)
            size = len(head) + body
            if size > room or size > limit:
                if size > limit and sent == 0:
                    taken = self._large.deliver_large(sender, seq, [head, *pieces])
                    return taken and 1 + self._deliver_prefixed(
                        sender, subscription, seq + 1, tails[1:], prefixes[1:], kind
                    )
                break
            out.append(head)
            out += pieces
            room -= size
            total += size
            frames += 1
            sent = end
        if sent:
            record_deliveries(self._writer, sender, frames, total)
        return sent

    def on_deliver(self, message: Deliver, size: int, events: list[Event]) -> None:
        if self.role is not Role.CLIENT:
            raise RemoteProtocolError("Deliver is sent by the broker")
        if self._handshake.state is not ConnectionState.OPEN:
            self._handshake.check_open(message)
        handle = message.subscription
        subscription = self.subscriptions.bindings.get(handle)
        if subscription is not None and not subscription.peer_done:
            # The usual case, in short: a bound subscription, within the guarantees.
            receiver = subscription.receiver
            if receiver is not None and receiver.accept_guaranteed(size):
                subscription.references += 1
                events.append(DeliverReceived(message, receiver.channel, size))
                self.run = ShortRun(Deliver, handle, subscription, receiver, None)
                return
        channel = accept_delivery(self._handles, "Deliver", handle, size, 1, events)
        events.append(DeliverReceived(message, channel, size))

    def on_deliver_many(self, message: DeliverMany, size: int, events: list[Event]) -> None:
        channel = self._accept_many(message, size, events)
        events.append(DeliverManyReceived(message, channel, size))

    def on_encoded_deliveries(
        self, message: EncodedDeliveries, size: int, events: list[Event]
    ) -> None:
        channel = self._accept_many(message, size, events)
        events.append(EncodedDeliveriesReceived(message, channel, size))

    def _accept_many(
        self, message: DeliverMany | EncodedDeliveries, size: int, events: list[Event]
    ) -> Channel:
        """Buffer a DeliverMany (however its entries are read); its channel."""
        if self.role is not Role.CLIENT or not self.many:
            raise RemoteProtocolError(
                "DeliverMany is sent by the broker, and only to a client whose Hello asks for it"
            )
        if self._handshake.state is not ConnectionState.OPEN:
            raise RemoteProtocolError("DeliverMany before the handshake completed")
        handle = message.subscription
        entries = len(message.entries)
        subscription = self.subscriptions.bindings.get(handle)
        if subscription is not None and not subscription.peer_done:
            # The usual case, in short: a bound subscription, within the guarantees.
            receiver = subscription.receiver
            if receiver is not None and receiver.accept_guaranteed(size):
                subscription.references += entries
                return receiver.channel
        return accept_delivery(self._handles, "DeliverMany", handle, size, entries, events)

    def on_deliver_prefixed(
        self,
        message: DeliverTimed | DeliverGroup | DeliverMatched,
        size: int,
        events: list[Event],
    ) -> None:
        """A DeliverTimed, DeliverGroup or DeliverMatched (a DeliverMany
        whose entries carry more): checked and accounted as one."""
        name = type(message).__name__
        if self.role is not Role.CLIENT:
            raise RemoteProtocolError(f"{name} is sent by the broker")
        if self._handshake.state is not ConnectionState.OPEN:
            self._handshake.check_open(message)
        if type(message) is DeliverMatched:
            self._check_matches(message.subscription, message.matches, events)
        channel = accept_delivery(
            self._handles, name, message.subscription, size, len(message.entries), events
        )
        events.append(DeliverManyReceived(message, channel, size))

    def _pattern_state(self, what: str, handle: int, events: list[Event]) -> dict[int, str]:
        """The bound matches of pattern subscription ``handle`` (raises if it
        is not bound, or not a pattern subscription)."""
        subscription = self._handles.resolve_subscription(handle, events)
        if subscription is None:
            raise RemoteProtocolError(f"{what} references unbound subscription handle {handle}")
        if subscription.value.topic is not None:
            raise RemoteProtocolError(f"{what} on subscription {handle}, which is not by pattern")
        if subscription.matches is None:
            subscription.matches = {}
        return subscription.matches

    def _check_matches(self, handle: int, matches: list[int], events: list[Event]) -> None:
        bound = self._pattern_state("DeliverMatched", handle, events)
        for match in set(matches):
            if match not in bound:
                raise RemoteProtocolError(
                    f"DeliverMatched on subscription {handle} names match {match}, "
                    "which no Matched bound"
                )

    def on_matched(self, message: Matched | MatchedGap, size: int, events: list[Event]) -> None:
        """Matched and MatchedGap (broker to client): checked, passed on."""
        name = type(message).__name__
        if self.role is not Role.CLIENT:
            raise RemoteProtocolError(f"{name} is sent by the broker")
        self._handshake.check_open(message)
        bound = self._pattern_state(name, message.subscription, events)
        if isinstance(message, Matched):
            if message.topic is None:
                if bound.pop(message.match, None) is None:
                    raise RemoteProtocolError(
                        f"Matched ends match {message.match}, which is not bound"
                    )
            else:
                bound[message.match] = message.topic
        elif message.match not in bound:
            raise RemoteProtocolError(f"MatchedGap names match {message.match}, which is not bound")
        events.append(message)

    # ---------------------------------------------------------------- acks, gaps, confirms

    def ack(self, subscription: int, seq: int) -> None:
        """See :meth:`Connection.ack` (its public form)."""
        require_role(self.role, Role.CLIENT, "acknowledge")
        self._handshake.require_open()
        state = self.subscriptions.resolve_local(subscription)
        if seq < state.processed:
            raise LocalProtocolError("Ack sequence numbers are cumulative and never go back")
        state.processed = seq
        self._writer.queue(Ack(subscription, seq))

    def settle(
        self,
        subscription: int,
        outcome: SettleOutcome,
        ranges: list[tuple[int, int]],
        detail: int | str | None = None,
    ) -> None:
        """See :meth:`Connection.settle` (its public form)."""
        require_role(self.role, Role.CLIENT, "settle")
        self._handshake.require_open()
        self.subscriptions.resolve_local(subscription)
        problem = settle_problem(outcome, ranges, detail)
        if problem is not None:
            raise LocalProtocolError(problem)
        pairs = [(first, count) for first, count in ranges]
        self._writer.queue(Settle(subscription, SettleOutcome(outcome), pairs, detail))

    def on_notice(
        self, message: Ack | Settle | Gap | Confirm, size: int, events: list[Event]
    ) -> None:
        """Ack and Settle (client to broker), Gap and Confirm (broker to
        client): checked, passed on."""
        name = type(message).__name__
        if isinstance(message, Confirm):
            handle_type, handle = HandleType.TOPIC, message.topic
        else:
            handle_type, handle = HandleType.SUBSCRIPTION, message.subscription
        sent_by = Role.CLIENT if isinstance(message, Ack | Settle) else Role.BROKER
        if self.role is sent_by:
            raise RemoteProtocolError(f"{name} is sent by the {sent_by.name.lower()}")
        self._handshake.check_open(message)
        self._handles.resolve_required(handle_type, handle, events, name)
        if isinstance(message, Confirm):
            self.on_confirm(message)
        events.append(message)

    def on_confirm(self, message: Confirm) -> None:
        """Confirmed publishes need not be kept for a resume any more.

        The count is cumulative over the session: it never goes back, and
        never exceeds the Publish frames sent on the handle (a repeat of the
        last count changes nothing)."""
        topic = self.topics.bindings[message.topic]
        if not topic.confirm(message.count):
            raise RemoteProtocolError(
                f"Confirm of {message.count} publishes on topic handle {message.topic}: "
                f"{topic.retained_base} confirmed before, {topic.published} sent"
            )

    def gap(self, subscription: int, first_seq: int, count: int) -> None:
        """See :meth:`Connection.gap` (its public form)."""
        require_role(self.role, Role.BROKER, "report gaps")
        self._handshake.require_open()
        self.subscriptions.resolve_local(subscription)
        self._writer.queue(Gap(subscription, first_seq, count))

    def confirm(self, topic: int, count: int) -> None:
        """See :meth:`Connection.confirm` (its public form)."""
        require_role(self.role, Role.BROKER, "confirm")
        self._handshake.require_open()
        self.topics.resolve_local(topic)
        self._writer.queue(Confirm(topic, count))
