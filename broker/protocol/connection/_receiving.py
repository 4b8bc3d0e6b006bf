"""What receiving and sending channel messages on a handle share, for the
traffic parts (``_traffic``, ``_publish_many``, ``_large``): functions of
the parts they are given, so that none of those parts references another
for them."""

from __future__ import annotations

from .._errors import RemoteProtocolError
from .._events import Event
from .._types import Channel, GoodbyeCode, HandleType
from ..guarantees._receiver import ChannelSender
from ._binds import Handles
from ._flow import Flow
from ._handle_state import TopicState
from ._handles import HandleState
from ._writer import FrameWriter


def receive_publishes(
    writer: FrameWriter, flow: Flow, topic: TopicState, count: int, size: int
) -> bool:
    """Broker: account one channel message of ``size`` bytes carrying
    ``count`` publishes on ``topic`` against its guarantees (queueing
    what that sends); True if it was accepted, its publishes then
    counted in the handle's references and received."""
    receiver = topic.receiver
    assert receiver is not None  # a broker receives on every bound topic
    accepted, out = receiver.on_frame(size)
    if topic.state is HandleState.BOUND:
        writer.queue_all(out)
    if accepted:
        if receiver.sender_balance < 0 and topic.state is HandleState.BOUND:
            flow.issue(receiver)  # confirm the optimistic frame without delay
        topic.references += count
        topic.received += count
    return accepted


def accept_delivery(
    handles: Handles, what: str, handle: int, size: int, entries: int, events: list[Event]
) -> Channel:
    """Buffer a delivery frame of ``entries`` messages on subscription
    ``handle`` (the long way); its channel. Raises if the handle is not
    bound or the frame is beyond the guarantees."""
    subscription = handles.resolve_required(HandleType.SUBSCRIPTION, handle, events, what)
    receiver = subscription.receiver
    assert receiver is not None  # a client receives on every bound subscription
    channel = receiver.channel
    if receiver.dropping or size > receiver.free or size > receiver.sender_balance:
        raise RemoteProtocolError(
            f"{channel}: {what} of {size} bytes beyond the guarantees "
            f"({receiver.sender_balance} left)",
            GoodbyeCode.LIMIT_EXCEEDED,
        )
    receiver.on_frame(size)
    subscription.references += entries
    return channel


def record_deliveries(writer: FrameWriter, sender: ChannelSender, frames: int, size: int) -> None:
    """``frames`` delivery frames of ``size`` bytes in all were queued
    within the guarantees (no optimism on ``[3, s]``: none is kept for
    retransmission)."""
    sender.record_within_guarantees(frames, size)
    writer.count(frames, size)
