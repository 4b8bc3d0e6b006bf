"""The short path's memo for a run of Publish or Deliver frames on one handle."""

from __future__ import annotations

from typing import Any

from .._events import DeliverReceived, Event, PublishReceived
from ..guarantees._receiver import ChannelReceiver
from ._handle_state import SubscriptionState, TopicState


class ShortRun:
    """What the short path of a Publish or Deliver found out about its
    handle, reused for the frames right after it on the same handle: until
    another kind of frame is handled, nothing can change the binding or the
    connection's state, and each frame's guarantees are still checked."""

    __slots__ = ("binding", "channel", "handle", "kind", "receiver", "topic")

    def __init__(
        self,
        kind: type,
        handle: int,
        binding: TopicState | SubscriptionState,
        receiver: ChannelReceiver,
        topic: TopicState | None,
    ) -> None:
        self.kind = kind
        self.handle = handle
        #: The handle's state (its binding).
        self.binding = binding
        self.receiver = receiver
        self.channel = receiver.channel
        #: Broker, a run of Publish frames: the topic's state, whose count of
        #: accepted publishes (resume data) each frame adds to. None for Deliver.
        self.topic = topic

    def take(self, message: Any, size: int, events: list[Event]) -> bool:
        """Accept ``message`` as its run's short path would; False (nothing
        changed) if it is on another handle or beyond the guarantees."""
        topic = self.topic
        if topic is None:
            if message.subscription != self.handle or not self.receiver.accept_guaranteed(size):
                return False
            self.binding.references += 1
            events.append(DeliverReceived(message, self.channel, size))
            return True
        if message.topic != self.handle or not self.receiver.accept_guaranteed(size):
            return False
        topic.references += 1
        topic.received += 1
        events.append(PublishReceived(message, topic.value, self.channel, size))
        return True
