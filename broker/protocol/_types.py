"""Small value types of the wire protocol: channels, codes, limits."""

from __future__ import annotations

from enum import IntEnum
from typing import NamedTuple

#: Protocol version spoken by this implementation (``Hello``/``Welcome``).
PROTOCOL_VERSION = 1
#: Largest value of every integer field on the wire (unsigned 64 bit).
U64_MAX = (1 << 64) - 1
#: Bytes of the length prefix; a frame's size for guarantees is this plus its body.
LENGTH_PREFIX = 4
#: Default upper bound of a frame body, announced in ``Welcome``.
DEFAULT_MAX_FRAME = 1 << 20
#: A sender's optimism (bytes in flight beyond its guarantees) is at most
#: this many frames of the peer's ``max_frame``; a receiver may end a
#: connection whose sender drops more than that beyond its guarantees
#: (``Policy.max_dropping``).
OPTIMISM_FRAMES = 16


class ChannelKind(IntEnum):
    """The four kinds of logical channel."""

    TOPIC_BINDS = 0  # [0, 0] client -> broker, BindTopic
    SUBSCRIPTION_BINDS = 1  # [1, 0] client -> broker, Subscribe
    PUBLISH = 2  # [2, t] client -> broker, Publish to topic handle t
    DELIVER = 3  # [3, s] broker -> client, Deliver of subscription handle s


class Channel(NamedTuple):
    """A logical channel id ``[kind, index]``."""

    kind: int
    index: int  # type: ignore[assignment]  # shadows tuple.index, as the wire format names it

    def __repr__(self) -> str:
        return f"[{self.kind},{self.index}]"


TOPIC_BINDS = Channel(ChannelKind.TOPIC_BINDS, 0)
SUBSCRIPTION_BINDS = Channel(ChannelKind.SUBSCRIPTION_BINDS, 0)


class Role(IntEnum):
    """Which end of a connection an endpoint is."""

    CLIENT = 0
    BROKER = 1


def channel_sender(channel: Channel) -> Role:
    """The role that sends the channel's messages (the other one receives them)."""
    return Role.BROKER if channel.kind == ChannelKind.DELIVER else Role.CLIENT


class HandleType(IntEnum):
    """The two handle spaces; both are bound by the client."""

    TOPIC = 0
    SUBSCRIPTION = 1


class GoodbyeCode(IntEnum):
    """Why a connection is being closed (``Goodbye.code``)."""

    NORMAL = 0
    PROTOCOL_ERROR = 1
    FRAME_TOO_LARGE = 2
    LIMIT_EXCEEDED = 3
    LEASE_EXPIRED = 4
    SHUTTING_DOWN = 5
    NOT_AUTHORISED = 6
    UNKNOWN_SESSION = 7
    REDIRECT = 8


class MessageType(IntEnum):
    """Type codes, the first element of every frame's array."""

    HELLO = 0
    WELCOME = 1
    PING = 2
    PONG = 3
    GOODBYE = 4
    THROTTLED = 5
    ISSUE_GUARANTEE = 10
    ABSOLVE = 11
    PLEAD = 12
    LIMIT_SENDING = 13
    LIMIT_RECEIVING = 14
    ANNOUNCE_DROPPING = 15
    APOLOGISE = 16
    FREE_HANDLE = 20
    ACK = 21
    GAP = 22
    CONFIRM = 23
    BIND_TOPIC = 30
    SUBSCRIBE = 31
    PUBLISH = 32
    DELIVER = 33
    DELIVER_MANY = 34
    DELIVER_TIMED = 35
    PUBLISH_MANY = 36
    FRAME_PART = 37
    DELIVER_GROUP = 38
    SETTLE = 39
    COMMIT = 40
    ABORT = 41
    OUTCOME = 42
    LIST_OFFSETS = 43
    OFFSETS = 44
    MATCHED = 45
    DELIVER_MATCHED = 46
    MATCHED_GAP = 47
    ADMIN = 48
    ADMIN_ANSWER = 49


class AdminStatus(IntEnum):
    """How the broker answered an ``Admin`` request (``AdminAnswer.status``)."""

    #: Done; the rows are the answer (``next`` says whether more follow).
    OK = 0
    #: Nothing was done: the request is wrong (``reason`` says what to change).
    REFUSED = 1
    #: Nothing was done: the client's principal lacks the ``admin`` permission.
    NOT_PERMITTED = 2
    #: Nothing was done: the topic is served by another worker (``reason`` names it).
    ELSEWHERE = 3


class OutcomeStatus(IntEnum):
    """How the broker answered a ``Commit`` or ``Abort`` (``Outcome.status``)."""

    #: The listed members' staged publishes are routed now, in order.
    COMMITTED = 0
    #: The batch was committed before: nothing more is routed (idempotent).
    DUPLICATE = 1
    #: What the batch had staged is discarded.
    ABORTED = 2
    #: Nothing was done (``Outcome.reason`` says why, e.g. a count mismatch).
    REFUSED = 3


class SettleOutcome(IntEnum):
    """What a client's ``Settle`` says of the deliveries it names
    (``Settle.outcome``)."""

    #: Processed: the records are done for the group.
    DONE = 0
    #: Not processed: deliver the records again, after ``detail`` ms.
    RETRY = 1
    #: Never to be processed (``detail`` says why): not delivered again.
    REJECT = 2
    #: Still being processed: the client holds on to them (no redelivery yet).
    IN_PROGRESS = 3


class DeliveryMode:
    """Subscription delivery modes (``Subscribe.mode``)."""

    RELIABLE = "reliable"
    LOSSY = "lossy"
    LATEST = "latest"
    ALL = frozenset({RELIABLE, LOSSY, LATEST})
