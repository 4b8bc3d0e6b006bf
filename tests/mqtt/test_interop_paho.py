"""paho-mqtt, a real MQTT client, against a throwaway loopback server made
of :class:`broker.mqtt.ServerConnection` (3.1.1 and 5.0): connect,
subscribe, publish at QoS 0, 1 and 2 and receive them back, unsubscribe,
disconnect. Timeouts only guard against hangs."""

from __future__ import annotations

import queue
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import paho.mqtt.client as paho
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties

from broker.mqtt import (
    ConnectionClosed,
    ConnectionState,
    Disconnect,
    Publish,
    PubRec,
    PubRel,
    ReasonCode,
    ServerConnection,
    Subscribe,
    Unsubscribe,
    topic_matches,
)

HANG_GUARD = 20.0


class LoopbackServer:
    """Serves one MQTT client on 127.0.0.1: a tiny broker that routes a
    client's publishes back to its own subscriptions."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(HANG_GUARD)
        self.port: int = self.listener.getsockname()[1]
        self.errors: list[BaseException] = []
        self.events: list[object] = []
        self.conn = ServerConnection(topic_alias_maximum=8)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            sock, _ = self.listener.accept()
            with sock:
                sock.settimeout(HANG_GUARD)
                self._serve(sock)
        except BaseException as error:  # reported by the test
            self.errors.append(error)
        finally:
            self.listener.close()

    def _serve(self, sock: socket.socket) -> None:
        conn = self.conn
        subscriptions: dict[str, int] = {}
        while conn.state is not ConnectionState.CLOSED:
            data = sock.recv(65536)
            conn.receive_data(data)
            while (event := conn.next_event(time.monotonic())) is not None:
                self.events.append(event)
                self._answer(conn, event, subscriptions)
            sock.sendall(conn.data_to_send())
            if not data:
                break

    def _answer(self, conn: ServerConnection, event: object, subs: dict[str, int]) -> None:
        if isinstance(event, ConnectionClosed):
            raise AssertionError(f"closed: {event}")
        if event.__class__.__name__ == "Connect":
            conn.connack()
        elif isinstance(event, Subscribe):
            for sub in event.subscriptions:
                subs[sub.topic_filter] = sub.qos
            conn.suback(event.packet_id, [ReasonCode(sub.qos) for sub in event.subscriptions])
        elif isinstance(event, Unsubscribe):
            for topic_filter in event.topic_filters:
                subs.pop(topic_filter, None)
            conn.unsuback(event.packet_id, [ReasonCode.SUCCESS] * len(event.topic_filters))
        elif isinstance(event, Publish):
            if event.qos == 1:
                assert event.packet_id is not None
                conn.puback(event.packet_id)
            elif event.qos == 2:
                assert event.packet_id is not None
                conn.pubrec(event.packet_id)
            for topic_filter, qos in subs.items():
                if topic_matches(topic_filter, event.topic):
                    conn.publish(event.topic, event.payload, min(qos, event.qos))
        elif isinstance(event, PubRel):
            conn.pubcomp(event.packet_id)
        elif isinstance(event, PubRec):
            conn.pubrel(event.packet_id)


@pytest.fixture
def server() -> Iterator[LoopbackServer]:
    srv = LoopbackServer()
    yield srv
    srv.thread.join(HANG_GUARD)
    assert not srv.thread.is_alive()
    assert srv.errors == []


def _wait(flag: threading.Event) -> None:
    assert flag.wait(HANG_GUARD), "paho did not get there in time"


@pytest.mark.parametrize("protocol", [paho.MQTTv311, paho.MQTTv5], ids=["3.1.1", "5.0"])
def test_paho_round_trip(server: LoopbackServer, protocol: int) -> None:
    client = paho.Client(
        paho.CallbackAPIVersion.VERSION2, client_id=f"paho-{protocol}", protocol=protocol
    )
    connected, subscribed, unsubscribed = threading.Event(), threading.Event(), threading.Event()
    messages: queue.Queue[paho.MQTTMessage] = queue.Queue()
    granted: list[Any] = []
    client.on_connect = lambda *args: connected.set()
    client.on_subscribe = lambda c, u, mid, codes, props: (granted.extend(codes), subscribed.set())
    client.on_unsubscribe = lambda *args: unsubscribed.set()
    client.on_message = lambda c, u, message: messages.put(message)
    properties = None
    if protocol == paho.MQTTv5:
        properties = PahoProperties(PacketTypes.CONNECT)
        properties.TopicAliasMaximum = 4  # the server's outbound aliases meet paho's
    client.connect("127.0.0.1", server.port, keepalive=30, properties=properties)
    client.loop_start()
    try:
        _wait(connected)
        client.subscribe("test/+/x", qos=2)
        _wait(subscribed)
        assert [int(getattr(code, "value", code)) for code in granted] == [2]
        v5 = protocol == paho.MQTTv5
        for qos in (0, 1, 2):
            for round_ in range(2):
                topic = f"test/{qos}/x"
                payload = f"qos {qos} #{round_}".encode()
                info = client.publish(topic, payload, qos=qos)
                info.wait_for_publish(HANG_GUARD)
                message = messages.get(timeout=HANG_GUARD)
                assert (message.payload, message.qos) == (payload, qos)
                if v5 and round_:
                    # The server's outbound alias, set the first time; paho 2
                    # hands aliases to the application unresolved.
                    assert message.topic == ""
                    assert message.properties is not None
                    assert message.properties.TopicAlias == qos + 1
                else:
                    assert message.topic == topic
        if v5:  # paho's own topic alias (set, then used alone) resolved by the server
            for topic in ("test/alias/x", ""):
                alias = PahoProperties(PacketTypes.PUBLISH)
                alias.TopicAlias = 1
                client.publish(topic, b"aliased", qos=1, properties=alias).wait_for_publish(
                    HANG_GUARD
                )
                assert messages.get(timeout=HANG_GUARD).payload == b"aliased"
            inbound = [e for e in server.events if isinstance(e, Publish)][-2:]
            assert [e.topic for e in inbound] == ["test/alias/x", "test/alias/x"]
        client.unsubscribe("test/+/x")
        _wait(unsubscribed)
        client.publish("test/9/x", b"nobody", qos=1).wait_for_publish(HANG_GUARD)
    finally:
        client.disconnect()
        client.loop_stop()
    server.thread.join(HANG_GUARD)
    assert isinstance(server.events[-1], Disconnect)
    assert server.conn.session_state().outbound_unacked == {}
    assert messages.empty()
