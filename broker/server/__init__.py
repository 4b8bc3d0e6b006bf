"""The broker's trio server: listener, connections, topic actors, budgets.

:func:`serve_broker` runs a broker; the :class:`Broker` it hands to
``task_status`` is the running broker (its address, statistics, topics,
connections, and :meth:`Broker.shutdown`). Parsing bytes is
:mod:`broker.protocol`'s job; this package does the I/O and the accounting.
"""

from ._broker import Broker, BrokerStatistics, serve_broker
from ._view import ConnectionView
from .cluster._connection_counts import clear_row, create_counts
from .cluster._placement import WorkerSetup
from .cluster._rehome import rehome_state
from .connection._connection import ConnectionCounters, PublishChannel, ServerConnection
from .connection._policy import BrokerPolicy
from .mqtt import MQTTCannotListen, MQTTServer
from .storage._jetstream import ClusterUnavailable
from .topics._lossy import DroppingSubscription, OptionError, QueueLimits
from .topics._topic import Subscription, Topic

__all__ = [
    "Broker",
    "BrokerPolicy",
    "BrokerStatistics",
    "ClusterUnavailable",
    "ConnectionCounters",
    "ConnectionView",
    "DroppingSubscription",
    "MQTTCannotListen",
    "MQTTServer",
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
