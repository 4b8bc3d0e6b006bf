"""What ``/metrics`` exports: every metric family, its labels and their values.

Label values are bounded. ``connection`` is the broker's own name of a
connection (``conn-N``), ``kind`` a channel kind (``publish``, ``deliver``,
``bind``), ``reason`` one of a fixed list. The only client-supplied string
exported as a label is the client's name, on the info gauge
``broker_connection_info``, cut to :data:`CLIENT_NAME_LIMIT` characters with
non-printable characters replaced (:func:`sanitise_label`), and the topic
name (``topic``) on the topic log families of the few topics they detail
(:mod:`._log_specs`). The cluster mode families (:mod:`._cluster_families`)
have no labels.

The series count does not grow with the connections: the per-connection
families (``broker_connection_*``) carry the few connections with the most
debt or backlog (``metrics_top``), and each of them that has a ``total``
is also summed over every connection, closed ones included for counters, in a
broker-wide family (``broker_connection_sent_bytes_total`` ->
``broker_sent_bytes_total``).
"""

from __future__ import annotations

from typing import Final

from broker.protocol import Channel, ChannelKind

from ._cluster_families import CLUSTER_METRICS
from ._family import MetricSpec
from ._log_families import LOG_METRICS

#: Values of the ``kind`` label: the channel kinds as the broker sees them.
CHANNEL_KINDS: Final = ("publish", "deliver", "bind")
#: Values of the ``reason`` label of the drop counters.
#: ``beyond_guarantees``: a frame arrived that the receiving buffer had not
#: promised room for (and, until the client apologises, every frame after it).
#: ``unbound_handle``: a publish referred to a topic handle whose bind had been
#: dropped (counted on ``kind="publish"`` only).
DROP_REASONS: Final = ("beyond_guarantees", "unbound_handle")
#: Values of the ``reason`` label of dropped deliveries (lossy and latest
#: subscriptions): ``overflow``, the queue was full and its oldest delivery went;
#: ``replaced``, a newer delivery with the same key replaced it (``latest``).
DELIVERY_DROP_REASONS: Final = ("overflow", "replaced")
#: Longest client name exported as a label value, in characters.
CLIENT_NAME_LIMIT: Final = 64

_KIND_NAMES: Final[dict[int, str]] = {
    ChannelKind.TOPIC_BINDS: "bind",
    ChannelKind.SUBSCRIPTION_BINDS: "bind",
    ChannelKind.PUBLISH: "publish",
    ChannelKind.DELIVER: "deliver",
}
#: Kinds of the channels the broker receives on (it holds their buffers) and sends on.
RECEIVING_KINDS: Final = ("publish", "bind")
SENDING_KINDS: Final = ("deliver",)


def sanitise_label(text: str, limit: int = CLIENT_NAME_LIMIT) -> str:
    """``text`` cut to ``limit`` characters, each non-printable one (control
    characters, format characters, lone surrogates, ...) replaced by U+FFFD.

    The result is always encodable as UTF-8 and never contains a newline.
    """
    return "".join(ch if ch.isprintable() else "\ufffd" for ch in text[:limit])


def kind_name(channel: Channel) -> str:
    """The ``kind`` label value of ``channel``."""
    return _KIND_NAMES.get(channel.kind, "unknown")


_C = ("connection",)
_CK = ("connection", "kind")

#: Every metric family :class:`BrokerCollector` exports, in exposition order.
METRICS: Final[tuple[MetricSpec, ...]] = (
    # -- broker-wide
    MetricSpec("broker_build_info", "gauge", "Always 1; the broker's version.", ("version",)),
    MetricSpec("broker_connections_open", "gauge", "Client connections being served now."),
    MetricSpec(
        "broker_connections_accepted_total", "counter", "Client connections accepted and served."
    ),
    MetricSpec(
        "broker_connections_refused_total",
        "counter",
        "Client connections refused (connection limit reached or shutting down).",
    ),
    MetricSpec("broker_topics", "gauge", "Topics in use (published to or subscribed to)."),
    MetricSpec("broker_subscriptions", "gauge", "Subscriptions of all connections."),
    MetricSpec(
        "broker_queued_deliveries",
        "gauge",
        "Deliveries waiting in subscription queues for their subscriber's guarantees.",
    ),
    MetricSpec(
        "broker_buffer_reserved_bytes",
        "gauge",
        "Receive buffer capacity reserved by all connections' channels.",
    ),
    MetricSpec(
        "broker_buffer_budget_bytes", "gauge", "The broker-wide receive buffer budget (config)."
    ),
    MetricSpec(
        "broker_connections_waiting_for_budget",
        "gauge",
        "Connections with publish channels that wait for room in the broker-wide "
        "receive buffer budget (other connections' quiet channels are shrunk for them).",
    ),
    MetricSpec(
        "broker_debt_bytes",
        "gauge",
        "Debt of the broker's root account: every connection's outstanding work, "
        "in bytes plus a per-event constant.",
    ),
    MetricSpec("broker_peak_debt_bytes", "gauge", "Largest broker_debt_bytes seen so far."),
    MetricSpec(
        "broker_ready", "gauge", "1 while the broker accepts clients, 0 while shutting down."
    ),
    MetricSpec(
        "broker_connections_by_protocol",
        "gauge",
        "Client connections being served now, by protocol: native (the broker's own) and "
        "mqtt (MQTT 3.1.1 and 5.0, on mqtt_listen).",
        ("protocol",),
    ),
    MetricSpec("broker_mqtt_connections_accepted_total", "counter", "MQTT connections accepted."),
    MetricSpec("broker_mqtt_messages_in_total", "counter", "Messages MQTT clients published."),
    MetricSpec("broker_mqtt_messages_out_total", "counter", "Messages delivered to MQTT clients."),
    MetricSpec(
        "broker_mqtt_deliveries_dropped_total",
        "counter",
        "Deliveries to MQTT clients dropped: overflow (a QoS 0 subscription's queue was "
        "full: the client fell behind), too_large (larger than the client's Maximum Packet "
        "Size, dropped as MQTT says), expired (its 5.0 Message Expiry Interval had passed).",
        ("reason",),
    ),
    MetricSpec(
        "broker_mqtt_retained_messages",
        "gauge",
        "Retained MQTT messages kept now (one per topic at most).",
    ),
    MetricSpec(
        "broker_mqtt_retained_bytes",
        "gauge",
        "Bytes of the retained MQTT messages kept now (topic names and stored messages).",
    ),
    MetricSpec(
        "broker_mqtt_retained_refused_total",
        "counter",
        "Retained MQTT PUBLISHes not retained: past the bound of retained messages or bytes "
        "(published all the same; the topic's older retained message is cleared).",
    ),
    MetricSpec(
        "broker_internal_errors_total",
        "counter",
        "Connections ended by an error of the broker's own (a bug: each is logged with "
        "its traceback; the broker keeps serving the others).",
    ),
    MetricSpec(
        "broker_forwarded_publishes_total",
        "counter",
        "Publishes a worker sent on to the worker that owns their topic (sent again "
        "after a broken link: counted again), per owner.",
        ("owner",),
    ),
    MetricSpec(
        "broker_forwarded_duplicates_total",
        "counter",
        "Forwarded publishes this worker, their topic's owner, had stored already "
        "(sent again by a client whose forwarding worker died before the Confirm): "
        "confirmed, not stored twice.",
    ),
    MetricSpec(
        "broker_forwarded_origins_unknown_total",
        "counter",
        "Forwarded publishes whose origin this owner no longer knew (forgotten past its "
        "table's bound): had they been sent before, they were stored again.",
    ),
    MetricSpec(
        "broker_group_lag_records",
        "gauge",
        "Records of a consumer group's topic not settled by the group yet, per "
        "group (topic/name; the 20 groups with the largest lag, the rest summed "
        'under group="other").',
        ("group",),
    ),
    MetricSpec(
        "broker_group_outstanding",
        "gauge",
        "Records out with a consumer group's members, unsettled, per group.",
        ("group",),
    ),
    MetricSpec(
        "broker_group_members",
        "gauge",
        "Members of a consumer group, per group.",
        ("group",),
    ),
    MetricSpec(
        "broker_group_redelivered_total",
        "counter",
        "Deliveries of a record a consumer group had delivered before (retry, "
        "ack_wait, a member leaving), per group, since the group was loaded.",
        ("group",),
    ),
    MetricSpec(
        "broker_group_dead_lettered_total",
        "counter",
        "Records a consumer group put in its dead-letter topic (rejected, or "
        "delivered max_deliveries times), per group, since the group was loaded.",
        ("group",),
    ),
    MetricSpec(
        "broker_publish_marks",
        "gauge",
        "Publish marks held in the state journal (one per session topic handle that "
        "published to a topic log, and per forwarded origin): how a restart knows "
        "what the logs hold, so no publish is stored twice.",
    ),
    MetricSpec(
        "broker_forwarded_deliveries_total",
        "counter",
        "Deliveries a worker relayed from the worker that owns their topic, per owner.",
        ("owner",),
    ),
    MetricSpec(
        "broker_lease_expirations_total",
        "counter",
        "Connections closed because the client was silent for its whole lease.",
    ),
    MetricSpec(
        "broker_sessions",
        "gauge",
        "Client sessions: connected, or detached (connection broken, waiting a lease "
        "for a resume while their subscriptions keep queueing).",
        ("state",),
    ),
    MetricSpec(
        "broker_loop_task_steps_total",
        "counter",
        "Task steps of the event loop (task switches); only with loop_counters on.",
    ),
    MetricSpec(
        "broker_loop_io_waits_total",
        "counter",
        "Waits of the event loop for I/O that could sleep (epoll_wait with a timeout); "
        "only with loop_counters on.",
    ),
    MetricSpec("broker_sessions_created_total", "counter", "Sessions created (Hello)."),
    MetricSpec("broker_sessions_resumed_total", "counter", "Sessions resumed on a new connection."),
    MetricSpec(
        "broker_sessions_unknown_total",
        "counter",
        "Resumes asked for a session the broker no longer has (its lease ran out): the "
        "client got a new session, and what it publishes again, past deduplication, may "
        "be stored twice.",
    ),
    MetricSpec(
        "broker_sessions_expired_total",
        "counter",
        "Detached sessions that were not resumed within the lease: everything they held freed.",
    ),
    MetricSpec(
        "broker_session_redelivered_total",
        "counter",
        "Deliveries sent again on resumes (sent before, never acknowledged).",
    ),
    MetricSpec(
        "broker_session_unacked_deliveries",
        "gauge",
        "Deliveries sent and not yet acknowledged (their loans still charged to publishers).",
    ),
    MetricSpec(
        "broker_session_resume_lease_left_seconds",
        "histogram",
        "How much of the lease was left when a detached session was resumed.",
    ),
    MetricSpec(
        "broker_staged_messages",
        "gauge",
        "Publishes staged (exactly-once publishing), waiting for their batch's commit.",
    ),
    MetricSpec(
        "broker_staged_bytes",
        "gauge",
        "Bytes the staged publishes hold (their bookkeeping included).",
    ),
    MetricSpec(
        "broker_staging_limit_bytes",
        "gauge",
        "staging_limit: staging beyond it cuts the producer off (Goodbye 3).",
    ),
    MetricSpec("broker_staged_batches", "gauge", "Staged batches neither committed nor aborted."),
    MetricSpec(
        "broker_staging_outcomes_total",
        "counter",
        "Answers to commits and aborts: committed, duplicate (committed before: nothing "
        "more routed), aborted, refused (e.g. a member's count did not match).",
        ("outcome",),
    ),
    MetricSpec(
        "broker_staging_committed_messages_total",
        "counter",
        "Staged publishes made visible by commits.",
    ),
    MetricSpec(
        "broker_staging_discarded_messages_total",
        "counter",
        "Staged publishes discarded: aborted, superseded (members a commit left out), "
        "expired (past staging_ttl), late (staged into a finished batch).",
        ("reason",),
    ),
    MetricSpec(
        "broker_auth_failures_total",
        "counter",
        "Clients refused: no or bad credentials, their principal's connection limit, "
        "or a topic their principal may not use.",
        ("reason",),
    ),
    MetricSpec(
        "broker_tls_handshake_failures_total",
        "counter",
        "Connections closed because their TLS handshake failed or timed out.",
    ),
    # -- per principal (only with an auth file; principals come from the config)
    MetricSpec(
        "broker_principal_connections",
        "gauge",
        "Authenticated connections of each principal.",
        ("principal",),
    ),
    MetricSpec(
        "broker_principal_buffer_reserved_bytes",
        "gauge",
        "Receive buffer capacity reserved by each principal's connections.",
        ("principal",),
    ),
    MetricSpec(
        "broker_principal_buffer_budget_bytes",
        "gauge",
        "The most each principal's connections may reserve (its budget_share of the "
        "global budget).",
        ("principal",),
    ),
    # -- over every connection (counters: closed connections included)
    MetricSpec(
        "broker_connections_blocked",
        "gauge",
        "Connections whose account is blocked (above its high watermark and not yet "
        "back to its low one): the broker is not reading their sockets.",
    ),
    MetricSpec(
        "broker_throttled_seconds_total",
        "counter",
        "Seconds connections' readers spent waiting for their accounts to clear, summed.",
    ),
    MetricSpec(
        "broker_channel_debt_bytes",
        "gauge",
        "Debt of every connection's channel accounts, per channel kind.",
        ("kind",),
    ),
    MetricSpec(
        "broker_throttled_channels",
        "gauge",
        "Channels whose guarantees are withheld until their account clears.",
        ("kind",),
    ),
    MetricSpec("broker_received_messages_total", "counter", "Publishes received from clients."),
    MetricSpec("broker_received_bytes_total", "counter", "Bytes read from client sockets."),
    MetricSpec("broker_sent_messages_total", "counter", "Deliveries written to client sockets."),
    MetricSpec("broker_sent_bytes_total", "counter", "Bytes written to client sockets."),
    MetricSpec(
        "broker_reader_pauses_total",
        "counter",
        "Times a connection's reader stopped reading (account blocked, or too much unsent output).",
    ),
    MetricSpec(
        "broker_unsent_bytes", "gauge", "Encoded output waiting to be written to client sockets."
    ),
    MetricSpec(
        "broker_guarantees_outstanding_bytes",
        "gauge",
        "Guarantees issued to clients and not used yet, per receiving channel kind.",
        ("kind",),
    ),
    MetricSpec(
        "broker_guarantees_held_bytes",
        "gauge",
        "Guarantees clients issued to the broker and it has not used yet, per sending kind.",
        ("kind",),
    ),
    MetricSpec(
        "broker_unconfirmed_bytes",
        "gauge",
        "Bytes sent beyond the guarantees held and not yet confirmed, per sending kind.",
        ("kind",),
    ),
    MetricSpec(
        "broker_buffer_used_bytes",
        "gauge",
        "Receive buffer bytes holding frames not yet processed, per channel kind.",
        ("kind",),
    ),
    MetricSpec(
        "broker_buffer_capacity_bytes",
        "gauge",
        "Receive buffer capacity of the connections' channels, per channel kind.",
        ("kind",),
    ),
    MetricSpec(
        "broker_dropped_frames_total",
        "counter",
        "Frames received and dropped, per channel kind and reason.",
        ("kind", "reason"),
    ),
    MetricSpec(
        "broker_dropped_bytes_total",
        "counter",
        "Bytes of frames received and dropped, per channel kind and reason "
        '(bytes are known for reason="beyond_guarantees" only).',
        ("kind", "reason"),
    ),
    MetricSpec(
        "broker_dropped_deliveries_total",
        "counter",
        "Deliveries dropped from lossy and latest subscriptions, per reason.",
        ("reason",),
    ),
    MetricSpec(
        "broker_connections_detailed",
        "gauge",
        "Connections exported with broker_connection_* series now: the metrics_top with "
        "the most debt (blocked first), and up to as many more with the most queued "
        "deliveries or unsent output.",
    ),
    # -- per connection: only the connections with the most debt or backlog (metrics_top)
    MetricSpec(
        "broker_connection_info",
        "gauge",
        "Always 1; the connection's peer address and client name "
        f"(cut to {CLIENT_NAME_LIMIT} characters, non-printables replaced).",
        ("connection", "peer", "client"),
    ),
    MetricSpec(
        "broker_connection_debt_bytes",
        "gauge",
        "Debt of the connection's account (all its channels' outstanding work), "
        "in bytes plus a per-event constant.",
        _C,
    ),
    MetricSpec(
        "broker_connection_peak_debt_bytes",
        "gauge",
        "Largest broker_connection_debt_bytes seen on this connection.",
        _C,
    ),
    MetricSpec(
        "broker_connection_blocked",
        "gauge",
        "1 while the connection's account is blocked (above its high watermark and "
        "not yet back to its low one), else 0.",
        _C,
        total="broker_connections_blocked",
    ),
    MetricSpec(
        "broker_connection_throttled_seconds_total",
        "counter",
        "Seconds the connection's reader spent waiting for its account to clear "
        "(account seconds_blocked, waits in progress included).",
        _C,
        total="broker_throttled_seconds_total",
    ),
    MetricSpec(
        "broker_connection_channel_debt_bytes",
        "gauge",
        "Debt of the connection's channel accounts, summed per channel kind.",
        _CK,
        total="broker_channel_debt_bytes",
    ),
    MetricSpec(
        "broker_connection_throttled_channels",
        "gauge",
        "Channels whose guarantees are withheld until their account clears.",
        _CK,
        total="broker_throttled_channels",
    ),
    MetricSpec(
        "broker_connection_received_messages_total",
        "counter",
        "Publishes received on the connection.",
        _C,
        total="broker_received_messages_total",
    ),
    MetricSpec(
        "broker_connection_received_bytes_total",
        "counter",
        "Bytes read from the socket.",
        _C,
        total="broker_received_bytes_total",
    ),
    MetricSpec(
        "broker_connection_sent_messages_total",
        "counter",
        "Deliveries written to the connection's socket.",
        _C,
        total="broker_sent_messages_total",
    ),
    MetricSpec(
        "broker_connection_sent_bytes_total",
        "counter",
        "Bytes written to the socket.",
        _C,
        total="broker_sent_bytes_total",
    ),
    MetricSpec(
        "broker_connection_reader_pauses_total",
        "counter",
        "Times the reader stopped reading (account blocked, or too much unsent output).",
        _C,
        total="broker_reader_pauses_total",
    ),
    MetricSpec(
        "broker_connection_unsent_bytes",
        "gauge",
        "Encoded output waiting to be written to the connection's socket.",
        _C,
        total="broker_unsent_bytes",
    ),
    MetricSpec(
        "broker_connection_guarantees_outstanding_bytes",
        "gauge",
        "Guarantees the broker has issued to the client and the client has not used "
        "yet, per receiving channel kind (negative after accepted optimistic frames).",
        _CK,
        total="broker_guarantees_outstanding_bytes",
    ),
    MetricSpec(
        "broker_connection_guarantees_held_bytes",
        "gauge",
        "Guarantees the client has issued to the broker and the broker has not used "
        "yet, per sending channel kind.",
        _CK,
        total="broker_guarantees_held_bytes",
    ),
    MetricSpec(
        "broker_connection_unconfirmed_bytes",
        "gauge",
        "Bytes sent beyond the guarantees held and not yet confirmed, per sending kind.",
        _CK,
        total="broker_unconfirmed_bytes",
    ),
    MetricSpec(
        "broker_connection_buffer_used_bytes",
        "gauge",
        "Receive buffer bytes holding frames not yet processed, per channel kind.",
        _CK,
        total="broker_buffer_used_bytes",
    ),
    MetricSpec(
        "broker_connection_buffer_capacity_bytes",
        "gauge",
        "Receive buffer capacity, per channel kind.",
        _CK,
        total="broker_buffer_capacity_bytes",
    ),
    MetricSpec(
        "broker_connection_dropped_frames_total",
        "counter",
        "Frames received and dropped, per channel kind and reason.",
        ("connection", "kind", "reason"),
        total="broker_dropped_frames_total",
    ),
    MetricSpec(
        "broker_connection_dropped_bytes_total",
        "counter",
        "Bytes of frames received and dropped, per channel kind and reason "
        '(bytes are known for reason="beyond_guarantees" only).',
        ("connection", "kind", "reason"),
        total="broker_dropped_bytes_total",
    ),
    MetricSpec("broker_connection_topics_bound", "gauge", "Topic handles bound.", _C),
    MetricSpec("broker_connection_subscriptions_bound", "gauge", "Subscription handles bound.", _C),
    MetricSpec(
        "broker_connection_queued_deliveries",
        "gauge",
        "Deliveries waiting in this connection's subscription queues for its guarantees.",
        _C,
    ),
    MetricSpec(
        "broker_connection_dropped_deliveries_total",
        "counter",
        "Deliveries dropped from this connection's lossy and latest subscriptions "
        "(their publishers are never slowed by them), per reason.",
        ("connection", "reason"),
        total="broker_dropped_deliveries_total",
    ),
    # -- topic logs (a broker with a data directory; see _log_specs)
    *LOG_METRICS,
    # -- cluster mode (broker serve --cluster; see _cluster_families)
    *CLUSTER_METRICS,
)
