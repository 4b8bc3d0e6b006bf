"""The MQTT listener's flow control and refusals: a slow QoS 1 subscriber
holds back nobody and loses nothing (its backlog is the topic log, its
window the Receive Maximum); a publisher whose account is in debt is not
read; malformed input and bad credentials get their reason codes and a
clean close, never a traceback; a client that sends no CONNECT is closed.
Assertions are on counts and order, never on timing."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import pytest
import trio

from broker.client import open_client
from broker.mqtt import (
    MQTT_3_1_1,
    MQTT_5,
    ConnAck,
    Connect,
    Disconnect,
    Framer,
    PubAck,
    Publish,
    ReasonCode,
    decode_packet,
    encode_packet,
)
from tests.server.helpers import url, wait_subscribed, wait_until

from .listener_helpers import (
    HANG_GUARD,
    V5,
    V311,
    PahoClient,
    RawMQTT,
    mqtt_broker,
    mqtt_port,
    paho_client,
)


def _packets(data: bytes, version: int) -> list[object]:
    framer = Framer()
    framer.feed(data)
    packets = []
    while (frame := framer.next_packet()) is not None:
        packets.append(decode_packet(*frame, version))
    return packets


async def test_a_slow_qos_1_subscriber_holds_back_nobody_and_loses_nothing(
    tmp_path: Path,
) -> None:
    """The slow subscriber acknowledges nothing until the publisher is done
    and the fast one has everything; then it reads it all, in order. The
    broker never had more than its Receive Maximum in flight to it."""
    count = 300
    async with mqtt_broker(str(tmp_path / "data")) as broker:
        port = mqtt_port(broker)
        assert broker.mqtt is not None
        async with (
            paho_client(port, version=V5, client_id="fast") as fast,
            paho_client(
                port, version=V5, client_id="slow", manual_ack=True, receive_maximum=5
            ) as slow,
            paho_client(port, version=V311, client_id="pub") as pub,
        ):
            await fast.subscribe("feed", qos=1)
            await slow.subscribe("feed", qos=1)
            await wait_subscribed(broker, "feed", 2)
            for index in range(count):
                await pub.publish("feed", index.to_bytes(4, "big"), qos=1)
            got_fast = await fast.receive(count)
            assert [int.from_bytes(m.payload, "big") for m in got_fast] == list(range(count))
            (slow_connection,) = [
                c for c in broker.mqtt.connections.values() if c.client_id == "slow"
            ]
            assert len(slow_connection.deliveries.in_flight) <= 5
            assert broker.account.debt < 64 * 1024  # (its backlog is on disk)
            received = []
            while len(received) < count:
                (message,) = await slow.receive()
                received.append(int.from_bytes(message.payload, "big"))
                slow.client.ack(message.mid, message.qos)
                assert len(slow_connection.deliveries.in_flight) <= 5
            assert received == list(range(count))
            assert slow.messages.empty()


async def test_a_publisher_in_debt_is_not_read(tmp_path: Path) -> None:
    """Memory-only, a native subscriber that takes nothing: the deliveries
    queued for it are charged to the MQTT publisher, whose reader stops
    once its account is over the watermark (TCP holds the rest back)."""
    high = 64 * 1024
    async with (
        mqtt_broker(connection_high_watermark=high, connection_low_watermark=high // 2) as broker,
        open_client(url(broker), name="stuck") as native,
        native.subscribe("flood") as subscription,
    ):
        await wait_subscribed(broker, "flood")
        assert broker.mqtt is not None
        with socket.create_connection(("127.0.0.1", mqtt_port(broker))) as sock:
            sock.sendall(encode_packet(Connect("flooder", MQTT_3_1_1), MQTT_3_1_1))
            sock.setblocking(False)
            payload = b"x" * 1000
            packet = encode_packet(Publish("flood", payload), MQTT_3_1_1)
            sent = 0
            with trio.move_on_after(HANG_GUARD):
                # Until the kernel's buffers are full: the broker stopped reading.
                while True:
                    try:
                        sock.send(packet)
                        sent += 1
                    except BlockingIOError:
                        await trio.sleep(0.05)
                        try:
                            sock.send(packet)
                            sent += 1
                        except BlockingIOError:
                            break
                    else:
                        await trio.lowlevel.checkpoint()
            (connection,) = broker.mqtt.connections.values()
            await wait_until(lambda: connection.account.blocked, what="the publisher in debt")
            taken = connection.publishing.messages_in
            assert taken < sent
            assert connection.account.debt <= high + 64 * 1024 + 64 * (1000 + 256)
            # The subscriber takes its messages: the publisher is read again.
            for _ in range(taken):
                await subscription.receive()
            await wait_until(
                lambda: connection.publishing.messages_in > taken, what="reading resumed"
            )


async def test_malformed_packet_gets_its_reason_and_a_clean_close(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with mqtt_broker() as broker:
        assert broker.mqtt is not None
        port = mqtt_port(broker)
        # 5.0: a PUBLISH with QoS 3 is malformed: DISCONNECT 0x81, then closed.
        raw = RawMQTT(port)
        raw.send(encode_packet(Connect("bad", MQTT_5), MQTT_5))
        raw.send(b"\x36\x05\x00\x01ab\x00")
        packets = _packets(await trio.to_thread.run_sync(raw.read_all), MQTT_5)
        raw.close()
        assert isinstance(packets[0], ConnAck) and packets[0].reason == ReasonCode.SUCCESS
        assert isinstance(packets[-1], Disconnect)
        assert packets[-1].reason == ReasonCode.MALFORMED_PACKET
        # 3.1.1: no DISCONNECT from a server; the connection closes.
        raw = RawMQTT(port)
        raw.send(encode_packet(Connect("bad3", MQTT_3_1_1), MQTT_3_1_1))
        raw.send(b"\x36\x05\x00\x01ab\x00")
        packets = _packets(await trio.to_thread.run_sync(raw.read_all), MQTT_3_1_1)
        raw.close()
        assert [type(p) for p in packets] == [ConnAck]
        # Not MQTT at all: closed without an answer.
        raw = RawMQTT(port)
        raw.send(b"GET / HTTP/1.1\r\nHost: example.org\r\n\r\n")
        assert await trio.to_thread.run_sync(raw.read_all) == b""
        raw.close()
        # A topic with no broker name (a space): 0x90, to a 5.0 QoS 1 PUBLISH.
        raw = RawMQTT(port)
        raw.send(encode_packet(Connect("space", MQTT_5), MQTT_5))
        raw.send(encode_packet(Publish("a b", b"x", qos=1, packet_id=7), MQTT_5))
        raw.send(encode_packet(Disconnect(), MQTT_5))
        packets = _packets(await trio.to_thread.run_sync(raw.read_all), MQTT_5)
        raw.close()
        assert packets[1] == PubAck(7, ReasonCode.TOPIC_NAME_INVALID, packets[1].properties)
        await wait_until(lambda: not broker.mqtt.connections, what="every connection closed")
        assert broker.mqtt.internal_errors == 0
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_no_connect_in_time_is_closed() -> None:
    async with mqtt_broker(hello_timeout=0.2) as broker:
        raw = RawMQTT(mqtt_port(broker))
        assert await trio.to_thread.run_sync(raw.read_all) == b""
        raw.close()


AUTH = """
[principals.device]
token = "device-token"
publish = ["sensors.*"]
subscribe = ["sensors.*"]
"""


async def test_credentials_are_the_principals_tokens(tmp_path: Path) -> None:
    auth = tmp_path / "auth.toml"
    auth.write_text(AUTH)
    async with mqtt_broker(auth_file=str(auth), auth_failure_delay=0.0) as broker:
        port = mqtt_port(broker)
        for version, password, expected in (
            (V5, "wrong", 0x86),
            (V5, None, 0x87),
            (V311, "wrong", 0x86),  # (return code 4: paho reports it as 0x86)
        ):
            client = PahoClient(port, version=version, username="device", password=password)
            reason = await client.connect()
            await client.close()
            assert int(getattr(reason, "value", reason)) == expected
        async with (
            paho_client(port, version=V5, username="device", password="device-token") as dev,
            open_client(url(broker), token="device-token") as native,
            native.subscribe("sensors.t") as subscription,
        ):
            await wait_subscribed(broker, "sensors.t")
            await dev.publish("sensors/t", b"ok", qos=1)
            assert (await subscription.receive()).payload == b"ok"
            granted = await dev.subscribe("secret/x", qos=1)
            assert [int(r.value) for r in granted] == [0x87]
            info = await trio.to_thread.run_sync(
                lambda: dev.client.publish("secret/x", b"no", qos=1)
            )
            await trio.to_thread.run_sync(info.wait_for_publish, HANG_GUARD)
            # (paho reports the PUBACK's reason in its log only: the broker's
            # books say the publish went nowhere.)
            assert "secret.x" not in broker.topics


async def test_qos_0_burst_larger_than_the_output_arrives_whole() -> None:
    """A QoS 0 subscriber's queue is sent on as the writer frees room, not
    only when the next message comes."""
    async with (
        mqtt_broker(max_unsent=64 * 1024) as broker,
        paho_client(mqtt_port(broker), version=V311, client_id="sub0") as sub,
        open_client(url(broker), name="native") as native,
    ):
        await sub.subscribe("burst", qos=0)
        await wait_subscribed(broker, "burst")
        for index in range(80):
            await native.publish("burst", index.to_bytes(4, "big") + b"b" * 10_000)
        got = await sub.receive(80)
        assert [int.from_bytes(m.payload[:4], "big") for m in got] == list(range(80))


async def test_qos_0_subscriber_that_reads_nothing_drops_and_counts() -> None:
    """A QoS 0 subscriber that does not read: its queue drops the oldest,
    counted, and holds no more than its limits; the publisher is not slowed."""
    async with mqtt_broker(max_unsent=64 * 1024) as broker:
        assert broker.mqtt is not None
        with socket.create_connection(("127.0.0.1", mqtt_port(broker))) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.sendall(encode_packet(Connect("deaf", MQTT_3_1_1), MQTT_3_1_1))
            from broker.mqtt import Subscribe, Subscription

            sock.sendall(encode_packet(Subscribe(1, (Subscription("noise", 0),)), MQTT_3_1_1))
            await wait_subscribed(broker, "noise")
            async with open_client(url(broker), name="native") as native:
                for _ in range(3000):
                    await native.publish("noise", b"n" * 1000)
                await native.flush()
            (connection,) = broker.mqtt.connections.values()
            await wait_until(
                lambda: connection.deliveries.counters.deliveries_overflowed > 0,
                what="drops counted",
            )
            assert connection.deliveries.dropping_bytes <= 1024 * 1024 + 64 * 1024
            assert broker.account.debt < 4 * 1024 * 1024


async def test_a_silent_client_is_closed_after_its_keepalive() -> None:
    """CONNECT with keepalive 1 s, then nothing: closed after 1.5 s
    (5.0: DISCONNECT 0x8D Keep Alive timeout)."""
    async with mqtt_broker() as broker:
        raw = RawMQTT(mqtt_port(broker))
        raw.send(encode_packet(Connect("quiet", MQTT_5, keepalive=1), MQTT_5))
        packets = _packets(await trio.to_thread.run_sync(raw.read_all), MQTT_5)
        raw.close()
        assert isinstance(packets[0], ConnAck)
        assert packets[-1] == Disconnect(ReasonCode.KEEP_ALIVE_TIMEOUT, packets[-1].properties)


async def test_a_second_connection_takes_the_client_id_over() -> None:
    async with mqtt_broker() as broker:
        first = RawMQTT(mqtt_port(broker))
        first.send(encode_packet(Connect("same", MQTT_5), MQTT_5))
        assert broker.mqtt is not None
        await wait_until(lambda: "same" in broker.mqtt.clients, what="the first connected")  # type: ignore[union-attr]
        async with paho_client(mqtt_port(broker), version=V5, client_id="same"):
            packets = _packets(await trio.to_thread.run_sync(first.read_all), MQTT_5)
            first.close()
            assert packets[-1] == Disconnect(ReasonCode.SESSION_TAKEN_OVER, packets[-1].properties)
            assert len(broker.mqtt.clients) == 1
