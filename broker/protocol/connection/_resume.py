"""Sessions across connections: what each side keeps of a session
(:meth:`session_state`), and how a new connection restores it — the broker
binds the session's handles again, the client does too and queues, before
anything new, what the broker did not receive.

:class:`Sessions` is a part of a connection: it keeps no state of its own
beyond the parts it is given (the handshake, the output queue, the
guarantees, the handle tables), none of which references it.
"""

from __future__ import annotations

from collections import deque

from .._errors import LocalProtocolError
from .._events import Event, SubscriptionDropped
from .._types import (
    LENGTH_PREFIX,
    SUBSCRIPTION_BINDS,
    TOPIC_BINDS,
    Channel,
    ChannelKind,
    HandleType,
    Role,
)
from ..frames._encode import encode
from ..frames._messages import BindTopic, Subscribe, Welcome
from ..guarantees._receiver import ChannelSender, SentFrame
from ._channels import BIND_CHANNEL
from ._flow import Flow
from ._handle_state import SubscriptionState, TopicState
from ._handles import HandleState, HandleTable
from ._handshake import Handshake
from ._session import BrokerSessionState, ClientSessionState
from ._writer import FrameWriter


def split_frames(data: bytes) -> list[bytes]:
    """The frames (length prefix and body) that ``data`` holds, in order."""
    frames = []
    start = 0
    while start < len(data):
        end = start + LENGTH_PREFIX + int.from_bytes(data[start : start + LENGTH_PREFIX], "big")
        frames.append(data[start:end])
        start = end
    return frames


class Sessions:
    """Saving a session's state, and restoring it on a new connection."""

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

    def session_state(self, *, keep_unconfirmed: bool) -> BrokerSessionState | ClientSessionState:
        """See :meth:`Connection.session_state` (its public form)."""
        welcome = self._handshake.welcome_message
        if welcome is None:
            raise LocalProtocolError("no session before the handshake")
        bound = HandleState.BOUND
        if self.role is Role.BROKER:
            live = {h: t for h, t in self.topics.items() if t.state is bound}
            return BrokerSessionState(
                {h: (t.value, t.bind_size or 0) for h, t in live.items()},
                {
                    h: (s.value, s.bind_size or 0)
                    for h, s in self.subscriptions.items()
                    if s.state is bound
                },
                self.topics.next_handle,
                self.subscriptions.next_handle,
                {h: t.received for h, t in live.items()},
                {h: t.stage for h, t in live.items() if t.stage is not None},
            )
        if not keep_unconfirmed:
            raise LocalProtocolError("this client keeps no unconfirmed publishes: no resume")
        proposed = HandleState.PROPOSED
        live = {h: t for h, t in self.topics.items() if t.state is bound or t.state is proposed}
        subscriptions = {h: s for h, s in self.subscriptions.items() if s.state is bound}
        return ClientSessionState(
            session=welcome.session,
            epoch=welcome.epoch,
            topics={h: t.value for h, t in live.items()},
            freeing_topics=frozenset(h for h, t in live.items() if t.state is proposed),
            subscriptions={h: s.value for h, s in subscriptions.items()},
            next_topic=self.topics.next_handle,
            next_subscription=self.subscriptions.next_handle,
            processed={h: s.processed for h, s in subscriptions.items()},
            retained={h: (t.retained_base, tuple(t.retained or ())) for h, t in live.items()},
            stages={h: t.stage for h, t in live.items() if t.stage is not None},
        )

    # ---------------------------------------------------------------- broker

    def restore_broker(self, state: BrokerSessionState) -> None:
        """Bind the session's handles again and open their channels; the
        bind channels start with the space the live binds hold taken off."""
        self.topics.restore({h: name for h, (name, _) in state.topics.items()}, state.next_topic)
        self.subscriptions.restore(
            {h: info for h, (info, _) in state.subscriptions.items()}, state.next_subscription
        )
        held = {HandleType.TOPIC: 0, HandleType.SUBSCRIPTION: 0}
        for handle, (_, size) in state.topics.items():
            topic = self.topics.bindings[handle]
            topic.bind_size = size
            topic.restored = True
            held[HandleType.TOPIC] += size
        for handle, (_, size) in state.subscriptions.items():
            subscription = self.subscriptions.bindings[handle]
            subscription.bind_size = size
            subscription.restored = True
            held[HandleType.SUBSCRIPTION] += size
        for handle_type, channel in BIND_CHANNEL.items():
            capacity = self._flow.policy.initial_capacity(channel) - held[handle_type]
            self._flow.bind_receivers[channel] = self._flow.new_receiver(channel, max(capacity, 0))
        for handle in state.topics:
            topic = self.topics.bindings[handle]
            topic.received = state.received.get(handle, 0)
            topic.stage = state.stages.get(handle)
            topic.receiver = self._flow.new_receiver(Channel(ChannelKind.PUBLISH, handle))
        for handle in state.subscriptions:
            channel = Channel(ChannelKind.DELIVER, handle)
            self.subscriptions.bindings[handle].sender = ChannelSender(channel)

    # ---------------------------------------------------------------- client

    def restore_client(
        self, state: ClientSessionState, welcome: Welcome, dropped: list[Event]
    ) -> int:
        """Bind the resumed session's handles again and queue, for sending
        before anything new, what the broker did not receive; returns how
        many frames that is. Subscriptions the broker no longer has are
        left out, each reported in ``dropped``. The Welcome is checked."""
        assert welcome.bound is not None
        bound_topics, bound_subscriptions = welcome.bound
        received = welcome.received
        # Topic handles below the broker's count that it no longer lists were freed there.
        topics = {h: name for h, name in state.topics.items() if h >= bound_topics or h in received}
        self.topics.restore(topics, state.next_topic)
        # So are subscription handles it does not list, when it lists them.
        subscriptions = dict(state.subscriptions)
        if welcome.subscriptions is not None:
            for handle in sorted(set(subscriptions).difference(welcome.subscriptions)):
                if handle < bound_subscriptions:
                    name = subscriptions.pop(handle).topic_name
                    dropped.append(SubscriptionDropped(handle, name))
        self.subscriptions.restore(subscriptions, state.next_subscription)
        for handle, subscription in self.subscriptions.bindings.items():
            subscription.processed = state.processed.get(handle, 0)
        resent = 0
        binds = self._flow.bind_senders[TOPIC_BINDS]
        for handle in sorted(topics):
            topic = self.topics.bindings[handle]
            topic.stage = state.stages.get(handle)
            sender = topic.sender = ChannelSender(Channel(ChannelKind.PUBLISH, handle))
            if handle >= bound_topics:
                resent += self._queue_resend(binds, BindTopic(topics[handle], topic.stage))
            base, frames = state.retained.get(handle, (0, ()))
            count = received.get(handle, 0)
            missing = frames[count - base :]
            topic.retained = deque(missing)
            topic.retained_base = count
            for kept in missing:
                # (A message sent in parts is kept as its part frames, joined.)
                for frame in split_frames(kept):
                    sender.retransmit.append(SentFrame(len(frame), frame, None))
            resent += len(missing)
        subscribes = self._flow.bind_senders[SUBSCRIPTION_BINDS]
        for handle, info in sorted(subscriptions.items()):
            if handle >= bound_subscriptions:
                target = info.topic_name if info.topic is None else info.topic
                message = Subscribe(target, info.mode, dict(info.options))
                resent += self._queue_resend(subscribes, message)
            self.subscriptions.bindings[handle].receiver = self._flow.new_receiver(
                Channel(ChannelKind.DELIVER, handle)
            )
        for handle in sorted(state.freeing_topics & topics.keys()):
            # Proposed again once its resent bind and publishes are out.
            self._flow.frees_after_resend[handle] = self.topics.propose_free(handle)
        self._flow.send_deferred_frees()
        return resent

    def _queue_resend(self, sender: ChannelSender, message: BindTopic | Subscribe) -> int:
        frame = encode(message, max_frame=self._writer.peer_max_frame)
        sender.retransmit.append(SentFrame(len(frame), frame, message))
        return 1
