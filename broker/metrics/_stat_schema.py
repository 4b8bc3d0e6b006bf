"""``/stat.json``, version :data:`STAT_VERSION`: its shape as ``TypedDict``\\ s
(:class:`StatDocument` and its parts), and how a supervisor merges its
workers' documents into one (:data:`MERGE_RULES`, applied by
``broker.workers.merge_stat_documents``).

All sizes are in bytes, lags in records, offsets topic offsets (the first
record is 1); an infinite watermark, and a float that is not finite, is
``null``. A field marked ``NotRequired`` is present only where it applies.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Final, Literal, NotRequired, TypeAlias, TypedDict

#: The document's ``version`` (the fields added since it became 2 kept it).
STAT_VERSION: Final = 2
#: Consumer groups a document lists (the most lag first), of a broker or merged.
LIST_GROUPS: Final = 50
#: Most subscriptions listed per log topic, and most durable cursors listed.
LOG_LIST_LIMIT: Final = 256

# ====================================================================== the document


class AccountDoc(TypedDict):
    """An account (``accounts.AccountStatistics``)."""

    name: str
    kind: str
    debt: int
    peak_debt: int
    borrowed_total: int
    repaid_total: int
    loans: int
    blocked: bool
    seconds_blocked: float
    waiters: int
    high_watermark: float | None
    low_watermark: float | None


class SecurityDoc(TypedDict):
    """Refusals since the broker started (``broker.server``'s ``SecurityCounters``)."""

    auth_failures: dict[str, int]
    tls_handshake_failures: int
    lease_expirations: int


class StatisticsDoc(TypedDict):
    """``broker.server.BrokerStatistics``."""

    connections: int
    connections_total: int
    refused_total: int
    topics: int
    subscriptions: int
    buffer_reserved_bytes: int
    buffer_budget_bytes: int
    debt: int


class LinkDoc(TypedDict):
    """One link to another worker (``LinkStatistics``)."""

    owner: str
    open: bool
    connects: int
    publishes_in_flight: int
    bytes_in_flight: int
    publishes_forwarded: int
    subscriptions_forwarded: int
    deliveries_relayed: int


class LoopDoc(TypedDict):
    """The event loop's counters (``loop_counters``)."""

    task_steps: int
    io_waits: int


class BrokerSection(TypedDict):
    address: str
    epoch: str
    closing: bool
    tls: bool
    authentication: bool
    security: SecurityDoc
    statistics: StatisticsDoc
    #: A worker of several only: its links, per owner.
    links: NotRequired[list[LinkDoc]]
    account: AccountDoc
    #: ``null`` unless ``loop_counters``.
    loop: LoopDoc | None


class BudgetsSection(TypedDict):
    """The budgets and watermarks set (``BrokerConfig``), and ``buffer_reserved`` now."""

    global_budget: int
    buffer_reserved: int
    connection_budget: int
    publish_capacity: int
    min_publish_capacity: int
    bind_capacity: int
    channel_high_watermark: int
    channel_low_watermark: int
    connection_high_watermark: int
    connection_low_watermark: int
    max_unsent: int
    max_connections: int


class PrincipalDoc(TypedDict):
    connections: int
    buffer_reserved: int
    buffer_budget: int


#: A total family's value: a number, or ``{label value: ...}`` per label.
TotalValue: TypeAlias = "float | dict[str, TotalValue]"


class CountersDoc(TypedDict):
    """A connection's counters (``ConnectionCounters``)."""

    messages_in: int
    bytes_in: int
    messages_out: int
    bytes_out: int
    reader_pauses: int
    deliveries_overflowed: int
    deliveries_replaced: int


class ProtocolDoc(TypedDict):
    frames_received: int
    bytes_received: int
    frames_sent: int
    bytes_sent: int
    discarded_frames: int
    topics_bound: int
    subscriptions_bound: int


class ReceiverRow(TypedDict):
    """A channel the connection receives on (``ReceiverStatistics``); a
    publish channel bound to a topic also has ``topic`` to ``throttle_advised``."""

    kind: str
    direction: Literal["in"]
    #: ``[kind, index]``.
    channel: list[int]
    capacity: int
    buffered: int
    issuable: int
    sender_balance: int
    dropping: bool
    accepted_frames: int
    accepted_bytes: int
    dropped_frames: int
    dropped_bytes: int
    issued_bytes: int
    absolved_bytes: int
    sending_limit: int | None
    receiving_limit: int | None
    topic: NotRequired[str]
    account: NotRequired[AccountDoc]
    buffered_publishes: NotRequired[int]
    routed: NotRequired[int]
    confirmed: NotRequired[int]
    throttled: NotRequired[bool]
    throttle_advised: NotRequired[bool]


class SenderRow(TypedDict):
    """A channel the connection sends on (``SenderStatistics``)."""

    kind: str
    direction: Literal["out"]
    #: ``[kind, index]``.
    channel: list[int]
    balance: int
    unconfirmed_frames: int
    unconfirmed_bytes: int
    retransmit_frames: int
    retransmit_bytes: int
    sent_frames: int
    sent_bytes: int
    received_bytes: int
    refunded_bytes: int
    absolved_bytes: int
    drops_announced: int
    sending_limit: int | None
    receiving_limit: int | None


class SubscriptionRow(TypedDict):
    """A subscription; a dropping one (lossy, latest) also has its drops and
    limits, one that reads its topic's log ``acked``, ``lag`` and ``cursor``."""

    handle: int
    topic: str
    mode: str
    queued: int
    delivered: int
    next_seq: int
    dropped_overflow: NotRequired[int]
    dropped_replaced: NotRequired[int]
    gaps_sent: NotRequired[int]
    max_queued: NotRequired[int]
    max_queued_bytes: NotRequired[int]
    acked: NotRequired[int]
    lag: NotRequired[int]
    cursor: NotRequired[str | None]


class ConnectionRow(TypedDict):
    """A detailed connection: its first ``LIST_LIMIT`` channels and subscriptions."""

    name: str
    serial: int
    peer: str
    #: Sanitised like the metrics' ``client`` label.
    client: str
    principal: str | None
    identity: str | None
    state: str
    account: AccountDoc
    counters: CountersDoc
    protocol: ProtocolDoc
    buffer_reserved: int
    unsent_bytes: int
    channels_total: int
    subscriptions_total: int
    channels: list[ReceiverRow | SenderRow]
    subscriptions: list[SubscriptionRow]


class TopicRow(TypedDict):
    """A topic; ``publishers``: the publish channels bound to it that have published."""

    name: str
    publishers: int
    subscriptions: int
    #: Deliveries queued for its subscriptions.
    queued: int
    messages_in: int


class GroupRow(TypedDict):
    """A consumer group loaded (with members, or settling)."""

    topic: str
    group: str
    members: int
    outstanding: int
    lag: int
    floor: int
    settled: int
    redelivered: int
    dead_lettered: int
    expired: int
    late_settles: int


class LogReaderRow(TypedDict):
    """A reliable subscription reading a topic's log: ``position`` the next
    offset it sends, ``acked`` the last its subscriber processed, ``lag``
    the records retained and not processed, ``cursor`` its durable cursor's
    name (``null``: none)."""

    connection: str
    handle: int
    position: int
    acked: int
    lag: int
    gaps_sent: int
    cursor: str | None


class LogTopicRow(TypedDict):
    name: str
    first_offset: int
    last_offset: int
    bytes: int
    terms: int
    #: Batches of publishes waiting for room in the log or for the disk.
    held: int
    blocked: bool
    #: The last append error while batches wait.
    error: str | None
    #: The largest lag of its reliable subscriptions.
    lag: int
    subscriptions_total: int
    subscriptions: list[LogReaderRow]


class CursorRow(TypedDict):
    """A stored durable cursor: ``position`` the next offset it wants, ``lag``
    ``null`` if its topic's log is not open."""

    principal: str | None
    topic: str
    cursor: str
    position: int
    lag: int | None
    subscribed: bool


class LogsSection(TypedDict):
    """The topic logs (a broker with a data directory): the figures over
    every open log, the topics the metrics detail, the durable cursors."""

    data_dir: str
    #: The data directory's file system (``null``: unreadable).
    free_bytes: int | None
    size_bytes: int | None
    topics_total: int
    bytes: int
    terms: int
    blocked_topics: int
    max_lag: int
    subscriptions: int
    appends: int
    append_errors: int
    fsyncs: int
    fsync_seconds: float
    truncated_records: int
    truncated_bytes: int
    open_files: int
    open_files_limit: int
    file_opens: int
    file_evictions: int
    gap_records: int
    topics: list[LogTopicRow]
    #: Where ``cursors`` come from: ``"stored"`` (``broker stat`` also reads
    #: ``"live"``: live subscriptions' cursors only).
    cursors_listed: str
    cursors_total: int
    cursors: list[CursorRow]


class ClusterSection(TypedDict):
    """Cluster mode (``broker serve --cluster``): the connection to the
    NATS servers, the runs sent to the topics' streams, the topics set aside
    (their stream could not be restored; the first ``LOG_LIST_LIMIT`` by
    name, with why)."""

    connected: bool
    topics: int
    topics_sending: int
    runs_sent: int
    runs_resent: int
    #: Runs sent and not acknowledged yet (those to send again included).
    runs_in_flight: int
    records_stored: int
    writes_fenced: int
    #: Runs the streams answered as stored already (resends).
    store_duplicates: int
    #: Sends not stored, by reason (timeout, no_responders, unavailable,
    #: connection, refused).
    store_failures: dict[str, int]
    #: Sends acknowledged, and the seconds they took in all.
    stores: int
    store_seconds: float
    #: Reads of the streams while restoring, and the seconds they took in all.
    reads: int
    read_seconds: float
    set_aside_total: int
    set_aside: dict[str, str]


class MQTTConnectionRow(TypedDict):
    """An MQTT client connection (``broker.server.mqtt.MQTTConnectionStatistics``)
    and its account."""

    serial: int
    name: str
    peer: str
    client_id: str
    principal: str | None
    version: str
    state: str
    persistent: bool
    subscriptions: int
    shared_subscriptions: int
    messages_in: int
    messages_out: int
    unacknowledged_in: int
    in_flight_out: int
    unsent_bytes: int
    dropped_overflow: int
    dropped_too_large: int
    dropped_expired: int
    account: AccountDoc


class MQTTSection(TypedDict):
    """The MQTT listener (``mqtt_listen``): its counts, and its connections
    chosen as native ones are (the most debt, then the most in flight)."""

    address: str
    tls: bool
    connections_open: int
    connections_accepted: int
    connections_refused: int
    #: Persistent sessions kept while their clients are away.
    sessions_kept: int
    #: Wills waiting for their Will Delay Interval.
    wills_waiting: int
    retained_messages: int
    retained_bytes: int
    connections: list[MQTTConnectionRow]


class StatDocument(TypedDict):
    """``GET /stat.json``. Bounded: ``connections``, ``topics``, ``groups``
    and the lists in ``logs`` hold the busiest; the ``*_total`` counts and
    ``totals`` cover everything."""

    version: int
    groups: list[GroupRow]
    groups_total: int
    broker: BrokerSection
    budgets: BudgetsSection
    principals: dict[str, PrincipalDoc]
    #: Family name -> its value summed over every connection (closed ones too
    #: with the metrics server's collector).
    totals: dict[str, TotalValue]
    connections_total: int
    topics_total: int
    connections: list[ConnectionRow]
    topics: list[TopicRow]
    #: ``null``: a memory-only broker.
    logs: LogsSection | None
    #: ``null``: not in cluster mode.
    cluster: ClusterSection | None
    #: ``null``: no MQTT listener.
    mqtt: MQTTSection | None


# ====================================================================== the workers' merge


class Rule(Enum):
    """How the workers' values of one field become one."""

    #: Numbers added; mappings key by key (a key some workers lack: from
    #: those that have it); ``null`` left out (all ``null``: ``null``);
    #: text, lists, mixed kinds: as :attr:`SAME`.
    SUM = "sum"
    #: True if any worker's is (flags).
    ANY = "any"
    #: The value every worker has, or ``{worker: value}`` where they differ.
    SAME = "same"
    #: The largest worker's (peaks at different times do not add up).
    MAX = "max"
    #: The workers' distinct values, ``", "``-joined.
    JOIN = "join"
    #: Left out (per worker: the merged document's ``workers`` has it).
    OMIT = "omit"
    #: That of the worker with the least ``free_bytes`` (workers may share a disk).
    LEAST_FREE = "least_free"
    #: A mapping of names: key by key, each value by the rule of ``<path>.*``.
    EACH_KEY = "each_key"


@dataclass(frozen=True)
class Section:
    """A mapping (from the workers that have one): each field by its own
    rule, a field the table lacks by ``others``. No worker has one: ``{}``
    (``missing="empty"``), ``null`` (``"null"``), or like :attr:`Rule.SUM`
    (``"omit"``: left out, or ``null`` if the workers' are)."""

    others: Rule = Rule.SUM
    missing: Literal["omit", "empty", "null"] = "omit"


class Order(Enum):
    """How rows are ranked (as one broker ranks them), the largest first."""

    #: Blocked first, then the most account debt.
    DEBT = "debt"
    #: The most queued deliveries, then unsent bytes; only those behind
    #: (some queued, or 64 KiB unsent or more).
    BACKLOG = "backlog"
    #: The most queued deliveries, then messages in.
    QUEUED = "queued"
    #: Blocked first, then the most bytes.
    LOG_BYTES = "log_bytes"
    #: The most lag, then bytes; only those with lag.
    LOG_LAG = "log_lag"
    #: The most lag (unknown lag last).
    CURSOR_LAG = "cursor_lag"
    #: A consumer group's lag, the most first.
    GROUP_LAG = "group_lag"


@dataclass(frozen=True)
class Rows:
    """Every worker's rows, each a copy with ``"worker": id`` first, chosen
    again as one broker chooses: the ``limit`` first by ``first``, then up
    to ``limit`` more of the rest by ``then``. ``limit`` None: the broker's
    ``metrics_top``."""

    first: Order
    then: Order | None = None
    limit: int | None = None


MergeRule: TypeAlias = Rule | Section | Rows

#: How a supervisor merges its workers' documents (``broker.workers.merge_stat_documents``):
#: field path -> rule (``.*``: every value of a mapping of names). Every field
#: of :class:`StatDocument` outside rows has one (tests/workers/test_stat_rules.py);
#: a field the table lacks (a newer worker's) merges by its section's ``others``.
#: The merged document also has ``workers``, and its ``version`` is
#: :data:`STAT_VERSION` if no worker answered.
MERGE_RULES: Final[Mapping[str, MergeRule]] = {
    "version": Rule.SAME,
    "groups": Rows(Order.GROUP_LAG, limit=LIST_GROUPS),
    "groups_total": Rule.SUM,
    "broker": Section(missing="empty"),
    "broker.address": Rule.JOIN,
    "broker.epoch": Rule.OMIT,
    "broker.closing": Rule.ANY,
    "broker.tls": Rule.ANY,
    "broker.authentication": Rule.ANY,
    "broker.security": Section(),
    "broker.security.auth_failures": Rule.SUM,
    "broker.security.tls_handshake_failures": Rule.SUM,
    "broker.security.lease_expirations": Rule.SUM,
    "broker.statistics": Section(),
    "broker.statistics.connections": Rule.SUM,
    "broker.statistics.connections_total": Rule.SUM,
    "broker.statistics.refused_total": Rule.SUM,
    "broker.statistics.topics": Rule.SUM,
    "broker.statistics.subscriptions": Rule.SUM,
    "broker.statistics.buffer_reserved_bytes": Rule.SUM,
    "broker.statistics.buffer_budget_bytes": Rule.SUM,
    "broker.statistics.debt": Rule.SUM,
    "broker.links": Rule.SAME,
    "broker.account": Section(),
    "broker.account.name": Rule.SAME,
    "broker.account.kind": Rule.SAME,
    "broker.account.debt": Rule.SUM,
    "broker.account.peak_debt": Rule.MAX,
    "broker.account.borrowed_total": Rule.SUM,
    "broker.account.repaid_total": Rule.SUM,
    "broker.account.loans": Rule.SUM,
    "broker.account.blocked": Rule.ANY,
    "broker.account.seconds_blocked": Rule.SUM,
    "broker.account.waiters": Rule.SUM,
    "broker.account.high_watermark": Rule.SUM,
    "broker.account.low_watermark": Rule.SUM,
    "broker.loop": Section(),
    "broker.loop.task_steps": Rule.SUM,
    "broker.loop.io_waits": Rule.SUM,
    # Each worker has its own global budget and connections; the rest are
    # per-connection settings, the same in every worker.
    "budgets": Section(others=Rule.SAME, missing="empty"),
    "budgets.global_budget": Rule.SUM,
    "budgets.buffer_reserved": Rule.SUM,
    "budgets.connection_budget": Rule.SAME,
    "budgets.publish_capacity": Rule.SAME,
    "budgets.min_publish_capacity": Rule.SAME,
    "budgets.bind_capacity": Rule.SAME,
    "budgets.channel_high_watermark": Rule.SAME,
    "budgets.channel_low_watermark": Rule.SAME,
    "budgets.connection_high_watermark": Rule.SAME,
    "budgets.connection_low_watermark": Rule.SAME,
    "budgets.max_unsent": Rule.SAME,
    "budgets.max_connections": Rule.SUM,
    "principals": Rule.EACH_KEY,
    "principals.*": Section(),
    "principals.*.connections": Rule.SUM,
    "principals.*.buffer_reserved": Rule.SUM,
    "principals.*.buffer_budget": Rule.SUM,
    "totals": Rule.SUM,
    "connections_total": Rule.SUM,
    # (A topic in two workers counts twice.)
    "topics_total": Rule.SUM,
    "connections": Rows(Order.DEBT, then=Order.BACKLOG),
    "topics": Rows(Order.QUEUED),
    "logs": Section(missing="null"),
    "logs.data_dir": Rule.SAME,
    "logs.free_bytes": Rule.LEAST_FREE,
    "logs.size_bytes": Rule.LEAST_FREE,
    "logs.topics_total": Rule.SUM,
    "logs.bytes": Rule.SUM,
    "logs.terms": Rule.SUM,
    "logs.blocked_topics": Rule.SUM,
    "logs.max_lag": Rule.MAX,
    "logs.subscriptions": Rule.SUM,
    "logs.appends": Rule.SUM,
    "logs.append_errors": Rule.SUM,
    "logs.fsyncs": Rule.SUM,
    "logs.fsync_seconds": Rule.SUM,
    "logs.truncated_records": Rule.SUM,
    "logs.truncated_bytes": Rule.SUM,
    "logs.open_files": Rule.SUM,
    "logs.open_files_limit": Rule.SUM,
    "logs.file_opens": Rule.SUM,
    "logs.file_evictions": Rule.SUM,
    "logs.gap_records": Rule.SUM,
    "logs.topics": Rows(Order.LOG_BYTES, then=Order.LOG_LAG),
    "logs.cursors_listed": Rule.SAME,
    "logs.cursors_total": Rule.SUM,
    "logs.cursors": Rows(Order.CURSOR_LAG, limit=LOG_LIST_LIMIT),
    # (Cluster mode runs one process: no supervisor merges these; the rules
    # are there for completeness.)
    "cluster": Section(missing="omit"),
    "cluster.connected": Rule.SAME,
    "cluster.topics": Rule.SUM,
    "cluster.topics_sending": Rule.SUM,
    "cluster.runs_sent": Rule.SUM,
    "cluster.runs_resent": Rule.SUM,
    "cluster.runs_in_flight": Rule.SUM,
    "cluster.records_stored": Rule.SUM,
    "cluster.writes_fenced": Rule.SUM,
    "cluster.store_duplicates": Rule.SUM,
    "cluster.store_failures": Rule.SUM,
    "cluster.stores": Rule.SUM,
    "cluster.store_seconds": Rule.SUM,
    "cluster.reads": Rule.SUM,
    "cluster.read_seconds": Rule.SUM,
    "cluster.set_aside_total": Rule.SUM,
    "cluster.set_aside": Rule.EACH_KEY,
    "cluster.set_aside.*": Rule.SAME,
    # (A broker of several workers serves no MQTT: for completeness too.)
    "mqtt": Section(missing="omit"),
    "mqtt.address": Rule.JOIN,
    "mqtt.tls": Rule.ANY,
    "mqtt.connections_open": Rule.SUM,
    "mqtt.connections_accepted": Rule.SUM,
    "mqtt.connections_refused": Rule.SUM,
    "mqtt.sessions_kept": Rule.SUM,
    "mqtt.wills_waiting": Rule.SUM,
    "mqtt.retained_messages": Rule.SUM,
    "mqtt.retained_bytes": Rule.SUM,
    "mqtt.connections": Rows(Order.DEBT),
}
