"""MQTT 3.1.1 and 5.0, sans-IO: bytes in, events out, bytes to send.

The foundation of the MQTT listener (issue 45). Nothing here performs I/O,
reads a clock or imports trio; time is a parameter. The trio listener
drives a :class:`ServerConnection` per client, as the native listener
drives ``broker.protocol.Connection``.

Why our own code, not a library (checked when this package was written)
-----------------------------------------------------------------------
- ``mqttproto`` (agronholm, MIT): sans-IO state machines for clients and a
  broker, but MQTT 5.0 only (its CONNECT decoder refuses any level but 5),
  pre-1.0, and not installable from the registry this project uses.
- ``moat-lib-mqtt`` 0.8.7 (its fork, MIT, Python >= 3.10): 5.0 only, and
  brings anyio, attrs, httpx-ws and stamina as runtime dependencies.
- ``mqtt5`` 0.8.0 (Rust, BSD): a fast packet codec, 5.0 only, no state
  machine.
- ``mqtt-codec`` 1.0.2: 3.1.1 only, last released 2019.
- ``amqtt``/``hbmqtt``, ``gmqtt``, ``paho-mqtt``: asyncio or threaded
  brokers and clients, not sans-IO (paho is used in the tests as the
  independent client).

None speaks both 3.1.1 and 5.0 in the server role, so this package adds no
runtime dependency.

The API the listener uses
-------------------------
::

    conn = ServerConnection(max_packet_size=..., receive_maximum=...,
                            topic_alias_maximum=...)
    conn.receive_data(data)            # b"" when the client closed
    while (event := conn.next_event(now)) is not None:
        ...                            # Connect, Publish, PubAck, PubRec, PubRel,
                                       # PubComp, Subscribe, Unsubscribe, PingReq,
                                       # Disconnect, ConnectionClosed
    conn.connack(...); conn.publish(...) -> packet id; conn.puback(id)
    conn.pubrec(id); conn.pubrel(id); conn.pubcomp(id); conn.suback(id, reasons)
    conn.unsuback(id, reasons); conn.disconnect(reason)
    conn.forget_outbound(id)           # a restored PUBLISH that cannot be resent
    stream.send_all(conn.data_to_send())
    conn.state is ConnectionState.CLOSED  # then flush and close the socket

- After a :class:`Connect` event nothing is read until :meth:`connack`
  (accept, refuse, or restore a :class:`SessionState` from
  :meth:`ServerConnection.session_state`, kept with the session so QoS 2
  survives a restart).
- Inbound QoS 1: ``puback(id)``; QoS 2: ``pubrec(id)``, then on
  :class:`PubRel` ``pubcomp(id)``. Outbound: ``publish`` within
  :attr:`ServerConnection.send_quota`; :class:`PubAck` ends QoS 1;
  :class:`PubRec` asks for ``pubrel(id)``; :class:`PubComp` ends QoS 2.
- :meth:`ServerConnection.check_keepalive` at
  :meth:`ServerConnection.keepalive_deadline`;
  :attr:`ServerConnection.will_due` once closed.
- Subscribe events carry filters as sent: check them with
  :func:`topic_filter_problem` and :func:`parse_shared`, map them with
  :func:`broker_topic_filter` (each subscription's answer is the
  application's SUBACK reason). Publish events carry a checked topic name
  (aliases resolved); :func:`broker_topic_name` maps it, or refuses (0x90).
- Errors: the client's violations never raise from ``next_event``: they
  end in :class:`ConnectionClosed` with the answer queued. The codec raises
  :class:`MQTTProtocolError` (a reason code and a line) for bad bytes, and
  any misuse by the application raises :class:`MQTTUsageError`.

The modules
-----------
- ``_codes.py``: protocol levels, :class:`PacketType`, :class:`ReasonCode`
  (spec names), which packet may carry which reason, 3.1.1 CONNACK codes.
- ``_errors.py``: :class:`MQTTError`, :class:`MQTTProtocolError`,
  :class:`MQTTUsageError`, :class:`PacketTooLargeForPeer`.
- ``_wire.py``: integers, variable byte integers, UTF-8 strings, binary.
- ``_properties.py``: :class:`Properties` and :class:`PropertyId`: every
  5.0 property, its type, the packets that may carry it, its codec.
- ``_packets.py``: one frozen class per control packet, both versions.
- ``_codec.py``: :func:`encode_packet`, :func:`decode_packet`.
- ``_framing.py``: :class:`Framer`: bytes split anywhere in, packets out,
  a maximum packet size enforced (0x95).
- ``_topics.py``: MQTT topic rules, matching, ``$share/``, and the
  documented mapping to and from broker topic names and patterns.
- ``_connection.py``: :class:`ServerConnection`, its events and
  :class:`SessionState`.
"""

from ._codec import decode_packet, encode_packet
from ._codes import MQTT_3_1_1, MQTT_5, PacketType, ReasonCode, v3_connack_code
from ._connection import (
    ConnectionClosed,
    ConnectionState,
    Event,
    ServerConnection,
    SessionState,
)
from ._errors import MQTTError, MQTTProtocolError, MQTTUsageError, PacketTooLargeForPeer
from ._framing import DEFAULT_MAX_PACKET_SIZE, MAX_PACKET_SIZE, Framer
from ._packets import (
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    PingReq,
    PingResp,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    Subscription,
    UnsubAck,
    Unsubscribe,
    Will,
)
from ._properties import NO_PROPERTIES, Properties, PropertyId
from ._topics import (
    BrokerFilter,
    SharedSubscription,
    TopicError,
    broker_topic_filter,
    broker_topic_name,
    mqtt_topic_filter,
    mqtt_topic_name,
    parse_shared,
    topic_filter_problem,
    topic_matches,
    topic_name_problem,
)

__all__ = [
    "DEFAULT_MAX_PACKET_SIZE",
    "MAX_PACKET_SIZE",
    "MQTT_3_1_1",
    "MQTT_5",
    "NO_PROPERTIES",
    "Auth",
    "BrokerFilter",
    "ConnAck",
    "Connect",
    "ConnectionClosed",
    "ConnectionState",
    "Disconnect",
    "Event",
    "Framer",
    "MQTTError",
    "MQTTProtocolError",
    "MQTTUsageError",
    "Packet",
    "PacketTooLargeForPeer",
    "PacketType",
    "PingReq",
    "PingResp",
    "Properties",
    "PropertyId",
    "PubAck",
    "PubComp",
    "PubRec",
    "PubRel",
    "Publish",
    "ReasonCode",
    "ServerConnection",
    "SessionState",
    "SharedSubscription",
    "SubAck",
    "Subscribe",
    "Subscription",
    "TopicError",
    "UnsubAck",
    "Unsubscribe",
    "Will",
    "broker_topic_filter",
    "broker_topic_name",
    "decode_packet",
    "encode_packet",
    "mqtt_topic_filter",
    "mqtt_topic_name",
    "parse_shared",
    "topic_filter_problem",
    "topic_matches",
    "topic_name_problem",
    "v3_connack_code",
]
