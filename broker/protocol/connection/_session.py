"""What each side keeps of a session between its connections.

A session outlives its TCP connection: its handles stay bound, the broker
counts the publishes it received per topic handle, the client counts what
it processed per subscription and keeps every publish the broker has not
confirmed. A new :class:`~broker.protocol.Connection` built from one of
these records resumes the session exactly where the old one stopped
(``docs/protocol.md``, Sessions).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from .._errors import RemoteProtocolError
from .._types import PROTOCOL_VERSION
from ..frames._messages import Options, Stage, Welcome


@dataclass(slots=True, frozen=True)
class SubscriptionInfo:
    """What a subscription handle is bound to: a topic handle and its name,
    or (``topic`` None) a topic pattern, in ``topic_name``."""

    topic: int | None
    topic_name: str
    mode: str
    options: Options


@dataclass(slots=True, frozen=True)
class BrokerSessionState:
    """The broker's record of a session's handles (see :meth:`Connection.session_state`)."""

    #: Live topic handles: their name and the size of their bind frame (which
    #: keeps holding space on the bind channel while the handle lives).
    topics: dict[int, tuple[str, int]]
    #: Live subscription handles, with the size of their bind frame.
    subscriptions: dict[int, tuple[SubscriptionInfo, int]]
    #: The least topic and subscription handles never bound in the session.
    next_topic: int
    next_subscription: int
    #: Per live topic handle: Publish frames accepted in the whole session.
    received: dict[int, int]
    #: Live topic handles whose publishes are staged, and where.
    stages: dict[int, Stage] = field(default_factory=dict)

    def for_resume(self, processed: Mapping[int, int]) -> tuple[BrokerSessionState, list[int]]:
        """What to restore for a client resuming with Hello ``processed``, and
        the subscription handles to drop: those the client no longer lists
        (it gave them up, or was freeing them when the connection broke)."""
        dropped = [handle for handle in self.subscriptions if handle not in processed]
        kept = {h: v for h, v in self.subscriptions.items() if h in processed}
        return replace(self, subscriptions=kept), dropped


@dataclass(slots=True, frozen=True)
class ClientSessionState:
    """The client's record of a session (see :meth:`Connection.session_state`)."""

    session: bytes
    epoch: bytes
    #: Live topic handles and their names (those being freed included).
    topics: dict[int, str]
    #: Topic handles this side proposed to free (proposed again on resume).
    freeing_topics: frozenset[int]
    #: Live subscription handles (those being freed are given up).
    subscriptions: dict[int, SubscriptionInfo]
    next_topic: int
    next_subscription: int
    #: Per subscription handle: the last sequence number processed.
    processed: dict[int, int]
    #: Per topic handle: how many publishes the broker confirmed, and the
    #: encoded Publish frames sent after those, in order.
    retained: dict[int, tuple[int, tuple[bytes, ...]]]
    #: Live topic handles whose publishes are staged, and where.
    stages: dict[int, Stage] = field(default_factory=dict)

    def published(self, topic: int) -> int:
        """Publishes sent on ``topic`` in the whole session."""
        base, frames = self.retained.get(topic, (0, ()))
        return base + len(frames)


def check_welcome(welcome: Welcome, resume: ClientSessionState | None) -> None:
    """Raise :class:`RemoteProtocolError` unless a client that asked to
    resume ``resume`` (None: a new session) can accept ``welcome``; checked
    before the Welcome changes anything."""
    if welcome.version != PROTOCOL_VERSION:
        raise RemoteProtocolError(f"unsupported protocol version {welcome.version}")
    if welcome.max_frame < 64 or welcome.heartbeat_ms == 0 or welcome.lease_ms == 0:
        raise RemoteProtocolError("Welcome with unusable max_frame, heartbeat or lease")
    if not welcome.resumed:
        if welcome.bound is not None or welcome.subscriptions is not None:
            raise RemoteProtocolError(
                "Welcome: 'bound' and 'subscriptions' come with a resumed session only"
            )
        return
    if resume is None or welcome.session != resume.session:
        raise RemoteProtocolError("Welcome resumes a session this client did not ask for")
    if welcome.bound is None:
        raise RemoteProtocolError("Welcome: a resumed session comes with 'bound'")
    bound_topics, bound_subscriptions = welcome.bound
    if bound_topics > resume.next_topic or bound_subscriptions > resume.next_subscription:
        raise RemoteProtocolError("Welcome: the broker bound handles this client never did")
    for handle, count in welcome.received.items():
        base, frames = resume.retained.get(handle, (0, ()))
        if handle not in resume.topics or handle >= bound_topics:
            raise RemoteProtocolError(f"Welcome: topic handle {handle} is not bound")
        if not base <= count <= base + len(frames):
            raise RemoteProtocolError(
                f"Welcome: {count} publishes received on topic handle {handle}, "
                f"but {base} were confirmed and {base + len(frames)} sent"
            )
    for handle in welcome.subscriptions or ():
        if handle not in resume.subscriptions or handle >= bound_subscriptions:
            raise RemoteProtocolError(
                f"Welcome: subscription handle {handle} is not one this client resumes"
            )
