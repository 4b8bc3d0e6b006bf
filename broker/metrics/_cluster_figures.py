"""Cluster mode's figures: read from the broker's replication (counters only,
nothing awaited), turned into the families of :mod:`._cluster_families`
and into the ``cluster`` section of ``/stat.json``; and whether the broker
is ready as far as its streams go (``/readyz``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from broker.server.staging._stream import StagingCounters

from ._cluster_families import FAILURE_REASONS
from ._stat_schema import LOG_LIST_LIMIT, ClusterSection

if TYPE_CHECKING:
    from broker.server.storage._topic_logs import TopicLogs

#: Most topics set aside listed by name (with why) in ``/stat.json``.
SET_ASIDE_LISTED = LOG_LIST_LIMIT


class ClusterHost(Protocol):
    """What the cluster figures read of the broker (``Broker`` is one)."""

    @property
    def logs(self) -> TopicLogs | None:
        """The broker's topic logs (None: memory-only; no replication: not cluster mode)."""
        ...

    @property
    def front_ends(self) -> int:
        """Front ends in the membership it serves with (1: alone)."""
        ...

    @property
    def sessions_claimed(self) -> int:
        """Sessions claimed from the cluster's bucket."""
        ...

    @property
    def sessions_taken(self) -> int:
        """Sessions another front end claimed from it."""
        ...

    @property
    def staging_counters(self) -> StagingCounters | None:
        """The staging stream's totals (None: not in cluster mode)."""
        ...


@dataclass(slots=True)
class ClusterFigures:
    """Cluster mode's figures at one moment (no reference to the broker)."""

    connected: bool
    topics: int
    sending: int
    runs_sent: int
    runs_resent: int
    records_stored: int
    fenced: int
    front_ends: int = 1
    sessions_claimed: int = 0
    sessions_taken: int = 0
    runs_in_flight: int = 0
    duplicates: int = 0
    staged_runs_stored: int = 0
    staged_runs_resent: int = 0
    staged_batches_read: int = 0
    #: Sends not stored, by reason (every one of ``FAILURE_REASONS``).
    store_failures: dict[str, int] = field(default_factory=dict)
    store_buckets: list[tuple[str, float]] = field(default_factory=list)
    store_seconds: float = 0.0
    read_buckets: list[tuple[str, float]] = field(default_factory=list)
    read_seconds: float = 0.0
    #: The topics set aside, and why: the first :data:`SET_ASIDE_LISTED`.
    set_aside: dict[str, str] = field(default_factory=dict)
    set_aside_total: int = 0

    @property
    def stores(self) -> int:
        """Sends acknowledged (the histogram's count)."""
        return int(self.store_buckets[-1][1]) if self.store_buckets else 0

    @property
    def reads(self) -> int:
        """Reads of the streams while restoring (the histogram's count)."""
        return int(self.read_buckets[-1][1]) if self.read_buckets else 0


def cluster_figures(broker: ClusterHost) -> ClusterFigures | None:
    """The figures of ``broker``'s cluster mode (None: not in cluster mode)."""
    logs = broker.logs
    replication = None if logs is None else logs.replication
    if replication is None:
        return None
    replicator = replication.replicator
    buckets, seconds = replicator.store_times.snapshot()
    read_buckets, read_seconds = replication.read_times.snapshot()
    broken = replication.broken
    staging = broker.staging_counters or StagingCounters()
    return ClusterFigures(
        connected=replication.connected,
        topics=len(replication.logs),
        sending=replicator.busy,
        runs_sent=replicator.runs_sent,
        runs_resent=replicator.runs_resent,
        records_stored=replicator.records_stored,
        fenced=replicator.fenced,
        front_ends=broker.front_ends,
        sessions_claimed=broker.sessions_claimed,
        sessions_taken=broker.sessions_taken,
        runs_in_flight=replication.runs_in_flight,
        duplicates=replicator.duplicates,
        staged_runs_stored=staging.runs_stored,
        staged_runs_resent=staging.runs_resent,
        staged_batches_read=staging.batches_read,
        store_failures=dict(replicator.store_failures),
        store_buckets=buckets,
        store_seconds=seconds,
        read_buckets=read_buckets,
        read_seconds=read_seconds,
        set_aside={name: broken[name] for name in sorted(broken)[:SET_ASIDE_LISTED]},
        set_aside_total=len(broken),
    )


def not_ready(broker: ClusterHost) -> str | None:
    """Why ``broker`` is not ready as far as its streams go (None: it is,
    or it is not in cluster mode)."""
    logs = broker.logs
    replication = None if logs is None else logs.replication
    if replication is not None and not replication.connected:
        return "not connected to the NATS servers of its cluster"
    return None


Family = GaugeMetricFamily | CounterMetricFamily | HistogramMetricFamily


def add_cluster_families(families: Mapping[str, Family], figures: ClusterFigures | None) -> None:
    """Add the series of ``figures`` to the cluster ``families`` (by name;
    none outside cluster mode)."""
    if figures is None:
        return

    def add(name: str, value: float, labels: list[str] | None = None) -> None:
        family = families[name]
        assert not isinstance(family, HistogramMetricFamily)
        family.add_metric(labels or [], float(value))

    def histogram(name: str, buckets: list[tuple[str, float]], seconds: float) -> None:
        family = families[name]
        assert isinstance(family, HistogramMetricFamily)
        family.add_metric([], buckets=buckets, sum_value=seconds)

    add("broker_cluster_connected", 1 if figures.connected else 0)
    add("broker_cluster_topics", figures.topics)
    add("broker_cluster_topics_sending", figures.sending)
    add("broker_cluster_topics_set_aside", figures.set_aside_total)
    add("broker_cluster_runs_sent_total", figures.runs_sent)
    add("broker_cluster_runs_resent_total", figures.runs_resent)
    add("broker_cluster_runs_in_flight", figures.runs_in_flight)
    add("broker_cluster_store_duplicates_total", figures.duplicates)
    for reason in FAILURE_REASONS:
        add("broker_cluster_store_failures_total", figures.store_failures.get(reason, 0), [reason])
    add("broker_cluster_records_stored_total", figures.records_stored)
    add("broker_cluster_writes_fenced_total", figures.fenced)
    add("broker_cluster_front_ends", figures.front_ends)
    add("broker_cluster_sessions_claimed_total", figures.sessions_claimed)
    add("broker_cluster_sessions_taken_total", figures.sessions_taken)
    add("broker_cluster_staged_runs_stored_total", figures.staged_runs_stored)
    add("broker_cluster_staged_runs_resent_total", figures.staged_runs_resent)
    add("broker_cluster_staged_batches_read_total", figures.staged_batches_read)
    histogram("broker_cluster_store_seconds", figures.store_buckets, figures.store_seconds)
    histogram("broker_cluster_read_seconds", figures.read_buckets, figures.read_seconds)


def cluster_document(figures: ClusterFigures | None) -> ClusterSection | None:
    """The ``cluster`` section of ``/stat.json`` (None: not in cluster mode)."""
    if figures is None:
        return None
    return {
        "connected": figures.connected,
        "topics": figures.topics,
        "topics_sending": figures.sending,
        "runs_sent": figures.runs_sent,
        "runs_resent": figures.runs_resent,
        "runs_in_flight": figures.runs_in_flight,
        "records_stored": figures.records_stored,
        "writes_fenced": figures.fenced,
        "store_duplicates": figures.duplicates,
        "store_failures": {r: figures.store_failures.get(r, 0) for r in FAILURE_REASONS},
        "stores": figures.stores,
        "store_seconds": figures.store_seconds,
        "reads": figures.reads,
        "read_seconds": figures.read_seconds,
        "set_aside_total": figures.set_aside_total,
        "set_aside": dict(figures.set_aside),
    }
