"""Clients of the broker: :func:`open_client` for trio code and
:class:`BlockingClient` for plain threads (Spark executors, scripts).

Both drive :mod:`broker.protocol`; neither re-implements it. Publishing waits
for the broker's guarantees, so backpressure reaches the caller; consuming a
delivered message is what lets the broker send the next ones.

:func:`open_cluster_client` and :class:`BlockingClusterClient` spread topics
over several brokers, each topic on the broker :func:`route` names.

Inside, one sans-IO session (``_core.py``: the protocol connection, topic
handles, counters, inboxes, what to resume; ``_flows.py``: the operations
that wait, as generators of conditions; ``_resume.py``: the reconnection
plan) is driven by a thin trio driver (``_trio_driver.py``, under
``_async.py``) and a thin blocking driver (``_blocking_driver.py`` over
``_socket.py``, under ``_blocking.py``); ``_cluster.py`` routes over either.

Every entry point that takes a topic name checks it first (the rule is
:func:`check_topic_name`; a bad name raises :class:`TopicNameError`, a
``ValueError``, before anything is sent).

On a broker that keeps topic logs, ``subscribe(topic, start=..., cursor=...)``
says where a reliable subscription starts (``_start.py`` makes the Subscribe
options) and each :class:`Message` carries its record's ``offset``.
"""

from broker.protocol import TopicNameError, check_topic_name

from ._async import Client, Subscription, open_client
from ._blocking import BlockingClient, BlockingSubscription, connect
from ._cluster import (
    BlockingClusterClient,
    ClusterClient,
    open_cluster_client,
    parse_servers,
    route,
)
from ._common import (
    AdminRefused,
    ClientError,
    ConnectionLost,
    LimitReached,
    Message,
    StagingRefused,
    parse_url,
    split_url,
)
from ._start import Start

__all__ = [
    "AdminRefused",
    "BlockingClient",
    "BlockingClusterClient",
    "BlockingSubscription",
    "Client",
    "ClientError",
    "ClusterClient",
    "ConnectionLost",
    "LimitReached",
    "Message",
    "StagingRefused",
    "Start",
    "Subscription",
    "TopicNameError",
    "check_topic_name",
    "connect",
    "open_client",
    "open_cluster_client",
    "parse_servers",
    "parse_url",
    "route",
    "split_url",
]
