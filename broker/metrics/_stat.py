"""The live broker as one JSON-ready document: ``/stat.json``, what ``broker stat`` shows.

Its size does not grow with the connections or topics: it details the
connections a :class:`~broker.metrics.BrokerCollector` snapshot details
(``metrics_top`` with the most debt, and as many with the longest backlog),
``metrics_top`` topics (the most queued deliveries first), and of each
detailed connection
its first :data:`LIST_LIMIT` channels and subscriptions; ``totals`` and the
``*_total`` counts cover everything. The ``mqtt`` section's connections are
bounded the same way (see ``MQTTServer.connection_statistics``).
"""

from __future__ import annotations

import math
from dataclasses import fields
from enum import Enum
from typing import TYPE_CHECKING, Any, Final, cast

from broker.protocol import Channel, ChannelKind
from broker.server import BrokerStatistics, DroppingSubscription

from ._cluster_figures import cluster_document
from ._collector import BrokerCollector, Snapshot
from ._families import kind_name, sanitise_label
from ._log_stat import logs_document, reader_document
from ._log_walk import LogReading
from ._stat_schema import (
    LIST_GROUPS,
    STAT_VERSION,
    AccountDoc,
    BrokerSection,
    ConnectionRow,
    GroupRow,
    MQTTConnectionRow,
    MQTTSection,
    ReceiverRow,
    SenderRow,
    StatDocument,
    SubscriptionRow,
    TopicRow,
    TotalValue,
)
from ._walk_steps import Walk, run_in_pieces, run_now

if TYPE_CHECKING:
    from accounts import Account
    from broker.server import Broker, ConnectionView, Subscription

#: Most channels, and most subscriptions, listed per detailed connection.
LIST_LIMIT: Final = 256


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


def _account(account: Account) -> AccountDoc:
    document: AccountDoc = _plain(account.statistics())
    return document


def stat_document(broker: Broker, collector: BrokerCollector | None = None) -> StatDocument:
    """The live broker as a JSON-ready :class:`~._stat_schema.StatDocument`
    (``json.dumps(..., allow_nan=False)`` succeeds on it), built at once: what
    ``GET /stat.json`` returns and ``broker stat`` shows.

    With ``collector`` (the metrics server's), its snapshot is used and the
    counter totals include closed connections; without, a temporary collector
    walks the broker and the counter totals cover the live connections only.
    ``connections`` are the collector's detailed connections (the most debt
    first, then the longest backlog), ``topics`` its ``top`` topics (the most
    queued deliveries first), ``groups`` the :data:`LIST_GROUPS` with the
    most lag; ``logs`` (see :func:`._log_stat.logs_document`) details the
    topics the metrics detail.
    """
    if collector is not None:
        return run_now(_document(broker, collector.snapshot_now()))
    temporary = BrokerCollector(broker, max_age=0)
    try:
        return run_now(_document(broker, temporary.snapshot_now()))
    finally:
        temporary.close()


async def build_stat_document(broker: Broker, collector: BrokerCollector) -> StatDocument:
    """:func:`stat_document` of ``collector``'s snapshot, giving the loop a
    turn between the connections it details."""
    snapshot = await collector.snapshot()
    return await run_in_pieces(_document(broker, snapshot))


def _totals(snapshot: Snapshot) -> dict[str, TotalValue]:
    document: dict[str, Any] = {}
    for (name, labels), value in snapshot.totals.values.items():
        if not labels:
            document[name] = value
            continue
        level = document.setdefault(name, {})
        for label in labels[:-1]:
            level = level.setdefault(label, {})
        level[labels[-1]] = value
    return document


def _document(broker: Broker, snapshot: Snapshot) -> Walk[StatDocument]:
    connections: list[ConnectionRow] = []
    for serial in snapshot.top:
        connection = broker.connections.get(serial)
        if connection is not None:  # else it closed since the walk
            connections.append(_connection_document(connection))
            yield
    logs = yield from logs_document(broker, snapshot.logs)
    config = broker.config
    statistics = BrokerStatistics(
        connections=snapshot.connections,  # (clients: another worker's link is none)
        connections_total=broker.connections_total,
        refused_total=broker.refused_total,
        topics=snapshot.topics,
        subscriptions=snapshot.subscriptions,
        buffer_reserved_bytes=broker.buffer_reserved,
        buffer_budget_bytes=config.global_budget,
        debt=broker.account.debt,
    )
    groups: list[GroupRow] = [
        cast(
            "GroupRow",
            {"topic": group.topic.topic_name, "group": group.name, **group.statistics()},
        )
        for group in (broker.groups.groups.values() if broker.groups is not None else ())
    ]
    groups.sort(key=lambda entry: -entry["lag"])
    section: BrokerSection = {
        "address": "{}:{}".format(*broker.address),
        "epoch": broker.epoch.hex(),
        "closing": broker.closing,
        "tls": broker.ssl_context is not None,
        "authentication": broker.auth is not None,
        "security": _plain(broker.security),
        "statistics": _plain(statistics),
        "account": _account(broker.account),
        "loop": None
        if broker.loop is None
        else {"task_steps": broker.loop.task_steps, "io_waits": broker.loop.io_waits},
    }
    if (links := broker.link_statistics()) is not None:
        section["links"] = _plain(links)
    return {
        "version": STAT_VERSION,
        "groups": groups[:LIST_GROUPS],
        "groups_total": len(groups),
        "broker": section,
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
        "totals": _totals(snapshot),
        "connections_total": snapshot.connections,
        "topics_total": snapshot.topics,
        "connections": connections,
        "topics": [cast("TopicRow", dict(topic)) for topic in snapshot.top_topics],
        "logs": logs,
        "cluster": cluster_document(snapshot.cluster),
        "mqtt": _mqtt_document(broker),
    }


def _mqtt_document(broker: Broker) -> MQTTSection | None:
    """The MQTT listener's section (None: none), its connections bounded
    as the native ones are (``metrics_top`` by debt, as many by backlog)."""
    server = broker.mqtt
    if server is None:
        return None
    totals = server.totals()
    rows: list[MQTTConnectionRow] = [
        cast("MQTTConnectionRow", {**_plain(figures), "account": _account(account)})
        for figures, account in server.connection_statistics(broker.config.metrics_top)
    ]
    return {
        "address": "{}:{}".format(*server.address),
        "tls": server.ssl_context is not None,
        "connections_open": totals.connections_open,
        "connections_accepted": totals.connections_accepted,
        "connections_refused": totals.connections_refused,
        "sessions_kept": len(server.sessions.kept),
        "wills_waiting": server.wills.waiting,
        "retained_messages": totals.retained_messages,
        "retained_bytes": totals.retained_bytes,
        "connections": rows,
    }


def _subscription_row(subscription: Subscription) -> SubscriptionRow:
    row: SubscriptionRow = {
        "handle": subscription.handle,
        "topic": subscription.topic.topic_name,
        "mode": subscription.mode,
        "queued": subscription.queued,
        "delivered": subscription.delivered,
        "next_seq": subscription.next_seq,
    }
    if isinstance(subscription, DroppingSubscription):
        row["dropped_overflow"] = subscription.dropped_overflow
        row["dropped_replaced"] = subscription.dropped_replaced
        row["gaps_sent"] = subscription.gaps_sent
        row["max_queued"] = subscription.limits.max_queued
        row["max_queued_bytes"] = subscription.limits.max_queued_bytes
    if subscription.reads_log:
        reader = reader_document(cast("LogReading", subscription))
        row["acked"] = reader["acked"]
        row["lag"] = reader["lag"]
        row["gaps_sent"] = reader["gaps_sent"]
        row["cursor"] = reader["cursor"]
    return row


def _connection_document(connection: ConnectionView) -> ConnectionRow:
    protocol = connection.protocol
    pstats = protocol.statistics()
    channels: list[ReceiverRow | SenderRow] = []
    for receiver in pstats.receivers[:LIST_LIMIT]:
        entry = cast(
            "ReceiverRow",
            {"kind": kind_name(receiver.channel), "direction": "in", **_plain(receiver)},
        )
        state = (
            connection.channels.get(receiver.channel.index)
            if receiver.channel.kind == ChannelKind.PUBLISH
            else None
        )
        if state is not None:
            entry["topic"] = state.topic.topic_name
            entry["account"] = _account(state.account)
            entry["buffered_publishes"] = len(state.buffer)
            entry["routed"] = state.routed
            entry["confirmed"] = state.confirmed
            entry["throttled"] = state.waiting
            entry["throttle_advised"] = state.advised
        channels.append(entry)
    for sender in pstats.senders[: max(0, LIST_LIMIT - len(channels))]:
        sent = cast(
            "SenderRow",
            {"kind": kind_name(sender.channel), "direction": "out", **_plain(sender)},
        )
        channels.append(sent)
    subscriptions = list(connection.subscriptions.values())
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
        "channels_total": len(pstats.receivers) + len(pstats.senders),
        "subscriptions_total": len(subscriptions),
        "channels": channels,
        "subscriptions": [_subscription_row(s) for s in subscriptions[:LIST_LIMIT]],
    }
