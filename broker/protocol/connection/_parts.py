"""The state of the messages a connection sends or receives in parts
(``FramePart`` frames, see ``_large``), in an object of its own."""

from __future__ import annotations

from typing import Any

from .._types import Channel


class MessageParts:
    """Messages in parts, per channel, both ways."""

    __slots__ = ("done", "held", "incoming", "out", "plain_payload")

    def __init__(self) -> None:
        #: Messages being sent in parts, per channel (``_large.OutgoingMessage``).
        self.out: dict[Channel, Any] = {}
        #: Client: a publish in parts finished by another call (``_large``).
        self.done: dict[Channel, object] = {}
        #: Messages being received in parts, per channel, and their bytes.
        self.incoming: dict[Channel, bytearray] = {}
        self.held = 0
        #: Client: a publish of a larger payload may need parts (see ``_large``);
        #: set once the Welcome says the broker takes parts.
        self.plain_payload = 1 << 64

    def drop(self, channel: Channel) -> None:
        """``channel``'s handle went away: a message in parts on it is over
        too (a handle reused must not go on with it)."""
        self.out.pop(channel, None)
        partial = self.incoming.pop(channel, None)
        if partial is not None:
            self.held -= len(partial)
