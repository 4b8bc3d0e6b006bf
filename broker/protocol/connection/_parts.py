"""The state of the messages a connection sends or receives in parts
(``FramePart`` frames, see ``_large``), in an object of its own; and
:class:`PartAttribute`, a connection's attribute that is a part's."""

from __future__ import annotations

from operator import attrgetter
from typing import Any, Generic, TypeVar, overload

from .._types import Channel

T = TypeVar("T")


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


class PartAttribute(Generic[T]):
    """An attribute of the connection that is a part's: read and set on the
    part (a plain descriptor, not a property: it is the part's setting, not
    a computed value)."""

    __slots__ = ("_get", "_name", "_part")

    def __init__(self, part: str, name: str) -> None:
        self._part = part
        self._name = name
        self._get = attrgetter(f"{part}.{name}")

    @overload
    def __get__(self, instance: None, owner: type) -> PartAttribute[T]: ...
    @overload
    def __get__(self, instance: object, owner: type) -> T: ...
    def __get__(self, instance: object | None, owner: type) -> PartAttribute[T] | T:
        if instance is None:
            return self
        value: T = self._get(instance)
        return value

    def __set__(self, instance: object, value: T) -> None:
        setattr(getattr(instance, self._part), self._name, value)
