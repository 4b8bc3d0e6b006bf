"""The messages of the wire protocol, one class per type code.

Instances are plain records; treat them as immutable. Channel messages
(``BindTopic``, ``Subscribe``, ``Publish``, ``Deliver``) travel on a logical
channel implied by their fields and count against guarantees; every other
message is a control message, processed at once and never buffered.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from .._origins import OriginRun
from .._owners import Cluster
from .._types import (
    SUBSCRIPTION_BINDS,
    TOPIC_BINDS,
    Channel,
    ChannelKind,
    MessageType,
    SettleOutcome,
)

#: Headers of a Publish/Deliver: ordered (name, value) pairs; names may repeat
#: (the semantics of Kafka record headers).
Headers = list[tuple[str, bytes]]
#: Subscription options: a flat map of scalar values.
Options = dict[str, "int | str | bool | float | None"]


@dataclass(slots=True)
class Hello:
    """First frame of a client: who it is and which session it resumes."""

    TYPE: ClassVar[MessageType] = MessageType.HELLO
    version: int
    client: str
    session: bytes | None = None
    #: For a resume: per subscription handle, the last sequence processed.
    processed: dict[int, int] = field(default_factory=dict)
    #: The client's credential, for a broker that authenticates; ``None`` sends none.
    token: str | None = field(default=None, repr=False)
    #: The client reads ``DeliverMany`` frames (the broker then may send them).
    deliver_many: bool = False
    #: The client asks for the membership of a multi-worker broker (the
    #: Welcome's ``cluster``), to reach each topic's owner directly.
    metadata: bool = False
    #: The client would send ``PublishMany`` frames (if the Welcome allows).
    publish_many: bool = False
    #: The client sends and reads messages larger than a frame, in
    #: ``FramePart`` frames, up to this many bytes of body (0: it does not).
    max_message: int = 0


@dataclass(slots=True)
class Welcome:
    """First frame of the broker: the session granted and its parameters."""

    TYPE: ClassVar[MessageType] = MessageType.WELCOME
    version: int
    session: bytes
    resumed: bool
    epoch: bytes
    lease_ms: int
    heartbeat_ms: int
    max_frame: int
    #: For a resume: per topic handle, how many publishes the broker received.
    received: dict[int, int] = field(default_factory=dict)
    #: For a resume (and only then): how many topic and subscription handles
    #: the broker has bound in the session, so the client resends the rest.
    bound: tuple[int, int] | None = None
    #: For a resume in which the broker no longer has a subscription the
    #: client's Hello listed (and only then): the subscription handles the
    #: session still has, ascending. None: every one listed survives.
    subscriptions: tuple[int, ...] | None = None
    #: The broker keeps topic logs: a reliable subscription's sequence
    #: numbers are the offsets of its topic's records (see "Topic logs and
    #: offsets" in the protocol description).
    offsets: bool = False
    #: To a Hello that asked for ``metadata``, from a broker of several
    #: workers: the membership and this worker's id (else None).
    cluster: Cluster | None = None
    #: To a Hello that asked for ``publish_many``: the client may send
    #: ``PublishMany`` frames.
    publish_many: bool = False
    #: To a Hello that gave a ``max_message``: the largest message body the
    #: broker takes in ``FramePart`` frames (0: none).
    max_message: int = 0


@dataclass(slots=True)
class Ping:
    TYPE: ClassVar[MessageType] = MessageType.PING
    nonce: int


@dataclass(slots=True)
class Pong:
    TYPE: ClassVar[MessageType] = MessageType.PONG
    nonce: int


@dataclass(slots=True)
class Goodbye:
    """The sender closes the connection after this frame."""

    TYPE: ClassVar[MessageType] = MessageType.GOODBYE
    code: int
    reason: str


@dataclass(slots=True)
class Throttled:
    """Advisory from the broker: the client's channel is (not) being withheld."""

    TYPE: ClassVar[MessageType] = MessageType.THROTTLED
    channel: Channel
    throttled: bool


@dataclass(slots=True)
class IssueGuarantee:
    TYPE: ClassVar[MessageType] = MessageType.ISSUE_GUARANTEE
    channel: Channel
    amount: int


@dataclass(slots=True)
class Absolve:
    TYPE: ClassVar[MessageType] = MessageType.ABSOLVE
    channel: Channel
    amount: int


@dataclass(slots=True)
class Plead:
    TYPE: ClassVar[MessageType] = MessageType.PLEAD
    channel: Channel
    target: int


@dataclass(slots=True)
class LimitSending:
    TYPE: ClassVar[MessageType] = MessageType.LIMIT_SENDING
    channel: Channel
    bound: int


@dataclass(slots=True)
class LimitReceiving:
    TYPE: ClassVar[MessageType] = MessageType.LIMIT_RECEIVING
    channel: Channel
    bound: int


@dataclass(slots=True)
class AnnounceDropping:
    TYPE: ClassVar[MessageType] = MessageType.ANNOUNCE_DROPPING
    channel: Channel


@dataclass(slots=True)
class Apologise:
    TYPE: ClassVar[MessageType] = MessageType.APOLOGISE
    channel: Channel


@dataclass(slots=True)
class FreeHandle:
    TYPE: ClassVar[MessageType] = MessageType.FREE_HANDLE
    handle_type: int
    handle: int
    mine: bool


@dataclass(slots=True)
class Ack:
    TYPE: ClassVar[MessageType] = MessageType.ACK
    subscription: int
    seq: int


@dataclass(slots=True)
class Settle:
    """A client's word on deliveries of a group subscription: ``ranges``
    names them by their delivery numbers (the ``first_seq + i`` of a
    :class:`DeliverGroup`, not offsets), as ascending, non-overlapping
    ``(first, count)`` pairs; ``outcome`` says what became of them, and
    ``detail`` is the retry's delay in ms (RETRY), the reason (REJECT, at
    most 1024 bytes of UTF-8), or None (DONE, IN_PROGRESS). A control
    message, like :class:`Ack`."""

    TYPE: ClassVar[MessageType] = MessageType.SETTLE
    subscription: int
    outcome: SettleOutcome
    ranges: list[tuple[int, int]]
    detail: int | str | None = None


@dataclass(slots=True)
class Gap:
    TYPE: ClassVar[MessageType] = MessageType.GAP
    subscription: int
    first_seq: int
    count: int


@dataclass(slots=True)
class Matched:
    """Broker: on pattern subscription ``subscription``, deliveries whose
    match index is ``match`` are records of topic ``topic`` from now on;
    ``topic`` None says that topic was deleted (its deliveries are over,
    and the index is never used again). Sent before the first delivery
    naming ``match``; a control message."""

    TYPE: ClassVar[MessageType] = MessageType.MATCHED
    subscription: int
    match: int
    topic: str | None


@dataclass(slots=True)
class MatchedGap:
    """Broker: on pattern subscription ``subscription``, ``count`` records
    of the topic matched as ``match``, from offset ``first``, were dropped
    or deleted before they were delivered (a pattern subscription's
    :class:`Gap`, numbered by the topic's offsets)."""

    TYPE: ClassVar[MessageType] = MessageType.MATCHED_GAP
    subscription: int
    match: int
    first: int
    count: int


@dataclass(slots=True)
class Confirm:
    TYPE: ClassVar[MessageType] = MessageType.CONFIRM
    topic: int
    count: int


@dataclass(frozen=True, slots=True)
class Stage:
    """Where staged publishes wait in the broker until a ``Commit``: a
    ``batch`` (what one commit makes visible at once) and a ``member`` of it
    (one writer's attempt)."""

    batch: str
    member: str


@dataclass(slots=True)
class Commit:
    """Client: make the listed members of ``batch`` visible, each with the
    number of publishes it staged, in this order; discard its other members.
    Answered by an ``Outcome`` with the same ``request``."""

    TYPE: ClassVar[MessageType] = MessageType.COMMIT
    request: int
    batch: str
    members: list[tuple[str, int]]


@dataclass(slots=True)
class Abort:
    """Client: discard every publish staged in ``batch``; answered by an ``Outcome``."""

    TYPE: ClassVar[MessageType] = MessageType.ABORT
    request: int
    batch: str


@dataclass(slots=True)
class Outcome:
    """Broker: the answer to ``Commit`` or ``Abort`` number ``request``
    (``status``: an :class:`OutcomeStatus`; ``messages`` routed or discarded)."""

    TYPE: ClassVar[MessageType] = MessageType.OUTCOME
    request: int
    status: int
    messages: int
    reason: str = ""


#: One topic's entry in an ``Offsets`` reply: its name, the offset of its
#: first record kept, and the offset its next record will have (Kafka's
#: log-start offset and high watermark; equal when it keeps no record).
TopicOffsets = tuple[str, int, int]


@dataclass(slots=True)
class ListOffsets:
    """Client: the first and next offsets of ``topics`` (None: of every topic
    the broker keeps a log of that the client may subscribe to). Answered
    by an ``Offsets`` with the same ``request``; creates no topic."""

    TYPE: ClassVar[MessageType] = MessageType.LIST_OFFSETS
    request: int
    topics: list[str] | None = None


@dataclass(slots=True)
class Offsets:
    """Broker: the answer to ``ListOffsets`` number ``request``: one entry per
    topic that has a log (a named topic without one is left out), sorted by
    name. A non-empty ``reason`` says why nothing is listed (a broker
    without topic logs; an answer that would not fit in one frame)."""

    TYPE: ClassVar[MessageType] = MessageType.OFFSETS
    request: int
    topics: list[TopicOffsets]
    reason: str = ""


#: A value in an Admin request's arguments or an answer's rows.
AdminValue = int | str | bool | float | None


@dataclass(slots=True)
class Admin:
    """Client: topic administration request ``command`` with ``arguments``
    (see the protocol document for the commands). Answered by an
    :class:`AdminAnswer` with the same ``request``."""

    TYPE: ClassVar[MessageType] = MessageType.ADMIN
    request: int
    command: str
    arguments: dict[str, AdminValue] = field(default_factory=dict)


@dataclass(slots=True)
class AdminAnswer:
    """Broker: the answer to ``Admin`` number ``request``: ``status`` (see
    :class:`AdminStatus`), ``rows`` (one map per item listed or changed),
    ``next`` (more rows follow: ask again with ``"after": next``; None:
    that is all) and ``reason`` (why nothing was done; empty when done)."""

    TYPE: ClassVar[MessageType] = MessageType.ADMIN_ANSWER
    request: int
    status: int
    rows: list[dict[str, AdminValue]]
    next: str | None = None
    reason: str = ""


#: The broker's answer to a numbered request of the client (Commit, Abort,
#: ListOffsets, Admin).
Answer = Outcome | Offsets | AdminAnswer


@dataclass(slots=True)
class BindTopic:
    """Binds the next topic handle to a topic name (channel ``[0,0]``).

    With a ``stage``, publishes on the handle are staged, not routed, until
    a ``Commit`` of the stage's batch lists its member.
    """

    TYPE: ClassVar[MessageType] = MessageType.BIND_TOPIC
    name: str
    stage: Stage | None = None

    @property
    def channel(self) -> Channel:
        return TOPIC_BINDS


@dataclass(slots=True)
class Subscribe:
    """Binds the next subscription handle to a topic handle (channel
    ``[1,0]``), or, when ``topic`` is text, to a topic pattern: a pattern
    subscription, whose deliveries come as :class:`DeliverMatched` frames
    naming their topics (see :class:`Matched`)."""

    TYPE: ClassVar[MessageType] = MessageType.SUBSCRIBE
    topic: int | str
    mode: str = "reliable"
    options: Options = field(default_factory=dict)

    @property
    def channel(self) -> Channel:
        return SUBSCRIPTION_BINDS


@dataclass(slots=True)
class FramePart:
    """One part of a channel message too large for one frame: the parts'
    ``chunk`` bytes, in order, are the message's frame body."""

    TYPE: ClassVar[MessageType] = MessageType.FRAME_PART
    channel: Channel
    flags: int
    chunk: bytes


@dataclass(slots=True)
class Publish:
    """A message published to topic handle ``topic`` (channel ``[2,topic]``)."""

    TYPE: ClassVar[MessageType] = MessageType.PUBLISH
    topic: int
    payload: bytes
    key: bytes | None = None
    headers: Headers | None = None

    @property
    def channel(self) -> Channel:
        return Channel(ChannelKind.PUBLISH, self.topic)


def _kind(value: object) -> str:
    return type(value).__name__


def check_publish_fields(payload: object, key: object, headers: object) -> None:
    """Raise :class:`TypeError` (one line: what to pass instead) unless
    ``payload`` is ``bytes``, ``key`` is ``bytes`` or None and ``headers``
    is None or a list (or tuple) of ``(str, bytes)`` pairs: what a Publish
    may carry. Clients call it before anything is sent, so a wrong type is
    the caller's error and never a malformed frame that ends the connection."""
    if type(payload) is not bytes:
        hint = " (encode text first, e.g. text.encode())" if isinstance(payload, str) else ""
        raise TypeError(f"payload must be bytes, not {_kind(payload)}{hint}")
    if key is not None and type(key) is not bytes:
        hint = " (encode text first, e.g. key.encode())" if isinstance(key, str) else ""
        raise TypeError(f"key must be bytes or None, not {_kind(key)}{hint}")
    if headers is None:
        return
    if type(headers) not in (list, tuple):
        raise TypeError(
            f"headers must be a list of (name, value) pairs or None, not {_kind(headers)}"
        )
    for pair in headers:  # type: ignore[attr-defined]
        if type(pair) not in (list, tuple) or len(pair) != 2:
            raise TypeError(f"each header must be a (name, value) pair, not {pair!r:.60}")
        name, value = pair
        if type(name) is not str or type(value) is not bytes:
            raise TypeError(f"a header is a (str, bytes) pair, not ({_kind(name)}, {_kind(value)})")


@dataclass(slots=True)
class Deliver:
    """A message delivered on subscription handle ``subscription`` (``[3,s]``)."""

    TYPE: ClassVar[MessageType] = MessageType.DELIVER
    subscription: int
    seq: int
    payload: bytes
    key: bytes | None = None
    headers: Headers | None = None

    @property
    def channel(self) -> Channel:
        return Channel(ChannelKind.DELIVER, self.subscription)


#: One delivery inside a :class:`DeliverMany`: payload, key, headers.
Entry = tuple[bytes, bytes | None, Headers | None]


@dataclass(slots=True)
class DeliverMany:
    """Consecutive deliveries on subscription handle ``subscription`` in one
    frame: ``entries[i]`` has sequence number ``first_seq + i``. Sent only to
    a client whose Hello says it reads them; the same as the Deliver frames
    of its entries, in one frame counted once against the guarantees."""

    TYPE: ClassVar[MessageType] = MessageType.DELIVER_MANY
    subscription: int
    first_seq: int
    entries: list[Entry]

    @property
    def channel(self) -> Channel:
        return Channel(ChannelKind.DELIVER, self.subscription)

    def deliveries(self) -> list[Deliver]:
        """The entries as the Deliver messages they stand for."""
        first = self.first_seq
        return [
            Deliver(self.subscription, first + i, payload, key, headers)
            for i, (payload, key, headers) in enumerate(self.entries)
        ]


@dataclass(slots=True)
class EncodedDeliveries:
    """A DeliverMany as a client that passes its deliveries on reads it
    (``hello(..., encoded_deliveries=True)``): ``entries[i]``, the delivery
    numbered ``first_seq + i``, is its payload, key and headers as they were
    on the wire, a Deliver tail (see :func:`encode_deliver_tail`), not
    decoded. Not a frame of its own: the same bytes as a DeliverMany."""

    subscription: int
    first_seq: int
    entries: list[bytes]

    @property
    def channel(self) -> Channel:
        return Channel(ChannelKind.DELIVER, self.subscription)


@dataclass(slots=True)
class DeliverTimed(DeliverMany):
    """A :class:`DeliverMany` whose entries carry their records' receive
    times: ``times[i]`` (ms since the Unix epoch) is the time the broker
    stored with record ``first_seq + i``. Sent only on a subscription whose
    Subscribe asked for ``"timestamps"``, and then for every delivery of it
    (one entry or many); otherwise the same as a DeliverMany."""

    TYPE: ClassVar[MessageType] = MessageType.DELIVER_TIMED
    times: list[int] = field(default_factory=list)


@dataclass(slots=True)
class DeliverGroup(DeliverMany):
    """A :class:`DeliverMany` of a group subscription (its Subscribe named
    a ``"group"``): ``offsets[i]`` is the topic offset of the record that
    ``entries[i]`` carries, and ``delivered[i]`` how many times that record
    was delivered before (0 the first time); entry ``i`` is the delivery
    numbered ``first_seq + i``, the number a :class:`Settle` names it by.
    Sent for every delivery of such a subscription (one entry or many);
    otherwise the same as a DeliverMany."""

    TYPE: ClassVar[MessageType] = MessageType.DELIVER_GROUP
    offsets: list[int] = field(default_factory=list)
    delivered: list[int] = field(default_factory=list)


@dataclass(slots=True)
class DeliverMatched(DeliverMany):
    """A :class:`DeliverMany` of a pattern subscription: ``matches[i]`` is
    the match index (see :class:`Matched`) of the topic whose record
    ``entries[i]`` carries, and ``offsets[i]`` that record's number in its
    topic (its log offset on a broker with topic logs); entry ``i`` is the
    delivery numbered ``first_seq + i``, the number an :class:`Ack` names.
    Sent for every delivery of such a subscription (one entry or many)."""

    TYPE: ClassVar[MessageType] = MessageType.DELIVER_MATCHED
    matches: list[int] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)


@dataclass(slots=True)
class PublishMany:
    """Publishes to topic handle ``topic`` in one frame (channel
    ``[2, topic]``), from a client whose Welcome allowed it:
    ``entries[i]`` is the i-th publish's payload, key and headers as on
    the wire, a Deliver tail (see :func:`encode_deliver_tail`), and
    ``keys[i]`` its key. From a worker's link, ``origins`` says whose
    publishes they are (see :mod:`._origins`); None from anyone else."""

    TYPE: ClassVar[MessageType] = MessageType.PUBLISH_MANY
    topic: int
    entries: list[bytes]
    keys: list[bytes | None]
    origins: list[OriginRun] | None = None

    @property
    def channel(self) -> Channel:
        return Channel(ChannelKind.PUBLISH, self.topic)


ControlMessage = (
    Hello
    | Welcome
    | Ping
    | Pong
    | Goodbye
    | Throttled
    | IssueGuarantee
    | Absolve
    | Plead
    | LimitSending
    | LimitReceiving
    | AnnounceDropping
    | Apologise
    | FreeHandle
    | Ack
    | Settle
    | Gap
    | Confirm
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
ChannelMessage = (
    BindTopic
    | Subscribe
    | Publish
    | PublishMany
    | Deliver
    | DeliverMany
    | DeliverTimed
    | DeliverGroup
    | DeliverMatched
    | FramePart
)
Message = ControlMessage | ChannelMessage
GuaranteeMessage = (
    IssueGuarantee | Absolve | Plead | LimitSending | LimitReceiving | AnnounceDropping | Apologise
)
