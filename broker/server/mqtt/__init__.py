"""The MQTT listener: MQTT 3.1.1 and 5.0 clients over the broker's topics,
accounts and flow control (``broker serve --mqtt-listen HOST:PORT``; see
``docs/mqtt.md``).

The protocol is :mod:`broker.mqtt`'s sans-IO ``ServerConnection``; this
package is its trio driver and the adapter to the broker:

- ``_listener.py``: :class:`MQTTServer`: accepting, the connections by
  client id (take-over), closing them at a shutdown.
- ``_connection.py``: :class:`MQTTConnection`: one client's reader, writer
  and timer (CONNECT deadline, keepalive); the reader stops while the
  connection's account is in debt.
- ``_admission.py``: CONNECT: credentials (the password is a principal's
  token), client ids, the CONNACK.
- ``_publishing.py``: PUBLISH to the topics, charged to the connection's
  account, PUBACK (QoS 1) or PUBREC (QoS 2) once routed.
- ``_subscribing.py``: SUBSCRIBE and UNSUBSCRIBE: topic filters into the
  broker's topic and pattern subscriptions.
- ``_delivery.py``: what those subscriptions send: MQTT PUBLISHes within
  the client's Receive Maximum and ``max_unsent``; PUBACKs acknowledge them.
- ``_messages.py``: payload, key and headers to and from MQTT.
- ``_wills.py``: will messages, at once or after their delay.
- ``_sessions.py``: sessions kept while their clients are away (Clean
  Start 0): their filters in memory, their QoS 1 positions as durable cursors.
"""

from ._connection import MQTTConnection, MQTTConnectionStatistics
from ._delivery import DeliveryCounters
from ._listener import MQTTCannotListen, MQTTServer, MQTTTotals

__all__ = [
    "DeliveryCounters",
    "MQTTCannotListen",
    "MQTTConnection",
    "MQTTConnectionStatistics",
    "MQTTServer",
    "MQTTTotals",
]
