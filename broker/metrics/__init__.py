"""Prometheus metrics, a JSON status document and a small HTTP endpoint for a running broker.

- :data:`METRICS` lists every exported family (:mod:`._specs`).
- :class:`BrokerCollector` is a custom Prometheus collector (:mod:`._collector`).
  A scrape walks the broker in pieces, giving the event loop a turn between
  them, and the walk is reused for a second; the series count does not grow
  with the connections: per-connection series exist for the ``metrics_top``
  connections with the most debt and as many with the longest backlog, and
  broker-wide families sum every connection. A broker with a data directory
  also exports its topic logs (:mod:`._log_specs`): per-topic series for the
  ``metrics_top`` topics with the most bytes and as many with the most lag,
  broker-wide figures over every log; a memory-only broker exports those
  families without series. A broker in cluster mode also exports its
  replication's counters (:mod:`._cluster_families`, no labels); another
  exports those families without series.
- :func:`stat_document` is the same state as one bounded JSON-ready ``dict``
  (what ``broker stat`` shows; :mod:`._stat`, its ``logs`` section
  :mod:`._log_stat`), typed as :class:`StatDocument` in :mod:`._stat_schema`,
  beside the rules by which a supervisor merges its workers' documents.
- :func:`serve_metrics` serves both, and the probes ``/healthz`` and
  ``/readyz`` (in cluster mode also 503 while the NATS connection is down),
  over HTTP/1.1 (parsed by ``h11``) on trio, in the broker's own thread
  (:mod:`._http`).

Everything here reads broker state from the broker's trio thread, never from
another thread.
"""

from ._collector import BrokerCollector, Snapshot, metrics_registry
from ._families import (
    CHANNEL_KINDS,
    CLIENT_NAME_LIMIT,
    DELIVERY_DROP_REASONS,
    DROP_REASONS,
    METRICS,
    sanitise_label,
)
from ._family import MetricSpec
from ._http import serve_metrics
from ._stat import build_stat_document, stat_document
from ._stat_schema import STAT_VERSION, StatDocument

__all__ = [
    "CHANNEL_KINDS",
    "CLIENT_NAME_LIMIT",
    "DELIVERY_DROP_REASONS",
    "DROP_REASONS",
    "METRICS",
    "STAT_VERSION",
    "BrokerCollector",
    "MetricSpec",
    "Snapshot",
    "StatDocument",
    "build_stat_document",
    "metrics_registry",
    "sanitise_label",
    "serve_metrics",
    "stat_document",
]
