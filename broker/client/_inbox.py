"""What a subscription has received and not yet handed to the application."""

from __future__ import annotations

from collections import deque

from broker.protocol import (
    Deliver,
    DeliverGroup,
    DeliverManyReceived,
    DeliverMatched,
    DeliverReceived,
    DeliverTimed,
    Entry,
)

from ._common import GroupTicket, Message

_new_object = object.__new__
_set_topic, _set_payload, _set_key, _set_headers, _set_seq, _set_offset, _set_timestamp = (
    Message.__dict__[name].__set__
    for name in ("topic", "payload", "key", "headers", "seq", "offset", "timestamp")
)
_set_deliveries, _set_ticket = (
    Message.__dict__[name].__set__ for name in ("deliveries", "_ticket")
)


def message_of(topic: str, deliver: Deliver, offsets: bool = False) -> Message:
    """The :class:`Message` of a Deliver on ``topic`` (its seq is the
    record's offset too if ``offsets``): what ``Message(...)`` makes, made a
    few times faster (it is made for every message received; its
    ``timestamp`` is left unset, which reads as None)."""
    message: Message = _new_object(Message)
    _set_topic(message, topic)
    _set_payload(message, deliver.payload)
    _set_key(message, deliver.key)
    _set_headers(message, deliver.headers)
    _set_seq(message, deliver.seq)
    _set_offset(message, deliver.seq if offsets else None)
    return message


def messages_of(
    topic: str,
    first_seq: int,
    entries: list[Entry],
    offsets: bool = False,
    times: list[int] | None = None,
) -> list[Message]:
    """The :class:`Message` of each entry of a DeliverMany on ``topic``,
    numbered from ``first_seq`` (offsets too if ``offsets``; ``times[i]``
    the timestamp of entry ``i``, if given): what ``Message(...)`` makes
    for each."""
    messages: list[Message] = []
    append = messages.append
    seq = first_seq
    for payload, key, headers in entries:
        message: Message = _new_object(Message)
        _set_topic(message, topic)
        _set_payload(message, payload)
        _set_key(message, key)
        _set_headers(message, headers)
        _set_seq(message, seq)
        _set_offset(message, seq if offsets else None)
        append(message)
        seq += 1
    if times is not None:
        for message, time_ms in zip(messages, times, strict=True):
            _set_timestamp(message, time_ms)
    return messages


def group_messages_of(topic: str, many: DeliverGroup, ticket: GroupTicket | None) -> list[Message]:
    """The :class:`Message` of each entry of a DeliverGroup on ``topic``:
    numbered from its ``first_seq``, each with its record's offset, how
    many times it was delivered before, and the ``ticket`` it settles by."""
    messages = messages_of(topic, many.first_seq, many.entries)
    for message, offset, delivered in zip(messages, many.offsets, many.delivered, strict=True):
        _set_offset(message, offset)
        _set_deliveries(message, delivered)
        _set_ticket(message, ticket)
    return messages


#: What :meth:`Inbox.put` returns for a frame it did not queue: numbered at
#: or below the inbox's ``bound``, handed to the application already (or
#: queued for it), in part at least.
REDELIVERED = -1


class Inbox:
    """The messages of one subscription received and not yet taken, in
    order, and the buffer space their frames hold.

    A frame (a Deliver, or a DeliverMany of many messages) holds its space
    until its last message is taken; the space of frames taken whole adds up
    until :meth:`collect` hands it out for releasing (one release count per
    message).
    """

    __slots__ = (
        "_ends",
        "bound",
        "bounds",
        "detached",
        "done_count",
        "done_size",
        "matches",
        "messages",
        "offsets",
        "ticket",
        "topic",
    )

    def __init__(self, topic: str) -> None:
        self.topic = topic
        #: Sequence numbers are the offsets of the topic's records (a reliable
        #: subscription on a broker whose Welcome said ``offsets``): each
        #: message's ``offset`` is its seq (else None).
        self.offsets = False
        #: The messages not taken yet, oldest first (read-only for callers).
        self.messages: deque[Message] = deque()
        #: Per frame not wholly taken: its last sequence number, its size and
        #: how many messages it holds.
        self._ends: deque[tuple[int, int, int]] = deque()
        #: Frames taken whole and not yet collected: their size and messages.
        self.done_size = 0
        self.done_count = 0
        #: How many messages at the front came through a connection since
        #: replaced, of a session the broker lost (:meth:`keep`): no frame
        #: of this connection holds them, nothing acknowledges them.
        self.detached = 0
        #: With ``offsets``: the highest offset handed to the application or
        #: queued for it (the last put; set again when the connection is
        #: replaced, see ``SubscriptionState._reset``). A frame numbered at or
        #: below it is not queued by :meth:`put` (see :meth:`put_above`).
        #: Without ``offsets`` it means nothing.
        self.bound = 0
        #: A consumer group's member: what its messages settle through.
        self.ticket: GroupTicket | None = None
        #: A pattern subscription's: the topic of each match index bound (see
        #: ``Matched``), and, per topic, the highest offset handed to the
        #: application or queued for it (None: offsets are not the topics'
        #: log offsets, nothing is dropped as a duplicate).
        self.matches: dict[int, str] = {}
        self.bounds: dict[str, int] | None = None

    def __len__(self) -> int:
        return len(self.messages)

    def __bool__(self) -> bool:
        return bool(self.messages)

    def put(self, event: DeliverReceived | DeliverManyReceived) -> int:
        """Queue the messages of a received frame; returns how many, or
        :data:`REDELIVERED` (nothing queued) if ``offsets`` and the frame
        starts at or below :attr:`bound`: then :meth:`put_above` queues the
        part above it."""
        if type(event) is DeliverReceived:
            deliver = event.message
            seq = deliver.seq
            if seq <= self.bound and self.offsets:
                return REDELIVERED
            self.bound = seq
            self.messages.append(message_of(self.topic, deliver, self.offsets))
            self._ends.append((seq, event.size, 1))
            return 1
        assert type(event) is DeliverManyReceived
        many = event.message
        if many.first_seq <= self.bound and self.offsets:
            return REDELIVERED
        if type(many) is DeliverGroup:
            messages = group_messages_of(self.topic, many, self.ticket)
        else:
            times = many.times if type(many) is DeliverTimed else None
            messages = messages_of(self.topic, many.first_seq, many.entries, self.offsets, times)
        self.messages.extend(messages)
        self.bound = last = messages[-1].seq
        self._ends.append((last, event.size, len(messages)))
        return len(messages)

    def put_matched(self, event: DeliverManyReceived) -> tuple[int, int]:
        """Queue the messages of a DeliverMatched (each naming its topic and
        its offset there), but those at or below their topic's bound in
        :attr:`bounds` (handed out or queued already: a record delivered
        again after a broker restart); returns how many were dropped and
        the delivery number of the last dropped (0 if none). A frame
        dropped whole counts at once as taken whole."""
        many = event.message
        assert type(many) is DeliverMatched
        matches = self.matches
        bounds = self.bounds
        messages: list[Message] = []
        append = messages.append
        seq = many.first_seq
        dropped = last_dropped = 0
        for (payload, key, headers), match, offset in zip(
            many.entries, many.matches, many.offsets, strict=True
        ):
            topic = matches[match]
            if bounds is not None:
                if offset <= bounds.get(topic, 0):
                    dropped += 1
                    last_dropped = seq
                    seq += 1
                    continue
                bounds[topic] = offset
            message: Message = _new_object(Message)
            _set_topic(message, topic)
            _set_payload(message, payload)
            _set_key(message, key)
            _set_headers(message, headers)
            _set_seq(message, seq)
            _set_offset(message, offset)
            append(message)
            seq += 1
        count = len(many.entries)
        if messages:
            self.messages.extend(messages)
            self.bound = messages[-1].seq
            self._ends.append((self.bound, event.size, count))
        else:
            self.done_size += event.size
            self.done_count += count
        return dropped, last_dropped

    def put_above(self, event: DeliverReceived | DeliverManyReceived) -> tuple[int, int]:
        """Queue the messages of a frame numbered above :attr:`bound`, drop
        the others (already handed to the application or queued); returns
        how many were dropped and the sequence number of the last dropped
        (0 if none). A frame dropped whole counts at once as taken whole
        (its room is collected by :meth:`collect`); one dropped in part
        holds its room until its last message is taken."""
        bound = self.bound
        if type(event) is DeliverReceived:
            if event.message.seq > bound:
                self.put(event)
                return 0, 0
            self.done_size += event.size
            self.done_count += 1
            return 1, event.message.seq
        assert type(event) is DeliverManyReceived
        many = event.message
        first, count = many.first_seq, len(many.entries)
        dropped = max(0, min(count, bound - first + 1))
        if dropped == count:
            self.done_size += event.size
            self.done_count += count
            return dropped, first + count - 1
        times = many.times if type(many) is DeliverTimed else None
        messages = messages_of(
            self.topic,
            first + dropped,
            many.entries[dropped:],
            self.offsets,
            None if times is None else times[dropped:],
        )
        self.messages.extend(messages)
        self.bound = last = messages[-1].seq
        self._ends.append((last, event.size, count))  # (its room: all of it, once taken)
        return dropped, first + dropped - 1 if dropped else 0

    def keep(self, messages: list[Message]) -> None:
        """Queue ``messages`` (received through a connection since replaced,
        in a session the broker lost) first, detached: taken before anything
        received now, without releasing or acknowledging anything."""
        self.messages.extendleft(reversed(messages))
        self.detached += len(messages)

    def take(self) -> Message:
        """The next message (there is one)."""
        message = self.messages.popleft()
        if self.detached:
            self.detached -= 1
            return message
        ends = self._ends
        if ends[0][0] == message.seq:  # its frame is all taken
            _, size, count = ends.popleft()
            self.done_size += size
            self.done_count += count
        return message

    def take_many(self, limit: int) -> list[Message]:
        """The next messages, at most ``limit`` (at least one is queued)."""
        messages = self.messages
        popleft = messages.popleft
        if self.detached:  # (never mixed with messages of frames: see keep)
            detached = [popleft() for _ in range(min(limit, self.detached))]
            self.detached -= len(detached)
            return detached
        taken = [popleft() for _ in range(min(limit, len(messages)))]
        last = taken[-1].seq
        ends = self._ends
        while ends and ends[0][0] <= last:
            _, size, count = ends.popleft()
            self.done_size += size
            self.done_count += count
        return taken

    def collect(self) -> tuple[int, int]:
        """The size and message count of the frames taken whole since the
        last call, to be released now."""
        done = self.done_size, self.done_count
        self.done_size = self.done_count = 0
        return done

    def clear(self) -> tuple[int, int]:
        """Drop everything queued; returns the size and message count of
        every frame not released yet (taken whole and not collected, or
        held, partly taken or not), to be released in one go."""
        size = self.done_size + sum(end[1] for end in self._ends)
        count = self.done_count + sum(end[2] for end in self._ends)
        self.messages.clear()
        self._ends.clear()
        self.done_size = self.done_count = self.detached = 0
        return size, count
