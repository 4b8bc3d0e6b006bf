"""The short path's memo for a run of Publish or Deliver frames on one handle."""

from __future__ import annotations

from typing import Any

from ._events import DeliverReceived, Event, PublishReceived
from ._guarantees import ChannelReceiver
from ._handles import Binding


class ShortRun:
    """What the short path of a Publish or Deliver found out about its
    handle, reused for the frames right after it on the same handle: until
    another kind of frame is handled, nothing can change the binding or the
    connection's state, and each frame's guarantees are still checked."""

    __slots__ = ("binding", "channel", "counts", "handle", "kind", "receiver")

    def __init__(
        self,
        kind: type,
        handle: int,
        binding: Binding[Any],
        receiver: ChannelReceiver,
        counts: dict[int, int] | None,
    ) -> None:
        self.kind = kind
        self.handle = handle
        self.binding = binding
        self.receiver = receiver
        self.channel = receiver.channel
        #: Broker: the per-topic count of accepted publishes (resume data).
        self.counts = counts

    def take(self, message: Any, size: int, events: list[Event]) -> bool:
        """Accept ``message`` as its run's short path would; False (nothing
        changed) if it is on another handle or beyond the guarantees."""
        counts = self.counts
        if counts is None:
            if message.subscription != self.handle or not self.receiver.accept_guaranteed(size):
                return False
            self.binding.references += 1
            events.append(DeliverReceived(message, self.channel, size))
            return True
        if message.topic != self.handle or not self.receiver.accept_guaranteed(size):
            return False
        self.binding.references += 1
        counts[self.handle] += 1
        events.append(PublishReceived(message, self.binding.value, self.channel, size))
        return True
