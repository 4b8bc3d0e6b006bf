"""A NATS client on trio, with the JetStream and KV subset the broker's
cluster mode uses.

- :func:`open_nats` gives a :class:`NatsClient`: publish (``publish``,
  ``publish_nowait``), ``subscribe`` (bounded :class:`Subscription`\\ s that
  drop and report :class:`SlowConsumer` when not kept up with), ``request``
  and pipelined ``start_request`` over one inbox, ``flush``, reconnection
  across the servers with jittered backoff, TLS and credentials,
  ``statistics()`` (``_client.py``, the trio driver).
- :class:`JetStream` (streams, publishing with acknowledgements, many in
  flight as :class:`PendingAck`, stored messages, pull consumers),
  :class:`OrderedReader` and :class:`KeyValue` (``_js.py``).
- Sans-IO underneath: the protocol (``_protocol.py``: :class:`NatsConnection`,
  its events and encoders), headers with status lines (``_headers.py``) and
  the JetStream/KV JSON codecs (``_jetstream.py``).
- Errors (``_errors.py``): :class:`NatsError` and its kinds; retryable ones
  are :class:`ConnectionLost` and :class:`JetStreamUnavailable`.
- Around the servers: ``_servers.py`` starts local ``nats-server`` processes (one,
  or a JetStream cluster) for the tests, benchmarks and soak runs, faults
  and stops them by PID; ``_server_checks.py`` (sans-IO) turns a server's
  INFO and JSZ answers into the front end's start-up refusals.
"""

from ._client import (
    NatsClient,
    NatsStatistics,
    PendingReply,
    Subscription,
    SubscriptionStatistics,
    open_nats,
)
from ._errors import (
    ConnectError,
    ConnectionClosed,
    ConnectionLost,
    JetStreamError,
    JetStreamUnavailable,
    NatsError,
    NoResponders,
    PayloadTooLarge,
    RequestTimeout,
    SlowConsumer,
)
from ._headers import HeaderError, Headers
from ._jetstream import (
    ERR_CONSUMER_NOT_FOUND,
    ERR_NO_MESSAGE_FOUND,
    ERR_STREAM_NAME_IN_USE,
    ERR_STREAM_NOT_FOUND,
    ERR_WRONG_LAST_SEQUENCE,
    AckInfo,
    ConsumerConfig,
    ConsumerInfo,
    KvEntry,
    PubAck,
    StoredMsg,
    StreamConfig,
    StreamInfo,
    StreamState,
    parse_ack_reply,
)
from ._js import FetchedMsg, JetStream, KeyValue, OrderedReader, PendingAck
from ._protocol import Msg, NatsConnection

__all__ = [
    "ERR_CONSUMER_NOT_FOUND",
    "ERR_NO_MESSAGE_FOUND",
    "ERR_STREAM_NAME_IN_USE",
    "ERR_STREAM_NOT_FOUND",
    "ERR_WRONG_LAST_SEQUENCE",
    "AckInfo",
    "ConnectError",
    "ConnectionClosed",
    "ConnectionLost",
    "ConsumerConfig",
    "ConsumerInfo",
    "FetchedMsg",
    "HeaderError",
    "Headers",
    "JetStream",
    "JetStreamError",
    "JetStreamUnavailable",
    "KeyValue",
    "KvEntry",
    "Msg",
    "NatsClient",
    "NatsConnection",
    "NatsError",
    "NatsStatistics",
    "NoResponders",
    "OrderedReader",
    "PayloadTooLarge",
    "PendingAck",
    "PendingReply",
    "PubAck",
    "RequestTimeout",
    "SlowConsumer",
    "StoredMsg",
    "StreamConfig",
    "StreamInfo",
    "StreamState",
    "Subscription",
    "SubscriptionStatistics",
    "open_nats",
    "parse_ack_reply",
]
