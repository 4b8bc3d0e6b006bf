"""The broker's trio server: listener, connections, topic actors, budgets.

:func:`serve_broker` runs a broker; the :class:`Broker` it hands to
``task_status`` is the running broker (its address, statistics, topics,
connections, and :meth:`Broker.shutdown`). Parsing bytes is
:mod:`broker.protocol`'s job; this package does the I/O and the accounting.
"""

from ._broker import Broker, BrokerStatistics, serve_broker
from ._connection import ConnectionCounters, PublishChannel, ServerConnection
from ._lossy import DroppingSubscription, OptionError, QueueLimits
from ._placement import WorkerSetup
from ._policy import BrokerPolicy
from ._rehome import rehome_state
from ._shared_counts import clear_row, create_counts
from ._topic import Subscription, Topic
from ._view import ConnectionView

__all__ = [
    "Broker",
    "BrokerPolicy",
    "BrokerStatistics",
    "ConnectionCounters",
    "ConnectionView",
    "DroppingSubscription",
    "OptionError",
    "PublishChannel",
    "QueueLimits",
    "ServerConnection",
    "Subscription",
    "Topic",
    "WorkerSetup",
    "clear_row",
    "create_counts",
    "rehome_state",
    "serve_broker",
]
