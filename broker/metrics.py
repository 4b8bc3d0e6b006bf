"""Prometheus metrics, a JSON status document and a small HTTP endpoint for a running broker.

- :class:`BrokerCollector` is a custom Prometheus collector. Every scrape builds
  its metric families afresh from the live :class:`~broker.server.Broker`, so
  the series of a connection exist exactly while it is connected: nothing has
  to be removed when it closes.
- :func:`stat_document` is the same state as one JSON-ready ``dict`` (what
  ``broker stat`` shows).
- :func:`serve_metrics` serves both over HTTP/1.1 on trio, in the broker's own
  thread: ``GET /metrics``, ``GET /stat.json`` and ``GET /``.

Label values are bounded. ``connection`` is the broker's own name of a
connection (``conn-N``), ``kind`` a channel kind (``publish``, ``deliver``,
``bind``), ``reason`` one of :data:`DROP_REASONS`. The only client-supplied
string exported as a label is the client's name, on the info gauge
``broker_connection_info``, cut to :data:`CLIENT_NAME_LIMIT` characters with
non-printable characters replaced (:func:`sanitise_label`).

Everything here reads broker state synchronously: call :meth:`BrokerCollector.collect`
and :func:`stat_document` from the broker's trio thread (as :func:`serve_metrics`
does), never from another thread.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, fields
from enum import Enum
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, Final, Literal

import trio
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from broker import __version__
from broker.protocol import Channel, ChannelKind
from broker.server import DroppingSubscription

if TYPE_CHECKING:
    from accounts import Account
    from broker.server import Broker, PublishChannel, ServerConnection

log = logging.getLogger("broker.metrics")

__all__ = [
    "CHANNEL_KINDS",
    "CLIENT_NAME_LIMIT",
    "DELIVERY_DROP_REASONS",
    "DROP_REASONS",
    "METRICS",
    "BrokerCollector",
    "MetricSpec",
    "metrics_registry",
    "sanitise_label",
    "serve_metrics",
    "stat_document",
]

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
_RECEIVING_KINDS: Final = ("publish", "bind")
_SENDING_KINDS: Final = ("deliver",)


def sanitise_label(text: str, limit: int = CLIENT_NAME_LIMIT) -> str:
    """``text`` cut to ``limit`` characters, each non-printable one (control
    characters, format characters, lone surrogates, ...) replaced by U+FFFD.

    The result is always encodable as UTF-8 and never contains a newline.
    """
    return "".join(ch if ch.isprintable() else "\ufffd" for ch in text[:limit])


def _kind_name(channel: Channel) -> str:
    return _KIND_NAMES.get(channel.kind, "unknown")


# ====================================================================== metrics


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One exported metric family: its full name, type, help text and label names.

    A counter's ``name`` ends in ``_total``; its family name is ``name``
    without that suffix (as prometheus_client names counter families).
    """

    name: str
    type: Literal["gauge", "counter", "histogram"]
    documentation: str
    labels: tuple[str, ...] = ()

    def family(self) -> GaugeMetricFamily | CounterMetricFamily | HistogramMetricFamily:
        """A new, empty metric family for this spec."""
        if self.type == "counter":
            return CounterMetricFamily(self.name, self.documentation, labels=self.labels)
        if self.type == "histogram":
            return HistogramMetricFamily(self.name, self.documentation, labels=self.labels)
        return GaugeMetricFamily(self.name, self.documentation, labels=self.labels)


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
        "broker_internal_errors_total",
        "counter",
        "Connections ended by an error of the broker's own (a bug: each is logged with "
        "its traceback; the broker keeps serving the others).",
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
    MetricSpec("broker_sessions_created_total", "counter", "Sessions created (Hello)."),
    MetricSpec("broker_sessions_resumed_total", "counter", "Sessions resumed on a new connection."),
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
    # -- per connection
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
    ),
    MetricSpec(
        "broker_connection_throttled_seconds_total",
        "counter",
        "Seconds the connection's reader spent waiting for its account to clear "
        "(account seconds_blocked, waits in progress included).",
        _C,
    ),
    MetricSpec(
        "broker_connection_channel_debt_bytes",
        "gauge",
        "Debt of the connection's channel accounts, summed per channel kind.",
        _CK,
    ),
    MetricSpec(
        "broker_connection_throttled_channels",
        "gauge",
        "Channels whose guarantees are withheld until their account clears.",
        _CK,
    ),
    MetricSpec(
        "broker_connection_received_messages_total",
        "counter",
        "Publishes received on the connection.",
        _C,
    ),
    MetricSpec(
        "broker_connection_received_bytes_total", "counter", "Bytes read from the socket.", _C
    ),
    MetricSpec(
        "broker_connection_sent_messages_total",
        "counter",
        "Deliveries written to the connection's socket.",
        _C,
    ),
    MetricSpec("broker_connection_sent_bytes_total", "counter", "Bytes written to the socket.", _C),
    MetricSpec(
        "broker_connection_reader_pauses_total",
        "counter",
        "Times the reader stopped reading (account blocked, or too much unsent output).",
        _C,
    ),
    MetricSpec(
        "broker_connection_unsent_bytes",
        "gauge",
        "Encoded output waiting to be written to the socket.",
        _C,
    ),
    MetricSpec(
        "broker_connection_guarantees_outstanding_bytes",
        "gauge",
        "Guarantees the broker has issued to the client and the client has not used "
        "yet, per receiving channel kind (negative after accepted optimistic frames).",
        _CK,
    ),
    MetricSpec(
        "broker_connection_guarantees_held_bytes",
        "gauge",
        "Guarantees the client has issued to the broker and the broker has not used "
        "yet, per sending channel kind.",
        _CK,
    ),
    MetricSpec(
        "broker_connection_unconfirmed_bytes",
        "gauge",
        "Bytes sent beyond the guarantees held and not yet confirmed, per sending kind.",
        _CK,
    ),
    MetricSpec(
        "broker_connection_buffer_used_bytes",
        "gauge",
        "Receive buffer bytes holding frames not yet processed, per channel kind.",
        _CK,
    ),
    MetricSpec(
        "broker_connection_buffer_capacity_bytes",
        "gauge",
        "Receive buffer capacity, per channel kind.",
        _CK,
    ),
    MetricSpec(
        "broker_connection_dropped_frames_total",
        "counter",
        "Frames received and dropped, per channel kind and reason.",
        ("connection", "kind", "reason"),
    ),
    MetricSpec(
        "broker_connection_dropped_bytes_total",
        "counter",
        "Bytes of frames received and dropped, per channel kind and reason "
        '(bytes are known for reason="beyond_guarantees" only).',
        ("connection", "kind", "reason"),
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
    ),
)


_Add = Callable[[str, list[str], float], None]


class BrokerCollector:
    """A Prometheus collector of one broker's live state (see :data:`METRICS`).

    Promises:

    - :meth:`collect` builds new metric families from the broker at each call
      and keeps no series between calls: a closed connection's series are gone
      from the next scrape on, and a new connection's are there at once.
    - Every family of :data:`METRICS` is yielded on every call, in that order,
      with the same name, type and labels; per-kind series are present for
      every kind the metric is about (zero when there is nothing of that kind).
    - Label values are bounded as the module documentation describes.
    - :meth:`describe` yields the same families without samples, so a registry
      detects name clashes on registration without scraping.

    Register it on a private :class:`~prometheus_client.CollectorRegistry`
    (:func:`metrics_registry`), not the global one: a process may run several
    brokers (the tests do).
    """

    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    def describe(self) -> Iterator[Metric]:
        """The exported families, without samples."""
        for spec in METRICS:
            yield spec.family()

    def collect(self) -> Iterator[Metric]:
        """The exported families with the broker's current values."""
        families = {spec.name: spec.family() for spec in METRICS}

        def add(name: str, labels: list[str], value: float) -> None:
            family = families[name]
            assert not isinstance(family, HistogramMetricFamily)
            family.add_metric(labels, float(value))

        broker = self.broker
        stats = broker.statistics()
        root = broker.account.statistics()
        add("broker_build_info", [__version__], 1)
        add("broker_connections_open", [], stats.connections)
        add("broker_connections_accepted_total", [], stats.connections_total)
        add("broker_connections_refused_total", [], stats.refused_total)
        add("broker_topics", [], stats.topics)
        add("broker_subscriptions", [], stats.subscriptions)
        add(
            "broker_queued_deliveries",
            [],
            sum(s.queued for topic in broker.topics.values() for s in topic.subscriptions),
        )
        add("broker_buffer_reserved_bytes", [], stats.buffer_reserved_bytes)
        add("broker_buffer_budget_bytes", [], stats.buffer_budget_bytes)
        add("broker_debt_bytes", [], root.debt)
        add("broker_peak_debt_bytes", [], root.peak_debt)
        add("broker_ready", [], 1 if broker.ready else 0)
        add("broker_internal_errors_total", [], broker.internal_errors)
        security = broker.security
        add("broker_lease_expirations_total", [], security.lease_expirations)
        sessions = broker.sessions
        detached = sessions.detached
        add("broker_sessions", ["connected"], len(sessions.sessions) - detached)
        add("broker_sessions", ["detached"], detached)
        add("broker_sessions_created_total", [], sessions.created_total)
        add("broker_sessions_resumed_total", [], sessions.resumed_total)
        add("broker_sessions_expired_total", [], sessions.expired_total)
        add("broker_session_redelivered_total", [], sessions.redelivered_total)
        add("broker_session_unacked_deliveries", [], sessions.unacked())
        buckets, total = sessions.lease_left.snapshot()
        lease_left = families["broker_session_resume_lease_left_seconds"]
        assert isinstance(lease_left, HistogramMetricFamily)
        lease_left.add_metric([], buckets=buckets, sum_value=total)
        staging = broker.staging
        add("broker_staged_messages", [], staging.messages)
        add("broker_staged_bytes", [], staging.size)
        add("broker_staging_limit_bytes", [], staging.limit)
        add("broker_staged_batches", [], len(staging.batches))
        for outcome, count in staging.counters.outcomes.items():
            add("broker_staging_outcomes_total", [outcome], count)
        add("broker_staging_committed_messages_total", [], staging.counters.committed_messages)
        for reason, count in staging.counters.discarded.items():
            add("broker_staging_discarded_messages_total", [reason], count)
        for reason, count in security.auth_failures.items():
            add("broker_auth_failures_total", [reason], count)
        add("broker_tls_handshake_failures_total", [], security.tls_handshake_failures)
        for name, usage in broker.principals.items():
            add("broker_principal_connections", [name], usage.connections)
            add("broker_principal_buffer_reserved_bytes", [name], usage.buffer_reserved)
            add("broker_principal_buffer_budget_bytes", [name], usage.buffer_budget)
        for connection in list(broker.connections.values()):
            self._collect_connection(connection, add)
        yield from families.values()

    @staticmethod
    def _collect_connection(connection: ServerConnection, add: _Add) -> None:
        name = connection.name
        account = connection.account.statistics()
        counters = connection.counters
        protocol = connection.protocol
        pstats = protocol.statistics()
        add(
            "broker_connection_info",
            [name, connection.peer, sanitise_label(connection.client_name)],
            1,
        )
        add("broker_connection_debt_bytes", [name], account.debt)
        add("broker_connection_peak_debt_bytes", [name], account.peak_debt)
        add("broker_connection_blocked", [name], 1 if account.blocked else 0)
        add("broker_connection_throttled_seconds_total", [name], account.seconds_blocked)
        channels = list(connection.channels.values())
        add("broker_connection_channel_debt_bytes", [name, "publish"], _debt(channels))
        add(
            "broker_connection_throttled_channels",
            [name, "publish"],
            sum(1 for state in channels if state.waiting),
        )
        add("broker_connection_received_messages_total", [name], counters.messages_in)
        add("broker_connection_received_bytes_total", [name], counters.bytes_in)
        add("broker_connection_sent_messages_total", [name], counters.messages_out)
        add("broker_connection_sent_bytes_total", [name], counters.bytes_out)
        add("broker_connection_reader_pauses_total", [name], counters.reader_pauses)
        add("broker_connection_unsent_bytes", [name], protocol.bytes_to_send)

        outstanding = dict.fromkeys(_RECEIVING_KINDS, 0)
        used = dict.fromkeys(_RECEIVING_KINDS, 0)
        capacity = dict.fromkeys(_RECEIVING_KINDS, 0)
        dropped_frames = dict.fromkeys(_RECEIVING_KINDS, 0)
        dropped_bytes = dict.fromkeys(_RECEIVING_KINDS, 0)
        for receiver in pstats.receivers:
            kind = _kind_name(receiver.channel)
            if kind not in outstanding:
                continue
            outstanding[kind] += receiver.sender_balance
            used[kind] += receiver.buffered
            capacity[kind] += receiver.capacity
            dropped_frames[kind] += receiver.dropped_frames
            dropped_bytes[kind] += receiver.dropped_bytes
        held = dict.fromkeys(_SENDING_KINDS, 0)
        unconfirmed = dict.fromkeys(_SENDING_KINDS, 0)
        for sender in pstats.senders:
            kind = _kind_name(sender.channel)
            if kind in held:
                held[kind] += sender.balance
                unconfirmed[kind] += sender.unconfirmed_bytes
        for kind in _RECEIVING_KINDS:
            labels = [name, kind]
            add("broker_connection_guarantees_outstanding_bytes", labels, outstanding[kind])
            add("broker_connection_buffer_used_bytes", labels, used[kind])
            add("broker_connection_buffer_capacity_bytes", labels, capacity[kind])
            reason = [name, kind, "beyond_guarantees"]
            add("broker_connection_dropped_frames_total", reason, dropped_frames[kind])
            add("broker_connection_dropped_bytes_total", reason, dropped_bytes[kind])
        unbound = [name, "publish", "unbound_handle"]
        add("broker_connection_dropped_frames_total", unbound, pstats.discarded_frames)
        for kind in _SENDING_KINDS:
            add("broker_connection_guarantees_held_bytes", [name, kind], held[kind])
            add("broker_connection_unconfirmed_bytes", [name, kind], unconfirmed[kind])
        add("broker_connection_topics_bound", [name], pstats.topics_bound)
        add("broker_connection_subscriptions_bound", [name], pstats.subscriptions_bound)
        add(
            "broker_connection_queued_deliveries",
            [name],
            sum(s.queued for s in connection.subscriptions.values()),
        )
        # Kept on the connection, so that a subscription's end never lowers them.
        overflowed, replaced = counters.deliveries_overflowed, counters.deliveries_replaced
        add("broker_connection_dropped_deliveries_total", [name, "overflow"], overflowed)
        add("broker_connection_dropped_deliveries_total", [name, "replaced"], replaced)


def _debt(channels: Iterable[PublishChannel]) -> int:
    return sum(int(state.account.debt) for state in channels)


def metrics_registry(broker: Broker) -> CollectorRegistry:
    """A new private registry holding only a :class:`BrokerCollector` of ``broker``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BrokerCollector(broker))
    return registry


# ====================================================================== /stat.json


def _plain(value: Any) -> Any:
    """``value`` as JSON-ready data: dataclasses and mappings become dicts,
    channels ``[kind, index]``, enums their value, non-finite floats ``None``."""
    if isinstance(value, Channel):
        return [int(value.kind), int(value.index)]
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, bool | int | str) or value is None:
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if hasattr(value, "__dataclass_fields__"):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    return str(value)


def _account(account: Account) -> dict[str, Any]:
    document: dict[str, Any] = _plain(account.statistics())
    return document


def stat_document(broker: Broker) -> dict[str, Any]:
    """The live broker as a JSON-ready ``dict`` (``json.dumps(..., allow_nan=False)``
    succeeds on it): what ``GET /stat.json`` returns and ``broker stat`` shows.

    Layout (all sizes in bytes; an infinite watermark is ``null``)::

        {"version": 1,
         "broker": {"address", "epoch", "closing", "tls", "authentication",
                    "security", "statistics", "account"},
         "budgets": {"global_budget", "buffer_reserved", "connection_budget", ...},
         "principals": {name: {"connections", "buffer_reserved", "buffer_budget"}},
         "connections": [{"name", "serial", "peer", "client", "principal", "identity",
                          "state", "account",
                          "counters", "protocol", "buffer_reserved", "unsent_bytes",
                          "channels": [{"kind", "channel", "direction", ...}],
                          "subscriptions": [{"handle", "topic", "mode", ...}]}],
         "topics": [{"name", "publishers", "subscriptions", "queued", "messages_in"}]}

    Connections are listed in the order they were accepted; ``client`` is
    sanitised like the metrics label. Topic names are given in full (JSON
    escapes them).
    """
    config = broker.config
    statistics = broker.statistics()
    return {
        "version": 1,
        "broker": {
            "address": "{}:{}".format(*broker.address),
            "epoch": broker.epoch.hex(),
            "closing": broker.closing,
            "tls": broker.ssl_context is not None,
            "authentication": broker.auth is not None,
            "security": _plain(broker.security),
            "statistics": _plain(statistics),
            "account": _account(broker.account),
        },
        "budgets": {
            "global_budget": config.global_budget,
            "buffer_reserved": broker.buffer_reserved,
            "connection_budget": config.connection_budget,
            "publish_capacity": config.publish_capacity,
            "min_publish_capacity": config.min_publish_capacity,
            "bind_capacity": config.bind_capacity,
            "channel_high_watermark": config.channel_high_watermark,
            "channel_low_watermark": config.channel_low_watermark,
            "connection_high_watermark": config.connection_high_watermark,
            "connection_low_watermark": config.connection_low_watermark,
            "max_unsent": config.max_unsent,
            "max_connections": config.max_connections,
        },
        "principals": {
            name: {
                "connections": usage.connections,
                "buffer_reserved": usage.buffer_reserved,
                "buffer_budget": usage.buffer_budget,
            }
            for name, usage in broker.principals.items()
        },
        "connections": [_connection_document(c) for c in list(broker.connections.values())],
        "topics": [
            {
                "name": topic.topic_name,
                "publishers": topic.publishers,
                "subscriptions": len(topic.subscriptions),
                "queued": sum(s.queued for s in topic.subscriptions),
                "messages_in": topic.messages_in,
            }
            for topic in list(broker.topics.values())
        ],
    }


def _connection_document(connection: ServerConnection) -> dict[str, Any]:
    protocol = connection.protocol
    pstats = protocol.statistics()
    channels: list[dict[str, Any]] = []
    for receiver in pstats.receivers:
        entry: dict[str, Any] = {"kind": _kind_name(receiver.channel), "direction": "in"}
        entry.update(_plain(receiver))
        state = (
            connection.channels.get(receiver.channel.index)
            if receiver.channel.kind == ChannelKind.PUBLISH
            else None
        )
        if state is not None:
            entry.update(
                topic=state.topic.topic_name,
                account=_account(state.account),
                buffered_publishes=len(state.buffer),
                routed=state.routed,
                confirmed=state.confirmed,
                throttled=state.waiting,
                throttle_advised=state.advised,
            )
        channels.append(entry)
    for sender in pstats.senders:
        entry = {"kind": _kind_name(sender.channel), "direction": "out"}
        entry.update(_plain(sender))
        channels.append(entry)
    return {
        "name": connection.name,
        "serial": connection.serial,
        "peer": connection.peer,
        "client": sanitise_label(connection.client_name),
        "principal": connection.principal.principal.name if connection.principal else None,
        "identity": connection.identity,
        "state": pstats.state.value,
        "account": _account(connection.account),
        "counters": _plain(connection.counters),
        "protocol": {
            "frames_received": pstats.frames_received,
            "bytes_received": pstats.bytes_received,
            "frames_sent": pstats.frames_sent,
            "bytes_sent": pstats.bytes_sent,
            "discarded_frames": pstats.discarded_frames,
            "topics_bound": pstats.topics_bound,
            "subscriptions_bound": pstats.subscriptions_bound,
        },
        "buffer_reserved": connection.buffer_reserved,
        "unsent_bytes": protocol.bytes_to_send,
        "channels": channels,
        "subscriptions": [
            {
                "handle": subscription.handle,
                "topic": subscription.topic.topic_name,
                "mode": subscription.mode,
                "queued": subscription.queued,
                "delivered": subscription.delivered,
                "next_seq": subscription.next_seq,
                **(
                    {
                        "dropped_overflow": subscription.dropped_overflow,
                        "dropped_replaced": subscription.dropped_replaced,
                        "gaps_sent": subscription.gaps_sent,
                        "max_queued": subscription.limits.max_queued,
                        "max_queued_bytes": subscription.limits.max_queued_bytes,
                    }
                    if isinstance(subscription, DroppingSubscription)
                    else {}
                ),
            }
            for subscription in list(connection.subscriptions.values())
        ],
    }


# ====================================================================== HTTP

#: Largest request head (request line and headers) read, in bytes.
MAX_REQUEST_HEAD: Final = 8 * 1024
#: Seconds a client has to send its whole request head.
READ_TIMEOUT: Final = 10.0
#: Seconds a client has to take the response.
WRITE_TIMEOUT: Final = 10.0
#: Seconds to wait, after the response, for the client to close its side.
LINGER_SECONDS: Final = 1.0
#: Requests served at once; more are answered 503 at once.
MAX_CLIENTS: Final = 64

_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_INDEX = b"""trio-broker metrics endpoint

/metrics    Prometheus metrics (text exposition format)
/stat.json  the live broker as JSON (connections, accounts, channels, topics, budgets)
/healthz    liveness: 200 while the broker's event loop serves requests
/readyz     readiness: 200 while the broker accepts clients, 503 while shutting down
"""


class _HTTPError(Exception):
    def __init__(self, status: HTTPStatus, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


@dataclass(frozen=True, slots=True)
class _Request:
    method: str
    path: str


def _response(
    status: HTTPStatus,
    body: bytes,
    content_type: str = "text/plain; charset=utf-8",
    *,
    head_only: bool = False,
    extra: tuple[str, ...] = (),
) -> bytes:
    lines = [
        f"HTTP/1.1 {status.value} {status.phrase}",
        f"Content-Type: {content_type}",
        f"Content-Length: {len(body)}",
        "Cache-Control: no-store",
        "Connection: close",
        *extra,
    ]
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("ascii")
    return head if head_only else head + body


def _error_response(status: HTTPStatus, detail: str = "", **kwargs: Any) -> bytes:
    text = f"{status.value} {status.phrase}" + (f": {detail}" if detail else "") + "\n"
    return _response(status, text.encode("utf-8", "replace"), **kwargs)


def _parse_head(head: bytes) -> _Request:
    """The method and path of a request head, or :class:`_HTTPError` (400/505)."""
    lines = head.split(b"\n")
    try:
        request_line = lines[0].rstrip(b"\r").decode("ascii")
    except UnicodeDecodeError:
        raise _HTTPError(HTTPStatus.BAD_REQUEST, "request line is not ASCII") from None
    parts = request_line.split(" ")
    if len(parts) != 3 or not _TOKEN.fullmatch(parts[0]):
        raise _HTTPError(HTTPStatus.BAD_REQUEST, "malformed request line")
    method, target, version = parts
    if not re.fullmatch(r"HTTP/\d\.\d", version):
        raise _HTTPError(HTTPStatus.BAD_REQUEST, "malformed HTTP version")
    if not version.startswith("HTTP/1."):
        raise _HTTPError(HTTPStatus.HTTP_VERSION_NOT_SUPPORTED, "only HTTP/1.x is served")
    if not target.startswith("/") or any(ord(ch) <= 32 or ord(ch) >= 127 for ch in target):
        raise _HTTPError(HTTPStatus.BAD_REQUEST, "malformed request target")
    for raw in lines[1:]:
        line = raw.rstrip(b"\r")
        name, colon, _ = line.partition(b":")
        if not colon or not name or not _TOKEN.fullmatch(name.decode("latin-1")):
            raise _HTTPError(HTTPStatus.BAD_REQUEST, "malformed header line")
    return _Request(method, target.partition("?")[0])


async def _read_head(stream: trio.abc.ReceiveStream) -> bytes:
    """The request head (without its blank line), at most :data:`MAX_REQUEST_HEAD` bytes."""
    buffer = bytearray()
    while True:
        for terminator in (b"\r\n\r\n", b"\n\n"):
            end = buffer.find(terminator)
            if end >= 0:
                return bytes(buffer[:end])
        room = MAX_REQUEST_HEAD + 4 - len(buffer)
        if room <= 0:
            raise _HTTPError(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "request head too large")
        chunk = await stream.receive_some(room)
        if not chunk:
            raise _HTTPError(HTTPStatus.BAD_REQUEST, "incomplete request")
        buffer += chunk


class _MetricsServer:
    def __init__(
        self, broker: Broker, registry: CollectorRegistry, read_timeout: float, max_clients: int
    ) -> None:
        self.broker = broker
        self.registry = registry
        self.read_timeout = read_timeout
        self.max_clients = max_clients
        self.active = 0

    def _metrics(self) -> tuple[bytes, str]:
        body: bytes = generate_latest(self.registry)
        return body, CONTENT_TYPE_LATEST

    def _stat(self) -> tuple[bytes, str]:
        text = json.dumps(stat_document(self.broker), allow_nan=False, indent=1)
        return text.encode("utf-8") + b"\n", "application/json"

    @staticmethod
    def _index() -> tuple[bytes, str]:
        return _INDEX, "text/plain; charset=utf-8"

    @staticmethod
    def _alive() -> tuple[bytes, str]:
        return b"ok\n", "text/plain; charset=utf-8"

    def _ready(self) -> tuple[bytes, str]:
        if not self.broker.ready:
            raise _HTTPError(HTTPStatus.SERVICE_UNAVAILABLE, "not accepting clients")
        return b"ready\n", "text/plain; charset=utf-8"

    def respond(self, request: _Request) -> bytes:
        """The full response to a well-formed request."""
        routes: dict[str, Callable[[], tuple[bytes, str]]] = {
            "/metrics": self._metrics,
            "/stat.json": self._stat,
            "/healthz": self._alive,
            "/readyz": self._ready,
            "/": self._index,
        }
        route = routes.get(request.path)
        head_only = request.method == "HEAD"
        if route is None:
            return _error_response(HTTPStatus.NOT_FOUND, head_only=head_only)
        if request.method not in ("GET", "HEAD"):
            return _error_response(HTTPStatus.METHOD_NOT_ALLOWED, extra=("Allow: GET, HEAD",))
        try:
            body, content_type = route()
        except _HTTPError as error:
            return _error_response(error.status, error.detail, head_only=head_only)
        except Exception:  # a bug of ours: log it, never show it
            log.exception("metrics: %s %s failed", request.method, request.path)
            return _error_response(HTTPStatus.INTERNAL_SERVER_ERROR, head_only=head_only)
        return _response(HTTPStatus.OK, body, content_type, head_only=head_only)

    async def handle(self, stream: trio.SocketStream) -> None:
        """Serve one request on ``stream`` and close it; never raises an Exception."""
        try:
            if self.active >= self.max_clients:
                await self._send(stream, _error_response(HTTPStatus.SERVICE_UNAVAILABLE))
                return
            self.active += 1
            try:
                await self._serve(stream)
            finally:
                self.active -= 1
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as error:
            log.debug("metrics: client went away: %s", error)
        except Exception:  # pragma: no cover - a bug of ours; keep serving
            log.exception("metrics: request failed")
        finally:
            await trio.aclose_forcefully(stream)

    async def _serve(self, stream: trio.SocketStream) -> None:
        response: bytes | None = None
        with trio.move_on_after(self.read_timeout):
            try:
                response = self.respond(_parse_head(await _read_head(stream)))
            except _HTTPError as error:
                response = _error_response(error.status, error.detail)
        if response is None:
            response = _error_response(HTTPStatus.REQUEST_TIMEOUT)
        await self._send(stream, response)

    @staticmethod
    async def _send(stream: trio.SocketStream, response: bytes) -> None:
        """Send ``response``, half-close, and discard what the client still sends
        for a moment, so closing does not reset the connection before the
        client has read the response."""
        with trio.move_on_after(WRITE_TIMEOUT):
            await stream.send_all(response)
            await stream.send_eof()
        with trio.move_on_after(LINGER_SECONDS):
            discarded = 0
            while discarded < 16 * MAX_REQUEST_HEAD:
                chunk = await stream.receive_some(MAX_REQUEST_HEAD)
                if not chunk:
                    break
                discarded += len(chunk)


async def serve_metrics(
    broker: Broker,
    host: str,
    port: int,
    *,
    read_timeout: float = READ_TIMEOUT,
    max_clients: int = MAX_CLIENTS,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``broker``'s metrics over HTTP/1.1 on ``host:port`` until cancelled.

    ``task_status.started((host, port))`` reports the bound address once it
    listens (so ``port=0`` picks a free port; with ``port=0`` only the first
    address ``host`` resolves to is bound). ``host=""`` listens on every
    interface.

    Routes: ``GET /metrics`` (Prometheus text format, ``CONTENT_TYPE_LATEST``,
    from a private registry), ``GET /stat.json`` (:func:`stat_document`),
    ``GET /healthz`` (200 whenever it answers: the event loop runs),
    ``GET /readyz`` (200 while the broker accepts clients, else 503),
    ``GET /`` (a short index); ``HEAD`` on each. Any other path is 404; another
    method on a known path is 405 (with ``Allow``).

    Promises: one request per connection, each response carries
    ``Connection: close`` and the server then closes; a request head larger
    than :data:`MAX_REQUEST_HEAD` gets 431, a malformed one 400, one not
    complete within ``read_timeout`` seconds 408; beyond ``max_clients``
    concurrent requests the answer is 503. No client can make it raise, and no
    response contains a traceback. It runs in the calling trio thread (no
    worker thread): a scrape is a consistent snapshot of the broker.
    """
    registry = metrics_registry(broker)
    server = _MetricsServer(broker, registry, read_timeout, max_clients)
    listeners = await trio.open_tcp_listeners(port, host=host or None)
    if port == 0:
        # Each listener got a port of its own: keep the first, report it.
        for extra in listeners[1:]:
            await extra.aclose()
        del listeners[1:]
    sockname = listeners[0].socket.getsockname()
    address = (str(sockname[0]), int(sockname[1]))
    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, server.handle, listeners)
        log.info("metrics on http://%s:%d/metrics", *address)
        task_status.started(address)
