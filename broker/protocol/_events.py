"""Events a :class:`~broker.protocol.Connection` reports to its application.

Besides these classes, the messages :class:`~broker.protocol.Ack`,
:class:`~broker.protocol.Settle`, :class:`~broker.protocol.Gap`, :class:`~broker.protocol.Confirm`,
:class:`~broker.protocol.Throttled`, :class:`~broker.protocol.Pong`,
:class:`~broker.protocol.Commit`, :class:`~broker.protocol.Abort` and
:class:`~broker.protocol.Outcome` are reported as they arrive.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._errors import RemoteProtocolError
from ._types import Channel
from .frames._messages import (
    Abort,
    Ack,
    Admin,
    AdminAnswer,
    Commit,
    Confirm,
    Deliver,
    DeliverMany,
    EncodedDeliveries,
    Gap,
    Hello,
    ListOffsets,
    Matched,
    MatchedGap,
    Offsets,
    Options,
    Outcome,
    Pong,
    Publish,
    PublishMany,
    Settle,
    Stage,
    Throttled,
    Welcome,
)


@dataclass(slots=True)
class HelloReceived:
    """The client opened the connection (broker side); answer with ``welcome()``."""

    hello: Hello


@dataclass(slots=True)
class WelcomeReceived:
    """The broker accepted the connection (client side).

    On a resumed session, ``resent`` frames (binds and publishes the broker
    had not received) wait to be sent again, before anything new.
    """

    welcome: Welcome
    resent: int = 0


@dataclass(slots=True)
class TopicBound:
    """The broker processed a BindTopic: ``handle`` names topic ``name``
    (its publishes staged in ``stage``, if given)."""

    handle: int
    name: str
    stage: Stage | None = None


@dataclass(slots=True)
class Subscribed:
    """The broker processed a Subscribe: ``handle`` is a subscription to
    ``topic_name`` (``topic`` None: to the topics pattern ``topic_name``
    matches)."""

    handle: int
    topic: int | None
    topic_name: str
    mode: str
    options: Options


@dataclass(slots=True)
class PublishReceived:
    """A Publish was buffered; call ``release(event)`` once it is processed."""

    message: Publish
    topic_name: str
    channel: Channel
    size: int


@dataclass(slots=True)
class PublishManyReceived:
    """A PublishMany was buffered; release it once all its entries are
    processed (``release(event)``, or ``release_frames`` with one count per
    entry)."""

    message: PublishMany
    topic_name: str
    channel: Channel
    size: int


@dataclass(slots=True)
class DeliverReceived:
    """A Deliver was buffered; call ``release(event)`` once it is processed."""

    message: Deliver
    channel: Channel
    size: int


@dataclass(slots=True)
class DeliverManyReceived:
    """A DeliverMany was buffered; call ``release(event)`` once all its
    entries are processed (or ``release_frames`` with one count per entry)."""

    message: DeliverMany
    channel: Channel
    size: int


@dataclass(slots=True)
class EncodedDeliveriesReceived:
    """A DeliverMany was buffered and is given with its entries encoded (see
    :class:`EncodedDeliveries`); released as a :class:`DeliverManyReceived`."""

    message: EncodedDeliveries
    channel: Channel
    size: int


@dataclass(slots=True)
class GuaranteesReceived:
    """Room to send on ``channel`` grew; ``balance`` is the new balance."""

    channel: Channel
    balance: int


@dataclass(slots=True)
class DropAnnounced:
    """The peer dropped ``frames`` frames (``size`` bytes) sent on ``channel``.

    They are retransmitted, in order and before anything new, as guarantees
    allow.
    """

    channel: Channel
    frames: int
    size: int


@dataclass(slots=True)
class FramesAbandoned:
    """Dropped frames that can never be retransmitted (the channel closed)."""

    channel: Channel
    frames: int


@dataclass(slots=True)
class HandleFreeProposed:
    """The peer proposed freeing a handle: stop using it (the protocol answered)."""

    handle_type: int
    handle: int


@dataclass(slots=True)
class HandleDeleted:
    """A binding is gone on this side; its channel state is gone with it."""

    handle_type: int
    handle: int


@dataclass(slots=True)
class SubscriptionDropped:
    """Client: the resumed session no longer has this subscription (the
    broker ended it while the client was away, its ``Welcome`` says so).
    The handle is gone on this side too; nothing more will be delivered on
    it, and the application should end whatever consumes it."""

    subscription: int
    topic_name: str


@dataclass(slots=True)
class ConnectionClosed:
    """The connection is over: a Goodbye was received, or sent after ``error``."""

    code: int
    reason: str
    by_peer: bool
    error: RemoteProtocolError | None = None


Event = (
    HelloReceived
    | WelcomeReceived
    | TopicBound
    | Subscribed
    | PublishReceived
    | PublishManyReceived
    | DeliverReceived
    | DeliverManyReceived
    | EncodedDeliveriesReceived
    | GuaranteesReceived
    | DropAnnounced
    | FramesAbandoned
    | HandleFreeProposed
    | HandleDeleted
    | SubscriptionDropped
    | ConnectionClosed
    | Ack
    | Settle
    | Gap
    | Confirm
    | Throttled
    | Pong
    | Commit
    | Abort
    | Outcome
    | ListOffsets
    | Offsets
    | Matched
    | MatchedGap
    | Admin
    | AdminAnswer
)
