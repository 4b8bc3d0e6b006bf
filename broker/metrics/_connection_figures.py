"""The figures of one connection that ``/metrics`` exports, and their broker-wide sums.

A connection's figures are a mapping from :data:`Key` (a per-connection
family of :data:`~broker.metrics.METRICS` and its label values after
``connection``) to a number. :class:`Totals` adds such mappings up into the
broker-wide families the specs name as their ``total``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from ._families import (
    DELIVERY_DROP_REASONS,
    METRICS,
    RECEIVING_KINDS,
    SENDING_KINDS,
    kind_name,
)

if TYPE_CHECKING:
    from broker.server import ConnectionView

#: A series of a per-connection family, without its ``connection`` label:
#: the family's name and its other label values, in the spec's order.
Key = tuple[str, tuple[str, ...]]
Figures = dict[Key, float]

#: Per-connection family -> the broker-wide family that sums it.
TOTAL_OF: Final[dict[str, str]] = {spec.name: spec.total for spec in METRICS if spec.total}
#: Per-connection counters: what a closed connection leaves in the totals.
COUNTERS: Final[frozenset[str]] = frozenset(
    spec.name for spec in METRICS if spec.total and spec.type == "counter"
)


def connection_figures(connection: ConnectionView) -> Figures:
    """Every per-connection figure of ``connection`` but its info labels,
    read synchronously from its live state (cost: one pass over its channels
    and subscriptions). A closed connection's figures can still be read."""
    account = connection.account.statistics()
    counters = connection.counters
    protocol = connection.protocol
    pstats = protocol.statistics()
    channels = list(connection.channels.values())
    figures: Figures = {
        ("broker_connection_debt_bytes", ()): account.debt,
        ("broker_connection_peak_debt_bytes", ()): account.peak_debt,
        ("broker_connection_blocked", ()): 1 if account.blocked else 0,
        ("broker_connection_throttled_seconds_total", ()): account.seconds_blocked,
        ("broker_connection_channel_debt_bytes", ("publish",)): sum(
            int(state.account.debt) for state in channels
        ),
        ("broker_connection_throttled_channels", ("publish",)): sum(
            1 for state in channels if state.waiting
        ),
        ("broker_connection_received_messages_total", ()): counters.messages_in,
        ("broker_connection_received_bytes_total", ()): counters.bytes_in,
        ("broker_connection_sent_messages_total", ()): counters.messages_out,
        ("broker_connection_sent_bytes_total", ()): counters.bytes_out,
        ("broker_connection_reader_pauses_total", ()): counters.reader_pauses,
        ("broker_connection_unsent_bytes", ()): protocol.bytes_to_send,
    }
    outstanding = dict.fromkeys(RECEIVING_KINDS, 0)
    used = dict.fromkeys(RECEIVING_KINDS, 0)
    capacity = dict.fromkeys(RECEIVING_KINDS, 0)
    dropped_frames = dict.fromkeys(RECEIVING_KINDS, 0)
    dropped_bytes = dict.fromkeys(RECEIVING_KINDS, 0)
    for receiver in pstats.receivers:
        kind = kind_name(receiver.channel)
        if kind not in outstanding:
            continue
        outstanding[kind] += receiver.sender_balance
        used[kind] += receiver.buffered
        capacity[kind] += receiver.capacity
        dropped_frames[kind] += receiver.dropped_frames
        dropped_bytes[kind] += receiver.dropped_bytes
    held = dict.fromkeys(SENDING_KINDS, 0)
    unconfirmed = dict.fromkeys(SENDING_KINDS, 0)
    for sender in pstats.senders:
        kind = kind_name(sender.channel)
        if kind in held:
            held[kind] += sender.balance
            unconfirmed[kind] += sender.unconfirmed_bytes
    for kind in RECEIVING_KINDS:
        figures["broker_connection_guarantees_outstanding_bytes", (kind,)] = outstanding[kind]
        figures["broker_connection_buffer_used_bytes", (kind,)] = used[kind]
        figures["broker_connection_buffer_capacity_bytes", (kind,)] = capacity[kind]
        reason = (kind, "beyond_guarantees")
        figures["broker_connection_dropped_frames_total", reason] = dropped_frames[kind]
        figures["broker_connection_dropped_bytes_total", reason] = dropped_bytes[kind]
    unbound = ("publish", "unbound_handle")
    figures["broker_connection_dropped_frames_total", unbound] = pstats.discarded_frames
    for kind in SENDING_KINDS:
        figures["broker_connection_guarantees_held_bytes", (kind,)] = held[kind]
        figures["broker_connection_unconfirmed_bytes", (kind,)] = unconfirmed[kind]
    figures["broker_connection_topics_bound", ()] = pstats.topics_bound
    figures["broker_connection_subscriptions_bound", ()] = pstats.subscriptions_bound
    figures["broker_connection_queued_deliveries", ()] = sum(
        s.queued for s in connection.subscriptions.values()
    )
    # Kept on the connection, so that a subscription's end never lowers them.
    dropped = (counters.deliveries_overflowed, counters.deliveries_replaced)
    for why, count in zip(DELIVERY_DROP_REASONS, dropped, strict=True):
        figures["broker_connection_dropped_deliveries_total", (why,)] = count
    return figures


class Totals:
    """Broker-wide sums of connections' figures, keyed by the total families' keys.

    Every key a connection has is present from the start (at zero), so that a
    total family has all its series even before any connection exists.
    """

    def __init__(self) -> None:
        self.values: Figures = {
            (TOTAL_OF[name], labels): 0 for name, labels in _TEMPLATE if name in TOTAL_OF
        }

    def copy(self) -> Totals:
        """An independent copy."""
        other = Totals()
        other.values = dict(self.values)
        return other

    def add(self, figures: Figures, *, counters_only: bool = False) -> None:
        """Add ``figures`` (one connection's) to the totals: only its counters
        if ``counters_only`` (a closed connection keeps no gauges)."""
        values = self.values
        for (name, labels), value in figures.items():
            total = TOTAL_OF.get(name)
            if total is not None and (not counters_only or name in COUNTERS):
                values[total, labels] += value


_DROPPED = ("broker_connection_dropped_frames_total", "broker_connection_dropped_bytes_total")
_IN = (
    "broker_connection_guarantees_outstanding_bytes",
    "broker_connection_buffer_used_bytes",
    "broker_connection_buffer_capacity_bytes",
)
_OUT = ("broker_connection_guarantees_held_bytes", "broker_connection_unconfirmed_bytes")
#: The keys every connection's figures have that a total sums, in their order.
_TEMPLATE: Final[tuple[Key, ...]] = (
    ("broker_connection_blocked", ()),
    ("broker_connection_throttled_seconds_total", ()),
    ("broker_connection_channel_debt_bytes", ("publish",)),
    ("broker_connection_throttled_channels", ("publish",)),
    ("broker_connection_received_messages_total", ()),
    ("broker_connection_received_bytes_total", ()),
    ("broker_connection_sent_messages_total", ()),
    ("broker_connection_sent_bytes_total", ()),
    ("broker_connection_reader_pauses_total", ()),
    ("broker_connection_unsent_bytes", ()),
    *((name, (kind,)) for kind in RECEIVING_KINDS for name in _IN),
    *((name, (kind, "beyond_guarantees")) for kind in RECEIVING_KINDS for name in _DROPPED),
    ("broker_connection_dropped_frames_total", ("publish", "unbound_handle")),
    *((name, (kind,)) for kind in SENDING_KINDS for name in _OUT),
    *(("broker_connection_dropped_deliveries_total", (why,)) for why in DELIVERY_DROP_REASONS),
)
