"""What a subscription has received and not yet handed to the application."""

from __future__ import annotations

from collections import deque

from broker.protocol import Deliver, DeliverManyReceived, DeliverReceived, Entry

from ._common import Message

_new_object = object.__new__
_set_topic, _set_payload, _set_key, _set_headers, _set_seq = (
    Message.__dict__[name].__set__ for name in ("topic", "payload", "key", "headers", "seq")
)


def message_of(topic: str, deliver: Deliver) -> Message:
    """The :class:`Message` of a Deliver on ``topic``: what ``Message(...)``
    makes, made a few times faster (it is made for every message received)."""
    message: Message = _new_object(Message)
    _set_topic(message, topic)
    _set_payload(message, deliver.payload)
    _set_key(message, deliver.key)
    _set_headers(message, deliver.headers)
    _set_seq(message, deliver.seq)
    return message


def messages_of(topic: str, first_seq: int, entries: list[Entry]) -> list[Message]:
    """The :class:`Message` of each entry of a DeliverMany on ``topic``,
    numbered from ``first_seq``: what ``Message(...)`` makes for each."""
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
        append(message)
        seq += 1
    return messages


class Inbox:
    """The messages of one subscription received and not yet taken, in
    order, and the buffer space their frames hold.

    A frame (a Deliver, or a DeliverMany of many messages) holds its space
    until its last message is taken: :meth:`take` says when, and how much
    to release then (one release count per message).
    """

    __slots__ = ("_ends", "_messages", "topic")

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self._messages: deque[Message] = deque()
        #: Per frame not wholly taken: its last sequence number, its size and
        #: how many messages it holds.
        self._ends: deque[tuple[int, int, int]] = deque()

    def __len__(self) -> int:
        return len(self._messages)

    def __bool__(self) -> bool:
        return bool(self._messages)

    def put(self, event: DeliverReceived | DeliverManyReceived) -> int:
        """Queue the messages of a received frame; returns how many."""
        if type(event) is DeliverReceived:
            deliver = event.message
            self._messages.append(message_of(self.topic, deliver))
            self._ends.append((deliver.seq, event.size, 1))
            return 1
        assert type(event) is DeliverManyReceived
        many = event.message
        messages = messages_of(self.topic, many.first_seq, many.entries)
        self._messages.extend(messages)
        self._ends.append((messages[-1].seq, event.size, len(messages)))
        return len(messages)

    def take(self) -> tuple[Message, int, int]:
        """The next message (there is one), with the size and message count
        of the frame it completes; ``(message, 0, 0)`` while its frame has
        more messages to take."""
        message = self._messages.popleft()
        ends = self._ends
        if ends[0][0] == message.seq:
            _, size, count = ends.popleft()
            return message, size, count
        return message, 0, 0

    def take_many(self, limit: int) -> tuple[list[Message], int, int]:
        """The next messages, at most ``limit`` (at least one is queued),
        with the size and message count of the frames they complete."""
        messages = self._messages
        popleft = messages.popleft
        taken = [popleft() for _ in range(min(limit, len(messages)))]
        last = taken[-1].seq
        ends = self._ends
        size = count = 0
        while ends and ends[0][0] <= last:
            _, frame_size, frame_count = ends.popleft()
            size += frame_size
            count += frame_count
        return taken, size, count

    def clear(self) -> tuple[int, int]:
        """Drop everything queued; returns the size and message count of
        the frames it held (all of each frame, taken messages included),
        which are then released in one go."""
        size = sum(end[1] for end in self._ends)
        count = sum(end[2] for end in self._ends)
        self._messages.clear()
        self._ends.clear()
        return size, count
