"""Control messages: the guarantee messages a connection receives about its
channels, the small messages every connection answers or passes on (Ping,
Pong, Goodbye, Throttled): the ``Control`` part. (Requests and their
answers are the ``Requests`` part's, ``_requests``.)
"""

from __future__ import annotations

from typing import Any

from .._errors import RemoteProtocolError
from .._events import ConnectionClosed, DropAnnounced, Event, GuaranteesReceived
from .._types import SUBSCRIPTION_BINDS, TOPIC_BINDS, Channel, ChannelKind, Role, channel_sender
from ..frames._messages import (
    Absolve,
    AnnounceDropping,
    Apologise,
    Goodbye,
    IssueGuarantee,
    LimitReceiving,
    LimitSending,
    Ping,
    Plead,
    Pong,
    Throttled,
)
from ..guarantees._receiver import ChannelReceiver, ChannelSender
from ._binds import Handles
from ._flow import Flow
from ._handle_state import SubscriptionState, TopicState
from ._handles import HandleTable
from ._handshake import Handshake, require_role
from ._writer import FrameWriter


class Control:
    """Received control messages, and Throttled; a part of the connection,
    which references the parts it is given, never the connection."""

    def __init__(
        self,
        role: Role,
        *,
        handshake: Handshake,
        writer: FrameWriter,
        flow: Flow,
        handles: Handles,
        topics: HandleTable[TopicState],
        subscriptions: HandleTable[SubscriptionState],
    ) -> None:
        self.role = role
        self._handshake = handshake
        self._writer = writer
        self._flow = flow
        self._handles = handles
        self.topics = topics
        self.subscriptions = subscriptions

    # ---------------------------------------------------------------- guarantee messages in

    def _peer_receives(self, channel: Channel, events: list[Event]) -> ChannelSender:
        """The sender state for a control message the channel's receiver sent."""
        if channel_sender(channel) is not self.role:
            raise RemoteProtocolError(f"{channel} is not a channel this side sends on")
        self._handles.check_channel_handle(channel, events)
        sender = self._flow.sender_of(channel)
        if sender is None:
            raise RemoteProtocolError(f"{channel} is not open")
        return sender

    def _peer_sends(self, channel: Channel, events: list[Event]) -> ChannelReceiver:
        """The receiver state for a control message the channel's sender sent."""
        if channel_sender(channel) is self.role:
            raise RemoteProtocolError(f"{channel} is not a channel this side receives on")
        self._handles.check_channel_handle(channel, events)
        receiver = self._flow.receiver_of(channel)
        if receiver is None:
            raise RemoteProtocolError(f"{channel} is not open")
        return receiver

    def on_issue_guarantee(self, message: IssueGuarantee, size: int, events: list[Event]) -> None:
        self._handshake.check_open(message)
        sender = self._peer_receives(message.channel, events)
        sender.on_guarantee(message.amount)
        self._flow.pump_retransmissions(sender, events)
        if message.channel == SUBSCRIPTION_BINDS and self.role is Role.CLIENT:
            self._issue_newly_confirmed_subscriptions()
        events.append(GuaranteesReceived(message.channel, sender.balance))

    def _issue_newly_confirmed_subscriptions(self) -> None:
        for _handle, state in self.subscriptions.items():
            receiver = state.receiver
            if receiver is not None and receiver.issued_total == 0:
                self._flow.issue(receiver)

    def on_plead(self, message: Plead, size: int, events: list[Event]) -> None:
        self._handshake.check_open(message)
        sender = self._peer_receives(message.channel, events)
        if not self._flow.referable(message.channel):
            # This side proposed freeing the channel's handle: it says nothing
            # more about it, and the channel goes away with the handle.
            return
        absolve = sender.on_plead(message.target)
        if absolve is not None:
            self._writer.queue(absolve)

    def on_limit_receiving(self, message: LimitReceiving, size: int, events: list[Event]) -> None:
        self._handshake.check_open(message)
        sender = self._peer_receives(message.channel, events)
        sender.on_limit_receiving(message.bound)
        self._flow.pump_retransmissions(sender, events)

    def on_announce_dropping(
        self, message: AnnounceDropping, size: int, events: list[Event]
    ) -> None:
        self._handshake.check_open(message)
        sender = self._peer_receives(message.channel, events)
        apology, dropped = sender.on_announce_dropping()
        self._writer.queue(apology)
        events.append(
            DropAnnounced(message.channel, len(dropped), sum(entry.size for entry in dropped))
        )
        if message.channel == TOPIC_BINDS and self.role is Role.CLIENT:
            # The broker discards, unannounced, publishes on handles whose bind was dropped.
            first = self.topics.next_handle - len(dropped)
            for handle in range(first, self.topics.next_handle):
                publish_sender = self._flow.sender_of(Channel(ChannelKind.PUBLISH, handle))
                if publish_sender is not None and publish_sender.unconfirmed:
                    lost = publish_sender.forget_unconfirmed()
                    events.append(
                        DropAnnounced(publish_sender.channel, len(lost), sum(e.size for e in lost))
                    )
        self._flow.pump_retransmissions(sender, events)

    def on_absolve(self, message: Absolve, size: int, events: list[Event]) -> None:
        self._handshake.check_open(message)
        self._peer_sends(message.channel, events).on_absolve(message.amount)

    def on_limit_sending(self, message: LimitSending, size: int, events: list[Event]) -> None:
        self._handshake.check_open(message)
        self._peer_sends(message.channel, events).on_limit_sending(message.bound)

    def on_apologise(self, message: Apologise, size: int, events: list[Event]) -> None:
        self._handshake.check_open(message)
        receiver = self._peer_sends(message.channel, events)
        receiver.on_apologise()
        self._flow.issue(receiver)

    # ---------------------------------------------------------------- small messages in

    def on_goodbye(self, message: Goodbye, size: int, events: list[Event]) -> None:
        self._handshake.close()
        events.append(ConnectionClosed(message.code, message.reason, True))

    def on_ping(self, message: Ping, size: int, events: list[Event]) -> None:
        self._handshake.check_open(message)
        self._writer.queue(Pong(message.nonce))

    def on_passthrough(self, message: Any, size: int, events: list[Event]) -> None:
        self._handshake.check_open(message)
        events.append(message)

    def on_throttled(self, message: Throttled, size: int, events: list[Event]) -> None:
        self._handshake.check_open(message)
        if self.role is not Role.CLIENT or channel_sender(message.channel) is not Role.CLIENT:
            raise RemoteProtocolError("Throttled is sent by the broker about a client channel")
        self._handles.check_channel_handle(message.channel, events)
        events.append(message)

    def throttled(self, channel: Channel, throttled: bool) -> None:
        """See :meth:`Connection.throttled` (its public form)."""
        require_role(self.role, Role.BROKER, "throttle")
        self._flow.require_referable(channel)
        self._flow.receiver(channel)
        self._writer.queue(Throttled(channel, throttled))
