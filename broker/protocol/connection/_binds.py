"""Handles, as a part of a connection: binding them (the client sends
BindTopic and Subscribe, the broker processes them), resolving the handles a
received message references, and freeing them (``FreeHandle`` both ways).

:class:`Handles` owns the binds received and not processed yet (a broker
may defer them), and works on the handle tables it is given; it references
the handshake (is the connection open), the output queue and the
guarantees (:class:`Flow`), none of which references it.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from .._errors import LocalProtocolError, RemoteProtocolError
from .._events import Event, HandleFreeProposed, Subscribed, TopicBound
from .._names import check_topic_name, topic_name_problem
from .._patterns import check_topic_pattern
from .._types import (
    SUBSCRIPTION_BINDS,
    TOPIC_BINDS,
    Channel,
    ChannelKind,
    DeliveryMode,
    HandleType,
    Role,
)
from ..frames._messages import BindTopic, FreeHandle, Options, Stage, Subscribe
from ..guarantees._receiver import ChannelSender
from ._channels import HANDLE_TYPE_OF_KIND
from ._flow import Flow
from ._handle_state import SubscriptionState, TopicState
from ._handles import HandleTable
from ._handshake import Handshake
from ._session import SubscriptionInfo
from ._writer import FrameWriter


class Handles:
    """Binding, resolving and freeing handles (see the module)."""

    def __init__(
        self,
        role: Role,
        *,
        handshake: Handshake,
        writer: FrameWriter,
        flow: Flow,
        topics: HandleTable[TopicState],
        subscriptions: HandleTable[SubscriptionState],
    ) -> None:
        self.role = role
        self._handshake = handshake
        self._writer = writer
        self._flow = flow
        self.topics = topics
        self.subscriptions = subscriptions
        #: Broker: binds received and not processed yet, per handle type.
        self._pending_binds: dict[HandleType, deque[tuple[BindTopic | Subscribe, int]]] = {
            HandleType.TOPIC: deque(),
            HandleType.SUBSCRIPTION: deque(),
        }

    def _table(self, handle_type: HandleType | int) -> HandleTable[Any]:
        return self.topics if handle_type == HandleType.TOPIC else self.subscriptions

    def _require_role(self, role: Role, what: str) -> None:
        if self.role is not role:
            raise LocalProtocolError(f"only a {role.name.lower()} can {what}")

    # ---------------------------------------------------------------- references from the peer

    def resolve_peer_reference(
        self, handle_type: HandleType, handle: int, events: list[Event]
    ) -> TopicState | SubscriptionState | None:
        """The state of the handle a received message references, processing
        pending binds first.

        None means the handle is still unbound: its bind was dropped.
        """
        if handle_type == HandleType.TOPIC:
            return self.resolve_topic(handle, events)
        return self.resolve_subscription(handle, events)

    def resolve_topic(self, handle: int, events: list[Event]) -> TopicState | None:
        """:meth:`resolve_peer_reference` of a topic handle."""
        topic = self.topics.resolve_remote(handle)
        if topic is None and self._pending_binds[HandleType.TOPIC]:
            self.process_pending(HandleType.TOPIC, events)
            topic = self.topics.resolve_remote(handle)
        return topic

    def resolve_subscription(self, handle: int, events: list[Event]) -> SubscriptionState | None:
        """:meth:`resolve_peer_reference` of a subscription handle."""
        subscription = self.subscriptions.resolve_remote(handle)
        if subscription is None and self._pending_binds[HandleType.SUBSCRIPTION]:
            self.process_pending(HandleType.SUBSCRIPTION, events)
            subscription = self.subscriptions.resolve_remote(handle)
        return subscription

    def resolve_required(
        self, handle_type: HandleType, handle: int, events: list[Event], what: str
    ) -> TopicState | SubscriptionState:
        binding = self.resolve_peer_reference(handle_type, handle, events)
        if binding is None:
            raise RemoteProtocolError(
                f"{what} references unbound {handle_type.name.lower()} handle {handle}"
            )
        return binding

    def check_channel_handle(self, channel: Channel, events: list[Event]) -> None:
        handle_type = HANDLE_TYPE_OF_KIND.get(channel.kind)
        if handle_type is not None:
            self.resolve_required(handle_type, channel.index, events, "control message")

    # ---------------------------------------------------------------- freeing

    def free_handle(self, handle_type: HandleType, handle: int) -> None:
        """See :meth:`Connection.free_handle` (its public form)."""
        self._handshake.require_open()
        table = self._table(handle_type)
        table.resolve_local(handle)
        if self.role is Role.CLIENT:
            if not self._flow.confirmed(handle_type, handle):
                raise LocalProtocolError(f"handle {handle} is not confirmed yet")
            if handle_type == HandleType.TOPIC:
                sender = self._flow.sender(Channel(ChannelKind.PUBLISH, handle))
                if sender.unconfirmed or sender.retransmit:
                    raise LocalProtocolError(
                        f"topic handle {handle} still has unconfirmed publishes"
                    )
                subscribes = self._flow.bind_senders[SUBSCRIPTION_BINDS]
                for entry in (*subscribes.unconfirmed, *subscribes.retransmit):
                    if entry.message.topic == handle:
                        raise LocalProtocolError(
                            f"topic handle {handle} has an unconfirmed Subscribe"
                        )
        self._writer.queue(table.propose_free(handle))

    def on_free_handle(self, message: FreeHandle, size: int, events: list[Event]) -> None:
        self._handshake.check_open(message)
        handle_type = HandleType(message.handle_type)
        if self._pending_binds[handle_type]:
            self.resolve_peer_reference(handle_type, message.handle, events)
        table = self._table(handle_type)
        state = table.bindings.get(message.handle)
        reply, deleted = table.on_free(message.handle, message.mine)
        if reply is not None:
            self._writer.queue(reply)
            events.append(HandleFreeProposed(int(handle_type), message.handle))
        if deleted:
            assert state is not None  # on_free refuses an unbound handle
            self._flow.on_deleted(handle_type, message.handle, state, events)

    # ---------------------------------------------------------------- binds (client side)

    def bind_topic(self, name: str, stage: Stage | None = None) -> int:
        """See :meth:`Connection.bind_topic` (its public form)."""
        self._require_role(Role.CLIENT, "bind topics")
        self._handshake.require_open()
        check_topic_name(name)
        self._flow.send_frame(self._flow.bind_senders[TOPIC_BINDS], BindTopic(name, stage))
        handle = self.topics.bind(name)
        state = self.topics.bindings[handle]
        state.stage = stage
        state.sender = ChannelSender(Channel(ChannelKind.PUBLISH, handle))
        return handle

    def subscribe(
        self, topic: int, mode: str = DeliveryMode.RELIABLE, options: Options | None = None
    ) -> int:
        """See :meth:`Connection.subscribe` (its public form)."""
        self._require_role(Role.CLIENT, "subscribe")
        self._handshake.require_open()
        if mode not in DeliveryMode.ALL:
            raise LocalProtocolError(f"unknown delivery mode {mode!r}")
        topic_state = self.topics.resolve_local(topic)
        if topic_state.stage is not None:
            raise LocalProtocolError(f"topic handle {topic} is staged: it cannot be subscribed to")
        if not self._flow.confirmed(HandleType.TOPIC, topic):
            raise LocalProtocolError(f"topic handle {topic} is not confirmed yet")
        opts = dict(options or {})
        self._flow.send_frame(
            self._flow.bind_senders[SUBSCRIPTION_BINDS], Subscribe(topic, mode, opts)
        )
        handle = self.subscriptions.bind(SubscriptionInfo(topic, topic_state.value, mode, opts))
        self.subscriptions.bindings[handle].receiver = self._flow.new_receiver(
            Channel(ChannelKind.DELIVER, handle)
        )
        return handle

    def subscribe_pattern(
        self, pattern: str, mode: str = DeliveryMode.RELIABLE, options: Options | None = None
    ) -> int:
        """See :meth:`Connection.subscribe_pattern` (its public form)."""
        self._require_role(Role.CLIENT, "subscribe")
        self._handshake.require_open()
        if mode not in DeliveryMode.ALL:
            raise LocalProtocolError(f"unknown delivery mode {mode!r}")
        check_topic_pattern(pattern)
        opts = dict(options or {})
        self._flow.send_frame(
            self._flow.bind_senders[SUBSCRIPTION_BINDS], Subscribe(pattern, mode, opts)
        )
        handle = self.subscriptions.bind(SubscriptionInfo(None, pattern, mode, opts))
        state = self.subscriptions.bindings[handle]
        state.receiver = self._flow.new_receiver(Channel(ChannelKind.DELIVER, handle))
        state.matches = {}
        return handle

    # ---------------------------------------------------------------- binds (broker side)

    def on_bind_frame(self, message: BindTopic | Subscribe, size: int, events: list[Event]) -> None:
        self._handshake.check_open(message)
        if self.role is not Role.BROKER:
            raise RemoteProtocolError(f"{type(message).__name__} is sent by clients")
        if isinstance(message, Subscribe):
            if message.mode not in DeliveryMode.ALL:
                raise RemoteProtocolError(f"unknown delivery mode {message.mode[:24]!r}")
            if type(message.topic) is int:  # (text: a pattern, checked by the decoder)
                self.resolve_required(HandleType.TOPIC, message.topic, events, "Subscribe")
                if self.topics.bindings[message.topic].stage is not None:
                    raise RemoteProtocolError(f"Subscribe on staged topic handle {message.topic}")
        elif (problem := topic_name_problem(message.name)) is not None:
            raise RemoteProtocolError(f"BindTopic: {problem}")
        receiver = self._flow.bind_receivers[message.channel]
        accepted, out = receiver.on_frame(size)
        self._writer.queue_all(out)
        if not accepted:
            return
        if receiver.sender_balance < 0:
            self._flow.issue(receiver)  # confirm the optimistic frame without delay
        if isinstance(message, Subscribe):
            if type(message.topic) is int:
                self.topics.acquire(message.topic)
            handle_type = HandleType.SUBSCRIPTION
        else:
            handle_type = HandleType.TOPIC
        self._pending_binds[handle_type].append((message, size))
        if self._flow.policy.process_binds_on_arrival:
            self.process_pending(handle_type, events)

    def process_binds(self) -> list[Event]:
        """See :meth:`Connection.process_binds` (its public form)."""
        events: list[Event] = []
        for handle_type in (HandleType.TOPIC, HandleType.SUBSCRIPTION):
            self.process_pending(handle_type, events)
        return events

    def process_pending(self, handle_type: HandleType, events: list[Event]) -> None:
        pending = self._pending_binds[handle_type]
        if handle_type == HandleType.SUBSCRIPTION and self._pending_binds[HandleType.TOPIC]:
            self.process_pending(HandleType.TOPIC, events)
        while pending:
            message, size = pending.popleft()
            if isinstance(message, BindTopic):
                handle = self.topics.bind(message.name)
                topic = self.topics.bindings[handle]
                topic.bind_size = size
                topic.stage = message.stage
                events.append(TopicBound(handle, message.name, message.stage))
                topic.receiver = self._flow.new_receiver(Channel(ChannelKind.PUBLISH, handle))
            else:
                topic_handle: int | None = None
                if isinstance(message.topic, str):
                    topic_name = message.topic
                else:
                    topic_handle = message.topic
                    topic_binding = self.topics.get(message.topic)
                    assert topic_binding is not None  # referenced, so not deleted
                    topic_name = topic_binding.value
                info = SubscriptionInfo(topic_handle, topic_name, message.mode, message.options)
                handle = self.subscriptions.bind(info)
                subscription = self.subscriptions.bindings[handle]
                subscription.bind_size = size
                subscription.sender = ChannelSender(Channel(ChannelKind.DELIVER, handle))
                events.append(
                    Subscribed(handle, topic_handle, topic_name, message.mode, message.options)
                )
                if topic_handle is not None:
                    self._flow.release_reference(HandleType.TOPIC, topic_handle, events)
