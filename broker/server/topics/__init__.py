"""Topic actors and the subscriptions they fan out into, one module per mode.

``_topic`` (``Topic``: routing a batch to its log and its subscriptions),
``_log_subscription`` (reliable: a position in the topic's log),
``_lossy`` (lossy and latest: dropping queues), ``_groups`` (consumer
groups), ``_subscribe`` (which subscription a ``Subscribe`` makes).
"""
