"""The topic log families of ``/metrics`` (a broker with a data directory).

A memory-only broker keeps no topic log: it exports these families with no
series at all (their ``HELP`` and ``TYPE`` lines only), so that nothing
about a log it does not have can look healthy or fire an alert.

The series count does not grow with the topics. The per-topic families
(label ``topic``, the topic's name in full: topic names are checked to be
printable) carry only the topics the walk details, at most ``2 *
metrics_top``: the ``metrics_top`` with the most bytes on disk (topics whose
publishers are blocked first) and up to ``metrics_top`` more with the most
lag. The broker-wide families cover every open log: total bytes, the
largest lag, the blocked topics, the counters.

Lag is counted in records (offsets), never in bytes or seconds: a record's
size varies too much for a byte figure to be honest without reading the
log, and the broker does not know when a subscriber will catch up.
"""

from __future__ import annotations

from typing import Final

from ._family import MetricSpec

_T = ("topic",)

#: The topic log families, in exposition order (part of ``METRICS``).
LOG_METRICS: Final[tuple[MetricSpec, ...]] = (
    # -- broker-wide: every topic log the broker has open
    MetricSpec(
        "broker_topic_logs",
        "gauge",
        "Topic logs open: every topic used since the broker started (a log is opened, "
        "and recovered, at its topic's first use).",
    ),
    MetricSpec(
        "broker_log_bytes",
        "gauge",
        "Bytes of every open topic log's retained terms (headers included).",
    ),
    MetricSpec(
        "broker_subscription_max_lag_records",
        "gauge",
        "The largest lag of any reliable subscription, in records: records retained "
        "in its topic's log that its subscriber has not processed (acknowledged).",
    ),
    MetricSpec(
        "broker_topics_blocked",
        "gauge",
        "Topics whose publishers wait: a batch of their publishes waits for room in the "
        'log (when_full="block" and a reader still needs the oldest term) or for the '
        "disk (full, or failing).",
    ),
    MetricSpec(
        "broker_log_appends_total",
        "counter",
        "Records appended to topic logs (and written to their files).",
    ),
    MetricSpec(
        "broker_log_append_errors_total",
        "counter",
        "Appends to topic logs that failed: the log full (when_full=block) or the disk "
        "(full, or an I/O error). The batch waits and is retried; nothing is lost.",
    ),
    MetricSpec(
        "broker_log_fsync_seconds",
        "histogram",
        'Time of each fsync of a topic log done by the flush="batch" timer.',
    ),
    MetricSpec(
        "broker_log_truncated_records_total",
        "counter",
        "Records found lost when topic logs were opened, over the logs opened since the "
        "start: damaged (their term set aside as .damaged), in a term file gone, or "
        "missing at the end of a log (torn, cut, or short of the last offset flushed). "
        "Readers get a Gap for them.",
    ),
    MetricSpec(
        "broker_log_truncated_bytes_total",
        "counter",
        "Bytes cut from the end of topic logs or set aside with damaged terms when they "
        "were opened (see broker_log_truncated_records_total).",
    ),
    MetricSpec(
        "broker_log_gap_records",
        "gauge",
        "Records missing inside the open topic logs (lost, now or at an earlier start, "
        "and not yet deleted by retention): readers get a Gap for them.",
    ),
    MetricSpec(
        "broker_log_open_files",
        "gauge",
        "Topic log files open now: the active term files of logs written lately and the "
        "sealed terms mapped for reads, at most broker_log_open_files_limit (the least "
        "recently used is closed first).",
    ),
    MetricSpec(
        "broker_log_open_files_limit",
        "gauge",
        "Most topic log files held open at once (max_open_log_files, or its default: a "
        "quarter of the open-file limit).",
    ),
    MetricSpec(
        "broker_log_file_opens_total",
        "counter",
        "Topic log files opened: a log's first, a new term's, a file opened again after "
        "it was closed (idle, or to stay within broker_log_open_files_limit), and "
        "sealed terms mapped for reads.",
    ),
    MetricSpec(
        "broker_log_file_evictions_total",
        "counter",
        "Topic log files closed to stay within broker_log_open_files_limit (least "
        "recently used first, synced first if need be); each opens again at its next use.",
    ),
    MetricSpec(
        "broker_data_dir_free_bytes",
        "gauge",
        "Bytes free for the broker in the file system of its data directory (statvfs "
        "f_bavail: what an unprivileged process may still write).",
    ),
    MetricSpec(
        "broker_data_dir_size_bytes",
        "gauge",
        "Size of the file system of the data directory, in bytes.",
    ),
    MetricSpec(
        "broker_topic_logs_detailed",
        "gauge",
        "Topics exported with broker_topic_log_* series now: the metrics_top with the "
        "most bytes (blocked ones first), and up to as many more with the most lag.",
    ),
    # -- per topic: only the detailed topics (metrics_top)
    MetricSpec(
        "broker_topic_log_bytes",
        "gauge",
        "Bytes of the topic's retained log terms (headers included).",
        _T,
    ),
    MetricSpec(
        "broker_topic_log_first_offset",
        "gauge",
        "Offset of the first record retained in the topic's log (the next offset if "
        "it retains none).",
        _T,
    ),
    MetricSpec(
        "broker_topic_log_last_offset",
        "gauge",
        "Offset of the last record appended to the topic's log (0: none yet; while "
        "the disk fails, records appended and waiting to be written count).",
        _T,
    ),
    MetricSpec("broker_topic_log_terms", "gauge", "Term files the topic's log retains.", _T),
    MetricSpec(
        "broker_topic_blocked",
        "gauge",
        "1 while the topic's publishers wait for room in its log or for the disk, else 0.",
        _T,
    ),
    MetricSpec(
        "broker_subscription_lag_records",
        "gauge",
        "The largest lag of the topic's reliable subscriptions, in records (0: none "
        "lags, or none subscribes).",
        _T,
    ),
)
