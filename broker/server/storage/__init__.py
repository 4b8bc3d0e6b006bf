"""What the broker keeps on disk for its topics: the topic logs in use.

``_store`` (``TopicStore``: what a topic and its readers use of a topic's
storage, the seam a second storage engine plugs into), ``_topic_logs``
(``TopicLogs``: opening, flushing, expiring the logs; the host of every
topic's log), ``_publish_marks`` (where each publisher's publishes went),
``_offsets`` (answering ``ListOffsets``); in cluster mode, ``_replicated``,
``_replication`` and ``_jetstream`` (the topics' streams), ``_kv_state``
(state a topic's owner writes late to a KV bucket),
``_cluster_cursors`` and ``_cluster_groups`` (the durable cursors and
the consumer groups kept there).
"""
