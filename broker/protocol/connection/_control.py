"""Control messages: the guarantee messages a connection receives about its
channels, the small messages every connection answers or passes on (Ping,
Pong, Goodbye, Throttled), and the connection's thin methods for requests
(Commit, Abort, Outcome; ListOffsets, Offsets; Admin, AdminAnswer), which
the ``Requests`` part makes and checks (``_requests``).
"""

from __future__ import annotations

from typing import Any

from .._errors import RemoteProtocolError
from .._events import ConnectionClosed, DropAnnounced, Event, GuaranteesReceived
from .._types import SUBSCRIPTION_BINDS, TOPIC_BINDS, Channel, ChannelKind, Role, channel_sender
from ..frames._messages import (
    Abort,
    Absolve,
    Admin,
    AdminAnswer,
    AdminValue,
    AnnounceDropping,
    Apologise,
    Commit,
    Goodbye,
    IssueGuarantee,
    LimitReceiving,
    LimitSending,
    ListOffsets,
    Offsets,
    Outcome,
    Ping,
    Plead,
    Pong,
    Throttled,
)
from ..guarantees._receiver import ChannelReceiver, ChannelSender
from ._core import ConnectionCore


class ControlHandling(ConnectionCore):
    """Received control messages, and the staging requests."""

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

    def _on_issue_guarantee(self, message: IssueGuarantee, size: int, events: list[Event]) -> None:
        self._check_open(message)
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

    def _on_plead(self, message: Plead, size: int, events: list[Event]) -> None:
        self._check_open(message)
        sender = self._peer_receives(message.channel, events)
        if not self._flow.referable(message.channel):
            # This side proposed freeing the channel's handle: it says nothing
            # more about it, and the channel goes away with the handle.
            return
        absolve = sender.on_plead(message.target)
        if absolve is not None:
            self._writer.queue(absolve)

    def _on_limit_receiving(self, message: LimitReceiving, size: int, events: list[Event]) -> None:
        self._check_open(message)
        sender = self._peer_receives(message.channel, events)
        sender.on_limit_receiving(message.bound)
        self._flow.pump_retransmissions(sender, events)

    def _on_announce_dropping(
        self, message: AnnounceDropping, size: int, events: list[Event]
    ) -> None:
        self._check_open(message)
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

    def _on_absolve(self, message: Absolve, size: int, events: list[Event]) -> None:
        self._check_open(message)
        self._peer_sends(message.channel, events).on_absolve(message.amount)

    def _on_limit_sending(self, message: LimitSending, size: int, events: list[Event]) -> None:
        self._check_open(message)
        self._peer_sends(message.channel, events).on_limit_sending(message.bound)

    def _on_apologise(self, message: Apologise, size: int, events: list[Event]) -> None:
        self._check_open(message)
        receiver = self._peer_sends(message.channel, events)
        receiver.on_apologise()
        self._flow.issue(receiver)

    # ---------------------------------------------------------------- small messages in

    def _on_goodbye(self, message: Goodbye, size: int, events: list[Event]) -> None:
        self._handshake.close()
        events.append(ConnectionClosed(message.code, message.reason, True))

    def _on_ping(self, message: Ping, size: int, events: list[Event]) -> None:
        self._check_open(message)
        self._writer.queue(Pong(message.nonce))

    def _on_passthrough(self, message: Any, size: int, events: list[Event]) -> None:
        self._check_open(message)
        events.append(message)

    def _on_throttled(self, message: Throttled, size: int, events: list[Event]) -> None:
        self._check_open(message)
        if self.role is not Role.CLIENT or channel_sender(message.channel) is not Role.CLIENT:
            raise RemoteProtocolError("Throttled is sent by the broker about a client channel")
        self._handles.check_channel_handle(message.channel, events)
        events.append(message)

    def throttled(self, channel: Channel, throttled: bool) -> None:
        """Broker: advise the client that ``channel`` is (no longer) withheld.

        Refused (:class:`LocalProtocolError`, nothing sent) for the channel of
        a topic handle being freed: the client may have deleted it already.
        """
        self._require_role(Role.BROKER, "throttle")
        self._flow.require_referable(channel)
        self._flow.receiver(channel)
        self._writer.queue(Throttled(channel, throttled))

    # ---------------------------------------------------------------- requests (the Requests part)

    def commit(self, batch: str, members: list[tuple[str, int]]) -> int:
        """Client: ask the broker to make the listed members of ``batch``
        visible, each with the number of publishes it staged, and to discard
        the batch's other members; returns the request number its
        :class:`Outcome` will carry."""
        return self._requests.commit(batch, members)

    def abort(self, batch: str) -> int:
        """Client: ask the broker to discard everything staged in ``batch``;
        returns the request number its :class:`Outcome` will carry."""
        return self._requests.abort(batch)

    def outcome(self, request: int, status: int, messages: int, reason: str = "") -> None:
        """Broker: answer Commit or Abort number ``request``."""
        self._requests.outcome(request, status, messages, reason)

    def list_offsets(self, topics: list[str] | None = None) -> int:
        """Client: ask for the first and next offsets of ``topics`` (None: of
        every topic with a log the client may subscribe to); returns the
        request number its :class:`Offsets` will carry."""
        return self._requests.list_offsets(topics)

    def offsets(self, request: int, topics: list[tuple[str, int, int]], reason: str = "") -> None:
        """Broker: answer ListOffsets number ``request``."""
        self._requests.offsets(request, topics, reason)

    def admin(self, command: str, arguments: dict[str, AdminValue] | None = None) -> int:
        """Client: ask for topic administration ``command`` (see the protocol
        document); returns the request number its :class:`AdminAnswer` will
        carry."""
        return self._requests.admin(command, arguments)

    def admin_answer(
        self,
        request: int,
        status: int,
        rows: list[dict[str, AdminValue]],
        after: str | None = None,
        reason: str = "",
    ) -> None:
        """Broker: answer Admin number ``request``."""
        self._requests.admin_answer(request, status, rows, after, reason)

    def _on_staging_notice(
        self,
        message: Commit | Abort | Outcome | ListOffsets | Offsets | Admin | AdminAnswer,
        size: int,
        events: list[Event],
    ) -> None:
        self._requests.on_request(message, size, events)
