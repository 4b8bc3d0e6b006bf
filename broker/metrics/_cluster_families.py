"""The cluster mode families of ``/metrics`` (``broker serve --cluster``).

A broker not in cluster mode exports these families with no series at all
(their ``HELP`` and ``TYPE`` lines only), as a memory-only broker does the
topic log families: nothing about streams it does not have can look
healthy or fire an alert. None has a label: they are broker-wide, so the
series count does not grow with the topics (``broker stat`` names the
topics set aside).
"""

from __future__ import annotations

from typing import Final

from ._family import MetricSpec

#: The cluster mode families, in exposition order (part of ``METRICS``).
CLUSTER_METRICS: Final[tuple[MetricSpec, ...]] = (
    MetricSpec(
        "broker_cluster_connected",
        "gauge",
        "1 while the broker's connection to the NATS servers of its JetStream cluster is "
        "up, else 0 (then nothing is stored, confirmed or delivered, and /readyz is 503).",
    ),
    MetricSpec(
        "broker_cluster_topics",
        "gauge",
        "Topics kept in streams: restored at the start or made since (at most cluster_max_topics).",
    ),
    MetricSpec(
        "broker_cluster_topics_sending",
        "gauge",
        "Topics with runs of records (or a stream's deletion) to send to their streams now.",
    ),
    MetricSpec(
        "broker_cluster_topics_set_aside",
        "gauge",
        "Topics not served because their stream could not be restored at the start (a "
        "message damaged, or not the broker's); broker stat names them. Deleting the topic "
        "starts it afresh.",
    ),
    MetricSpec(
        "broker_cluster_runs_sent_total",
        "counter",
        "Runs of records sent to the topics' streams (each counted once, however often sent).",
    ),
    MetricSpec(
        "broker_cluster_runs_resent_total",
        "counter",
        "Runs sent again because their stream did not answer (an election, a lost quorum, "
        "the connection down): their publishers wait meanwhile, nothing is lost.",
    ),
    MetricSpec(
        "broker_cluster_records_stored_total",
        "counter",
        "Records the topics' streams acknowledged as stored (then they are confirmed).",
    ),
    MetricSpec(
        "broker_cluster_writes_fenced_total",
        "counter",
        "Topics whose stream refused a run because another writer had appended to it: "
        "their log takes no more records (another broker writes the topic).",
    ),
    MetricSpec(
        "broker_cluster_front_ends",
        "gauge",
        "Front ends of the cluster in the membership this one serves with (itself "
        "included: 1 when it is alone).",
    ),
    MetricSpec(
        "broker_cluster_sessions_claimed_total",
        "counter",
        "Sessions this front end claimed from the cluster's bucket for a client that "
        "resumed one it did not hold (served by a front end that died, or by this one "
        "before it served afresh).",
    ),
    MetricSpec(
        "broker_cluster_sessions_taken_total",
        "counter",
        "Sessions another front end claimed while this one held them: their "
        "connections here were closed.",
    ),
    MetricSpec(
        "broker_cluster_store_seconds",
        "histogram",
        "Time from each send of a run to its stream's acknowledgement (JetStream's "
        "publish acknowledgement: the replicas hold it); sends not answered are resent "
        "and counted in broker_cluster_runs_resent_total instead.",
    ),
)
