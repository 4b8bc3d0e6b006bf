"""Which channel is whose: the constants and small helpers every part of a
connection uses to go from a handle to its channel and back."""

from __future__ import annotations

from .._errors import LocalProtocolError
from .._types import SUBSCRIPTION_BINDS, TOPIC_BINDS, Channel, ChannelKind, HandleType

#: The handle type a publish/deliver channel's index names, and back.
HANDLE_TYPE_OF_KIND: dict[int, HandleType] = {
    ChannelKind.PUBLISH: HandleType.TOPIC,
    ChannelKind.DELIVER: HandleType.SUBSCRIPTION,
}
KIND_OF_HANDLE_TYPE: dict[HandleType, int] = {
    handle_type: kind for kind, handle_type in HANDLE_TYPE_OF_KIND.items()
}
#: The channel that binds each handle type, and back.
BIND_CHANNEL = {HandleType.TOPIC: TOPIC_BINDS, HandleType.SUBSCRIPTION: SUBSCRIPTION_BINDS}
HANDLE_TYPE_OF_BIND_CHANNEL = {
    channel: handle_type for handle_type, channel in BIND_CHANNEL.items()
}

#: A Deliver may exceed ``max_frame`` by this much (its per-subscriber fields),
#: so that any Publish the broker accepted can be delivered.
DELIVER_SLACK = 32


def handle_channel(handle_type: HandleType, handle: int) -> Channel:
    """The publish or deliver channel of a handle."""
    return Channel(KIND_OF_HANDLE_TYPE[handle_type], handle)


class NoGuarantees(LocalProtocolError):
    """The channel has no room for this frame now.

    Nothing was sent and nothing changed; try again after a
    :class:`GuaranteesReceived` event for the channel.
    """
