"""Clients of the broker: :func:`open_client` for trio code and
:class:`BlockingClient` for plain threads (Spark executors, scripts).

Both drive :mod:`broker.protocol`; neither re-implements it. Publishing waits
for the broker's guarantees, so backpressure reaches the caller; consuming a
delivered message is what lets the broker send the next ones.
"""

from ._async import Client, Subscription, open_client
from ._blocking import BlockingClient, BlockingSubscription, connect
from ._common import ClientError, ConnectionLost, Message, parse_url

__all__ = [
    "BlockingClient",
    "BlockingSubscription",
    "Client",
    "ClientError",
    "ConnectionLost",
    "Message",
    "Subscription",
    "connect",
    "open_client",
    "parse_url",
]
