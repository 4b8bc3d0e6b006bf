"""Helpers for the MQTT listener's tests: a broker with an MQTT listener on
a loopback port, and a paho-mqtt client driven from trio (its network loop
in paho's own thread; every blocking call made in a worker thread).

Every wait has a deadline: a test that would hang fails instead.
"""

from __future__ import annotations

import queue
import socket
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import paho.mqtt.client as paho
import pytest
import trio
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties

from broker.mqtt import (
    MQTT_5,
    ConnAck,
    Connect,
    Framer,
    Packet,
    Properties,
    Publish,
    SubAck,
    Subscribe,
    Subscription,
    Will,
    decode_packet,
    encode_packet,
)
from broker.server import Broker
from tests.deploy.helpers import require_tool
from tests.server.helpers import make_config, running_broker

#: The safety net of every wait (seconds): a hang guard, never a measure.
HANG_GUARD = 30.0

V311 = paho.MQTTv311
V5 = paho.MQTTv5
VERSIONS = pytest.mark.parametrize("version", [V311, V5], ids=["3.1.1", "5.0"])


@asynccontextmanager
async def mqtt_broker(data_dir: str | None = None, **overrides: Any) -> AsyncIterator[Broker]:
    """A broker with an MQTT listener on a free loopback port (memory-only
    unless ``data_dir`` is given)."""
    settings: dict[str, Any] = {"mqtt_listen": "127.0.0.1:0"}
    if data_dir is None:
        settings["memory_only"] = True
    else:
        settings["data_dir"] = data_dir
    settings.update(overrides)
    async with running_broker(make_config(**settings)) as broker:
        yield broker


def mqtt_port(broker: Broker) -> int:
    assert broker.mqtt is not None
    return broker.mqtt.address[1]


class PahoClient:
    """A paho-mqtt client for the tests: connect, subscribe, publish and
    receive, each blocking call run in a worker thread (``await``)."""

    def __init__(
        self,
        port: int,
        *,
        version: int = V5,
        client_id: str = "",
        manual_ack: bool = False,
        receive_maximum: int | None = None,
        username: str | None = None,
        password: str | None = None,
        persistent: bool = False,
        configure: Callable[[paho.Client], None] | None = None,
    ) -> None:
        self.port = port
        self.version = version
        self.receive_maximum = receive_maximum
        self.persistent = persistent
        self.session_present = False
        self.client = paho.Client(
            paho.CallbackAPIVersion.VERSION2,
            client_id=client_id,
            clean_session=not persistent if version == V311 else None,
            protocol=version,
            manual_ack=manual_ack,
            reconnect_on_failure=False,
        )
        if username is not None or password is not None:
            self.client.username_pw_set(username, password)
        if configure is not None:
            configure(self.client)
        self.messages: queue.Queue[paho.MQTTMessage] = queue.Queue()
        self.connected = threading.Event()
        self.disconnected = threading.Event()
        self.connect_reason: Any = None
        self.disconnect_reason: Any = None
        self._subacks: dict[int, threading.Event] = {}
        self.granted: dict[int, list[Any]] = {}
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = self._on_disconnect
        self.client.on_message = self._on_message
        self.client.on_subscribe = self._on_subscribe

    def _on_connect(self, client: Any, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        self.connect_reason = reason
        self.session_present = bool(flags.session_present)
        self.connected.set()

    def _on_disconnect(
        self, client: Any, userdata: Any, flags: Any, reason: Any, props: Any
    ) -> None:
        self.disconnect_reason = reason
        self.disconnected.set()
        self.connected.set()  # (a refused CONNECT: no on_connect in some versions)

    def _on_message(self, client: Any, userdata: Any, message: paho.MQTTMessage) -> None:
        self.messages.put(message)

    def _on_subscribe(self, client: Any, userdata: Any, mid: int, reasons: Any, props: Any) -> None:
        self.granted[mid] = list(reasons)
        self._subacks.setdefault(mid, threading.Event()).set()

    def _connect(self) -> None:
        properties = None
        if self.version == V5 and (self.receive_maximum is not None or self.persistent):
            properties = PahoProperties(PacketTypes.CONNECT)
            if self.receive_maximum is not None:
                properties.ReceiveMaximum = self.receive_maximum
            if self.persistent:
                properties.SessionExpiryInterval = 3600
        if self.version == V5:
            self.client.connect(
                "127.0.0.1",
                self.port,
                keepalive=60,
                clean_start=not self.persistent,
                properties=properties,
            )
        else:
            self.client.connect("127.0.0.1", self.port, keepalive=60)
        self.client.loop_start()
        if not self.connected.wait(HANG_GUARD):
            raise AssertionError("no CONNACK in time")

    async def connect(self) -> Any:
        """Connect (the CONNACK's reason code)."""
        await trio.to_thread.run_sync(self._connect)
        return self.connect_reason

    def _subscribe(self, topic_filter: str, qos: int) -> list[Any]:
        result, mid = self.client.subscribe(topic_filter, qos=qos)
        assert result == paho.MQTT_ERR_SUCCESS
        if not self._subacks.setdefault(mid, threading.Event()).wait(HANG_GUARD):
            raise AssertionError(f"no SUBACK for {topic_filter!r} in time")
        return self.granted[mid]

    async def subscribe(self, topic_filter: str, qos: int = 1) -> list[Any]:
        """Subscribe; the SUBACK's reason codes."""
        return await trio.to_thread.run_sync(self._subscribe, topic_filter, qos)

    def _publish(
        self,
        topic: str,
        payload: bytes,
        qos: int,
        user_properties: list[tuple[str, str]],
        retain: bool,
    ) -> paho.MQTTMessageInfo:
        properties = None
        if user_properties:
            properties = PahoProperties(PacketTypes.PUBLISH)
            properties.UserProperty = user_properties
        info = self.client.publish(topic, payload, qos=qos, retain=retain, properties=properties)
        if qos:
            info.wait_for_publish(HANG_GUARD)
            assert info.is_published(), f"no acknowledgement for {topic!r} in time"
        return info

    async def publish(
        self,
        topic: str,
        payload: bytes,
        qos: int = 1,
        user_properties: list[tuple[str, str]] | None = None,
        retain: bool = False,
    ) -> paho.MQTTMessageInfo:
        """Publish; at QoS 1 and 2, return once the broker acknowledged it."""
        return await trio.to_thread.run_sync(
            self._publish, topic, payload, qos, user_properties or [], retain
        )

    def _receive(self, count: int) -> list[paho.MQTTMessage]:
        return [self.messages.get(timeout=HANG_GUARD) for _ in range(count)]

    async def receive(self, count: int = 1) -> list[paho.MQTTMessage]:
        """The next ``count`` messages (fails after the hang guard)."""
        return await trio.to_thread.run_sync(self._receive, count)

    def _close(self) -> None:
        if self.client.is_connected():
            self.client.disconnect()
        self.client.loop_stop()
        # (paho leaves its wake-up socket pair open after some endings.)
        self.client._reset_sockets()

    async def close(self) -> None:
        await trio.to_thread.run_sync(self._close)


@asynccontextmanager
async def paho_client(port: int, **options: Any) -> AsyncIterator[PahoClient]:
    """A connected :class:`PahoClient`, disconnected after the block."""
    client = PahoClient(port, **options)
    try:
        reason = await client.connect()
        assert not getattr(reason, "is_failure", False), f"CONNECT refused: {reason}"
        yield client
    finally:
        await client.close()


class RawMQTT:
    """A raw TCP connection to the MQTT listener: bytes in, bytes out."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=HANG_GUARD)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read_all(self) -> bytes:
        """Everything until the broker closes the connection."""
        chunks = []
        while True:
            chunk = self.sock.recv(65536)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)

    def close(self) -> None:
        self.sock.close()


def require_mosquitto_clients() -> tuple[str, str]:
    """The paths of ``mosquitto_pub`` and ``mosquitto_sub``; the test skips
    without them (Debian's ``mosquitto-clients``), and fails under CI
    (``$BROKER_REQUIRE_TOOLS``), which installs them."""
    hint = "apt install mosquitto-clients"
    return require_tool("mosquitto_pub", hint), require_tool("mosquitto_sub", hint)


class WireClient:
    """An MQTT client of whole packets: exactly what the test sends."""

    def __init__(self, stream: trio.SocketStream, version: int) -> None:
        self.stream = stream
        self.version = version
        self.framer = Framer()

    @classmethod
    async def connect(
        cls,
        port: int,
        client_id: str,
        *,
        version: int = MQTT_5,
        clean_start: bool = False,
        expiry: int | None = 3600,
        will: Will | None = None,
    ) -> tuple[WireClient, ConnAck]:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        client = cls(stream, version)
        properties = Properties(session_expiry_interval=expiry) if version == MQTT_5 else None
        await client.send(
            Connect(
                client_id, version, clean_start, will=will, properties=properties or Properties()
            )
        )
        connack = await client.next_packet()
        assert isinstance(connack, ConnAck), connack
        return client, connack

    async def send(self, packet: Packet) -> None:
        await self.stream.send_all(encode_packet(packet, self.version))

    async def next_packet(self) -> Packet:
        with trio.fail_after(HANG_GUARD):
            while (frame := self.framer.next_packet()) is None:
                data = await self.stream.receive_some(65536)
                assert data, "the broker closed the connection"
                self.framer.feed(data)
        return decode_packet(*frame, self.version)

    async def publishes(self, count: int) -> list[Publish]:
        got: list[Publish] = []
        while len(got) < count:
            packet = await self.next_packet()
            assert isinstance(packet, Publish), packet
            got.append(packet)
        return got

    async def subscribe(self, topic_filter: str, qos: int = 1) -> None:
        await self.send(Subscribe(1, (Subscription(topic_filter, qos),)))
        suback = await self.next_packet()
        assert isinstance(suback, SubAck) and int(suback.reasons[0]) == qos, suback

    async def cut(self) -> None:
        """Close without DISCONNECT (as a client that crashed)."""
        await self.stream.aclose()
