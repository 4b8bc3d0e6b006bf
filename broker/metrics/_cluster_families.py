"""The cluster mode families of ``/metrics`` (``broker serve --cluster``).

A broker not in cluster mode exports these families with no series at all
(their ``HELP`` and ``TYPE`` lines only), as a memory-only broker does the
topic log families: nothing about streams it does not have can look
healthy or fire an alert. They are broker-wide, so the series count does
not grow with the topics (``broker stat`` names the topics set aside): the
one label, ``reason`` of ``broker_cluster_store_failures_total``, takes the
five values of ``STORE_FAILURES``, each exported from the start.
"""

from __future__ import annotations

from typing import Final

from broker.server.storage._replication import STORE_FAILURES

from ._family import MetricSpec

#: The values of ``reason`` (``broker_cluster_store_failures_total``).
FAILURE_REASONS: Final = STORE_FAILURES

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
        "broker_cluster_runs_in_flight",
        "gauge",
        "Runs sent to the topics' streams and not acknowledged yet (those waiting to be "
        "sent again included): at most 4 per topic; above 0 while nothing is stored, the "
        "streams do not answer (a lost quorum).",
    ),
    MetricSpec(
        "broker_cluster_store_duplicates_total",
        "counter",
        "Runs sent again that their stream answered as stored already (their first "
        "answer was lost): stored once, not twice.",
    ),
    MetricSpec(
        "broker_cluster_store_failures_total",
        "counter",
        "Sends of a run its stream did not store, by reason: timeout (no answer in 2 s), "
        "no_responders (no stream leader), unavailable (JetStream cannot store now: no "
        "quorum), "
        "connection (lost or down), refused (any other refusal). Each is sent again.",
        labels=("reason",),
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
        "broker_cluster_staged_runs_stored_total",
        "counter",
        "Runs of staged publishes (exactly-once publishing) the staging stream stored: "
        "their publishes are then confirmed.",
    ),
    MetricSpec(
        "broker_cluster_staged_runs_resent_total",
        "counter",
        "Sends of a run of staged publishes the staging stream did not answer: sent "
        "again, their publishes not confirmed meanwhile.",
    ),
    MetricSpec(
        "broker_cluster_staged_batches_read_total",
        "counter",
        "Staged batches a commit read from the staging stream, because they were staged "
        "through a front end since replaced (or this one on another disk).",
    ),
    MetricSpec(
        "broker_cluster_store_seconds",
        "histogram",
        "Time from each send of a run to its stream's acknowledgement (JetStream's "
        "publish acknowledgement: the replicas hold it); sends not answered are resent "
        "and counted in broker_cluster_runs_resent_total instead.",
    ),
    MetricSpec(
        "broker_cluster_read_seconds",
        "histogram",
        "Time of each read of a topic's stream (a pull of up to 256 runs) while restoring "
        "the topics at a start or when serving afresh; a read that JetStream does not "
        "answer is asked again for up to 60 s, all in one observation.",
    ),
)
