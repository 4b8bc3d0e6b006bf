"""The Prometheus collector: a walk over the broker in pieces, cached between scrapes.

One walk (:meth:`BrokerCollector.snapshot`) visits every connection and
topic once, :data:`CHUNK` at a time with a trio checkpoint after each piece,
so the event loop serves clients in between however many connections there
are. It sums every connection's figures into the broker-wide families and
keeps per-connection series only for the ``top`` connections with the most
debt (blocked ones first) and up to ``top`` more with the longest backlog
(queued deliveries, then unsent output: the slow subscribers that debt
points at), so the series count does not grow with the connections. Its
result (:class:`Snapshot`, families and their text) is reused for
``max_age`` seconds, and scrapes that arrive while a walk is under way wait
for that walk instead of starting another.

The walk then visits every open topic log the same way (:mod:`._log_walk`),
and reads cluster mode's counters (:mod:`._cluster_figures`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import trio
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import HistogramMetricFamily, Metric

from broker import __version__

from ._cluster_figures import ClusterFigures, add_cluster_families, cluster_figures, not_ready
from ._connection_figures import Figures, Totals, connection_figures
from ._families import METRICS, sanitise_label
from ._log_walk import LogFigures, add_log_families, log_walk
from ._walk_steps import Best, Walk, run_in_pieces, run_now

log = logging.getLogger("broker.metrics")

if TYPE_CHECKING:
    from broker.server import Broker, ConnectionView, Topic
    from broker.server.topics._groups import Groups

#: Connections (or topics) visited between two checkpoints of a walk.
CHUNK: Final = 16
#: Seconds a snapshot is reused by later scrapes (Prometheus scrapes every 15 s or more).
MAX_AGE: Final = 1.0
#: Unsent output that puts a connection with no queued deliveries among those
#: behind (less is a heartbeat or a reply on its way, not a backlog).
BACKLOG_UNSENT: Final = 64 * 1024


@dataclass(slots=True)
class Snapshot:
    """One walk's result: what a scrape exports, and what ``/stat.json`` sums up.

    ``top`` holds the serials of the detailed connections: those with the
    most debt first, then those with the longest backlog; ``top_topics`` the
    figures of the ``top`` topics with the most queued deliveries, then
    messages; ``totals`` the broker-wide sums (closed connections' counters
    included); ``finished`` the trio time the walk ended. It refers to no
    connection or topic, so a cached snapshot keeps nothing alive.
    """

    families: list[Metric]
    totals: Totals
    top: list[int]
    #: ``{"name", "publishers", "subscriptions", "queued", "messages_in"}`` of each.
    top_topics: list[dict[str, Any]]
    connections: int
    topics: int
    subscriptions: int
    queued_deliveries: int
    finished: float
    rendered: bytes | None = None
    #: The topic logs' figures (None: a memory-only broker).
    logs: LogFigures | None = None
    #: Cluster mode's figures (None: not in cluster mode).
    cluster: ClusterFigures | None = None

    def text(self) -> bytes:
        """The families in the Prometheus text format (rendered at once if
        :meth:`render` has not run)."""
        if self.rendered is None:
            self.rendered = _render(self.families)
        return self.rendered

    def render(self) -> Walk[None]:
        """Render :meth:`text` a family at a time, yielding between families."""
        pieces: list[bytes] = []
        for family in self.families:
            pieces.append(_render([family]))
            yield
        self.rendered = b"".join(pieces)


class _Families:
    """A registry-like view of a list of families, for :func:`generate_latest`."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


def _render(families: list[Metric]) -> bytes:
    text: bytes = generate_latest(_Families(families))
    return text


class BrokerCollector:
    """A Prometheus collector of one broker's live state (see :data:`METRICS`).

    Promises:

    - Every family of :data:`METRICS` is yielded on every collection, in that
      order, with the same name, type and labels; per-kind series are present
      for every kind the metric is about (zero when there is nothing of that
      kind).
    - Per-connection families carry at most ``2 * top`` connections
      (default: the broker's ``metrics_top``): the ``top`` with the most debt
      (blocked ones first; ties: the oldest), and up to ``top`` more with the
      most queued deliveries, then unsent bytes (only connections with queued
      deliveries or :data:`BACKLOG_UNSENT` unsent bytes).
      A closed connection's series are gone from the next walk on.
    - The topic log families (:mod:`._log_specs`) carry at most ``2 * top``
      topics (the most bytes, blocked first, then the most lag) and
      broker-wide figures over every open log; a memory-only broker exports
      them without series.
    - Each per-connection family with a ``total`` is summed over every
      connection into its broker-wide family; a counter's total includes what
      connections counted before they closed (while this collector existed),
      so it never goes down.
    - :meth:`snapshot` gives the loop a turn after every :data:`CHUNK`
      connections or topics; :meth:`collect` (the synchronous interface
      ``prometheus_client`` calls) reuses the latest snapshot while it is
      younger than ``max_age`` seconds, else walks at once.
    - Label values are bounded as :mod:`broker.metrics` describes.
    - :meth:`describe` yields the same families without samples, so a registry
      detects name clashes on registration without scraping.

    It registers a hook on the broker that folds each closing connection's
    counters into the totals; :meth:`close` removes it. Register it on a
    private :class:`~prometheus_client.CollectorRegistry`
    (:func:`metrics_registry`), not the global one: a process may run several
    brokers (the tests do). Use it from the broker's trio thread only.
    """

    def __init__(
        self,
        broker: Broker,
        *,
        top: int | None = None,
        max_age: float = MAX_AGE,
        chunk: int = CHUNK,
    ) -> None:
        self.broker = broker
        self.top = broker.config.metrics_top if top is None else top
        self.max_age = max_age
        self.chunk = max(1, chunk)
        #: Connections visited by the walk under way (or the last one).
        self.visited = 0
        #: Walks done.
        self.walks = 0
        self._closed = Totals()
        self._latest: Snapshot | None = None
        self._building: trio.Event | None = None
        broker.connection_closed_hooks.append(self._retire)

    def close(self) -> None:
        """Stop following closing connections (idempotent)."""
        hooks = self.broker.connection_closed_hooks
        if self._retire in hooks:
            hooks.remove(self._retire)

    def _retire(self, connection: ConnectionView) -> None:
        if connection.link:
            return  # (another worker's: its traffic is counted at its clients' worker)
        try:
            self._closed.add(connection_figures(connection), counters_only=True)
        except Exception:  # a bug of ours: the broker's cleanup must go on
            log.exception("metrics: cannot count %s's totals", connection.name)

    # ------------------------------------------------------------ prometheus_client

    def describe(self) -> Iterator[Metric]:
        """The exported families, without samples."""
        for spec in METRICS:
            yield spec.family()

    def collect(self) -> Iterator[Metric]:
        """The exported families: of the latest snapshot if it is fresh, else of a new walk."""
        yield from self.snapshot_now().families

    def snapshot_now(self) -> Snapshot:
        """A snapshot at most ``max_age`` old, walked at once if need be (the
        loop gets no turn: for tests and small brokers)."""
        return self._fresh() or self._finish(run_now(self._walk()))

    # ------------------------------------------------------------ snapshots

    def _fresh(self) -> Snapshot | None:
        latest = self._latest
        if latest is not None and trio.current_time() - latest.finished < self.max_age:
            return latest
        return None

    def _finish(self, snapshot: Snapshot) -> Snapshot:
        self._latest = snapshot
        self.walks += 1
        return snapshot

    async def snapshot(self) -> Snapshot:
        """A snapshot at most ``max_age`` old: the latest, the one being built
        (shared with whoever started it), or a new one built in pieces."""
        while (fresh := self._fresh()) is None and (building := self._building) is not None:
            walks = self.walks
            await building.wait()
            if self.walks > walks and self._latest is not None:
                return self._latest  # built after we asked: fresh enough
        if fresh is not None:
            return fresh
        self._building = done = trio.Event()
        try:
            snapshot = await run_in_pieces(self._walk())
            await run_in_pieces(snapshot.render())
            return self._finish(snapshot)
        finally:
            self._building = None
            done.set()

    async def text(self) -> bytes:
        """The Prometheus text exposition of a snapshot (see :meth:`snapshot`)."""
        return (await self.snapshot()).text()

    def _walk(self) -> Walk[Snapshot]:
        broker = self.broker
        totals = self._closed.copy()  # before the list: a connection closing later counts once
        live = broker.connection_views()
        clients = 0
        indebted: Best[tuple[ConnectionView, Figures]] = Best(self.top)
        behind: Best[tuple[ConnectionView, Figures]] = Best(self.top)
        self.visited = 0
        for index, connection in enumerate(live):
            if index and index % self.chunk == 0:
                yield
            figures = connection_figures(connection)
            self.visited += 1
            # Another worker's link is listed (it may hold a backlog) but not
            # in the totals: it carries what that worker's clients sent, which
            # that worker counts (merged, it would count twice).
            link = connection.link
            if connection.closed.is_set() or connection.serial not in broker.connections:
                if not link:
                    totals.add(figures, counters_only=True)  # closed since: counters only
                continue
            if not link:
                clients += 1
                totals.add(figures)
            blocked = figures["broker_connection_blocked", ()]
            indebted.offer(
                (blocked, figures["broker_connection_debt_bytes", ()]), (connection, figures)
            )
            backlog = (
                figures["broker_connection_queued_deliveries", ()],
                figures["broker_connection_unsent_bytes", ()],
            )
            if backlog[0] > 0 or backlog[1] >= BACKLOG_UNSENT:
                behind.offer(backlog, (connection, figures))
        topics = list(broker.topics.values())
        subscriptions = queued = 0
        busiest: Best[tuple[Topic, int]] = Best(self.top)
        stand_ins = 0
        for index, topic in enumerate(topics):
            if index and index % self.chunk == 0:
                yield
            waiting = sum(s.queued for s in topic.subscriptions)
            queued += waiting
            if topic.forwarded:
                # Another worker's topic: it counts the topic and (as its
                # link's) the subscriptions; the queues here are this one's.
                stand_ins += 1
                continue
            subscriptions += len(topic.subscriptions)
            busiest.offer((waiting, topic.messages_in), (topic, waiting))
        logs = yield from log_walk(broker, self.top, self.chunk)
        top = indebted.best()
        chosen = {connection.serial for connection, _ in top}
        top += [entry for entry in behind.best() if entry[0].serial not in chosen]
        snapshot = Snapshot(
            families=[],
            totals=totals,
            top=[connection.serial for connection, _ in top],
            top_topics=[
                {
                    "name": topic.topic_name,
                    "publishers": topic.publishing,
                    "subscriptions": len(topic.subscriptions),
                    "queued": waiting,
                    "messages_in": topic.messages_in,
                }
                for topic, waiting in busiest.best()
            ],
            connections=clients,
            topics=len(topics) - stand_ins,
            subscriptions=subscriptions,
            queued_deliveries=queued,
            finished=0.0,
            logs=logs,
            cluster=cluster_figures(broker),
        )
        snapshot.families = yield from self._families(snapshot, top)
        snapshot.finished = trio.current_time()
        return snapshot

    def _families(
        self, snapshot: Snapshot, top: list[tuple[ConnectionView, Figures]]
    ) -> Walk[list[Metric]]:
        families = {spec.name: spec.family() for spec in METRICS}

        def add(name: str, labels: list[str], value: float) -> None:
            family = families[name]
            assert not isinstance(family, HistogramMetricFamily)
            family.add_metric(labels, float(value))

        broker = self.broker
        root = broker.account.statistics()
        add("broker_build_info", [__version__], 1)
        add("broker_connections_open", [], snapshot.connections)
        add("broker_connections_accepted_total", [], broker.connections_total)
        add("broker_connections_refused_total", [], broker.refused_total)
        add("broker_topics", [], snapshot.topics)
        add("broker_subscriptions", [], snapshot.subscriptions)
        add("broker_queued_deliveries", [], snapshot.queued_deliveries)
        add("broker_buffer_reserved_bytes", [], broker.buffer_reserved)
        add("broker_buffer_budget_bytes", [], broker.config.global_budget)
        add("broker_connections_waiting_for_budget", [], broker.budget_pool.waiting)
        add("broker_debt_bytes", [], root.debt)
        add("broker_peak_debt_bytes", [], root.peak_debt)
        add("broker_ready", [], 1 if broker.ready and not_ready(broker) is None else 0)
        mqtt = broker.mqtt_totals()
        add("broker_connections_by_protocol", ["native"], snapshot.connections)
        add("broker_connections_by_protocol", ["mqtt"], mqtt.connections_open if mqtt else 0)
        add("broker_mqtt_connections_accepted_total", [], mqtt.connections_accepted if mqtt else 0)
        add("broker_mqtt_messages_in_total", [], mqtt.messages_in if mqtt else 0)
        add("broker_mqtt_messages_out_total", [], mqtt.messages_out if mqtt else 0)
        dropped = "broker_mqtt_deliveries_dropped_total"
        add(dropped, ["overflow"], mqtt.dropped_overflow if mqtt else 0)
        add(dropped, ["too_large"], mqtt.dropped_too_large if mqtt else 0)
        add(dropped, ["expired"], mqtt.dropped_expired if mqtt else 0)
        add("broker_mqtt_retained_messages", [], mqtt.retained_messages if mqtt else 0)
        add("broker_mqtt_retained_bytes", [], mqtt.retained_bytes if mqtt else 0)
        add("broker_mqtt_retained_refused_total", [], mqtt.retained_refused if mqtt else 0)
        add(
            "broker_internal_errors_total",
            [],
            broker.internal_errors + (mqtt.internal_errors if mqtt else 0),
        )
        for link in broker.link_statistics() or ():
            add("broker_forwarded_publishes_total", [link.owner], link.publishes_forwarded)
            add("broker_forwarded_deliveries_total", [link.owner], link.deliveries_relayed)
        add("broker_forwarded_duplicates_total", [], broker.seen.duplicates)
        add("broker_forwarded_origins_unknown_total", [], broker.seen.unknown)
        if broker.logs is not None:
            add("broker_publish_marks", [], len(broker.logs.marks))
        if broker.groups is not None:
            for group, shown in group_figures(broker.groups, GROUPS_SHOWN):
                add("broker_group_lag_records", [group], shown["lag"])
                add("broker_group_outstanding", [group], shown["outstanding"])
                add("broker_group_members", [group], shown["members"])
                add("broker_group_redelivered_total", [group], shown["redelivered"])
                add("broker_group_dead_lettered_total", [group], shown["dead_lettered"])
        if broker.loop is not None:
            add("broker_loop_task_steps_total", [], broker.loop.task_steps)
            add("broker_loop_io_waits_total", [], broker.loop.io_waits)
        security = broker.security
        add("broker_lease_expirations_total", [], security.lease_expirations)
        sessions = broker.sessions
        detached = sessions.detached
        # (links' sessions are no clients': they end with their link, never detached)
        add("broker_sessions", ["connected"], len(sessions.sessions) - detached - sessions.links)
        add("broker_sessions", ["detached"], detached)
        add("broker_sessions_created_total", [], sessions.created_total)
        add("broker_sessions_resumed_total", [], sessions.resumed_total)
        add("broker_sessions_unknown_total", [], sessions.unknown_total)
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
        for (name, labels), value in snapshot.totals.values.items():
            add(name, list(labels), value)
        add("broker_connections_detailed", [], len(top))
        for name, usage in broker.principals.items():
            add("broker_principal_connections", [name], usage.connections)
            add("broker_principal_buffer_reserved_bytes", [name], usage.buffer_reserved)
            add("broker_principal_buffer_budget_bytes", [name], usage.buffer_budget)
        add_log_families(families, snapshot.logs)
        add_cluster_families(families, snapshot.cluster)
        for index, (connection, figures) in enumerate(top):
            if index and index % self.chunk == 0:
                yield
            label = connection.name
            info = [label, connection.peer, sanitise_label(connection.client_name)]
            add("broker_connection_info", info, 1)
            for (name, labels), value in figures.items():
                add(name, [label, *labels], value)
        return list(families.values())


#: Consumer groups shown by name in the metrics (the rest are summed as "other").
GROUPS_SHOWN = 20


def group_figures(groups: Groups, shown: int) -> list[tuple[str, dict[str, int]]]:
    """Each consumer group's figures by label (``topic/name``): the ``shown``
    with the largest lag, and the rest summed under ``"other"``."""
    every = sorted(
        ((f"{g.topic.topic_name}/{g.name}", g.statistics()) for g in groups.groups.values()),
        key=lambda entry: -entry[1]["lag"],
    )
    chosen = [(sanitise_label(label), figures) for label, figures in every[:shown]]
    rest = every[shown:]
    if rest:
        summed = {key: sum(figures[key] for _, figures in rest) for key in rest[0][1]}
        chosen.append(("other", summed))
    return chosen


def metrics_registry(
    broker: Broker, *, top: int | None = None, max_age: float = MAX_AGE, chunk: int = CHUNK
) -> CollectorRegistry:
    """A new private registry holding only a :class:`BrokerCollector` of
    ``broker`` (which follows the broker's closing connections for as long as
    the broker lives: make one per broker, not one per scrape)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BrokerCollector(broker, top=top, max_age=max_age, chunk=chunk))
    return registry
