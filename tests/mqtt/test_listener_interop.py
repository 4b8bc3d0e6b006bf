"""What the Eclipse Paho MQTT interoperability suite checks (and Mosquitto
passes), one regression test per behaviour it found missing: a persistent
session's wildcard subscription gets what was published to its topics
while its client was away, topics made meanwhile included. Timeouts only
guard against hangs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from broker.client import open_client
from broker.mqtt import MQTT_3_1_1, MQTT_5, Disconnect, Properties, PubAck, Publish
from tests.server.helpers import url, wait_until

from .listener_helpers import WireClient, mqtt_broker, mqtt_port


def _payloads(publishes: list[Publish]) -> list[bytes]:
    return [p.payload for p in publishes]


async def _publish(broker: Any, topic: str, payloads: list[bytes]) -> None:
    async with open_client(url(broker), name="native-pub") as native:
        for payload in payloads:
            await native.publish(topic, payload)
        await native.flush()


async def _leave(broker: Any, client: WireClient) -> None:
    await client.send(Disconnect())
    await client.stream.aclose()
    await wait_until(lambda: not broker.mqtt.connections, what="closed")


async def test_a_wildcard_session_gets_what_was_published_while_away(tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    async with mqtt_broker(data) as broker:
        await _publish(broker, "old.x", [b"before"])  # (a topic there before)
        port = mqtt_port(broker)
        for version in (MQTT_3_1_1, MQTT_5):
            name = f"away-{version}"
            fresh = version == MQTT_5  # (3.1.1: Clean Session 0 is the persistent session)
            client, _ = await WireClient.connect(port, name, clean_start=fresh, version=version)
            await client.subscribe("+/+", qos=1)
            await _leave(broker, client)  # (at once: nothing matched was read yet)
        await _publish(broker, "old.x", [b"old 1"])
        await _publish(broker, "made.away", [b"new 1"])  # (a topic made while away)
        for version in (MQTT_3_1_1, MQTT_5):
            client, connack = await WireClient.connect(port, f"away-{version}", version=version)
            assert connack.session_present
            got = await client.publishes(2)
            assert sorted(_payloads(got)) == [b"new 1", b"old 1"]
            for publish in got:
                assert publish.packet_id is not None
                await client.send(PubAck(publish.packet_id))
            await _leave(broker, client)
    async with mqtt_broker(data) as broker:  # (and after a restart)
        await _publish(broker, "after.restart", [b"new 2"])
        client, connack = await WireClient.connect(mqtt_port(broker), "away-5")
        assert connack.session_present
        assert _payloads(await client.publishes(1)) == [b"new 2"]
        await client.cut()


async def test_a_delivery_goes_at_the_lower_of_the_publish_and_subscription_qos(
    tmp_path: Path,
) -> None:
    async with mqtt_broker(str(tmp_path / "data")) as broker:
        port = mqtt_port(broker)
        for version in (MQTT_3_1_1, MQTT_5):
            high, _ = await WireClient.connect(port, f"high-{version}", version=version)
            await high.subscribe("q/x", qos=2)
            low, _ = await WireClient.connect(port, f"low-{version}", version=version)
            await low.subscribe("q/x", qos=1)
            publisher, _ = await WireClient.connect(port, f"pub-{version}", version=version)
            for qos in (0, 1, 2):
                packet_id = qos or None
                await publisher.send(Publish("q/x", str(qos).encode(), qos, packet_id=packet_id))
            await _publish(broker, "q.x", [b"native"])
            got = await high.publishes(4)
            assert [(p.payload, p.qos) for p in got] == [
                (b"0", 0),
                (b"1", 1),
                (b"2", 2),
                (b"native", 2),  # (a native publish: the subscription's QoS)
            ]
            got = await low.publishes(4)
            assert [(p.payload, p.qos) for p in got] == [
                (b"0", 0),
                (b"1", 1),
                (b"2", 1),
                (b"native", 1),
            ]
            for client in (high, low, publisher):
                await client.cut()
            await wait_until(lambda: not broker.mqtt.connections, what="closed")


async def test_5_0_message_properties_are_forwarded_unchanged(tmp_path: Path) -> None:
    async with (
        mqtt_broker(str(tmp_path / "data")) as broker,
        open_client(url(broker), name="native") as native,
        native.subscribe("req", start="earliest") as records,
    ):
        port = mqtt_port(broker)
        responder, _ = await WireClient.connect(port, "responder")
        await responder.subscribe("req", qos=1)
        old, _ = await WireClient.connect(port, "old", version=MQTT_3_1_1)
        await old.subscribe("req", qos=1)
        requester, _ = await WireClient.connect(port, "requester")
        properties = Properties(
            payload_format_indicator=1,
            content_type="text/plain",
            response_topic="resp/1",
            correlation_data=b"\x00\xff334",
        )
        await requester.send(Publish("req", b"ask", 1, packet_id=1, properties=properties))
        (got,) = await responder.publishes(1)
        assert got.properties.payload_format_indicator == 1
        assert got.properties.content_type == "text/plain"
        assert got.properties.response_topic == "resp/1"
        assert got.properties.correlation_data == b"\x00\xff334"
        (plain,) = await old.publishes(1)  # (3.1.1: the payload only)
        assert plain.payload == b"ask"
        record = await records.receive()  # (native readers see them as headers)
        assert list(record.headers or []) == [
            ("mqtt-format", b"1"),
            ("mqtt-content-type", b"text/plain"),
            ("mqtt-response-topic", b"resp/1"),
            ("mqtt-correlation", b"\x00\xff334"),
            ("mqtt-qos", b"1"),
        ]
        for client in (responder, old, requester):
            await client.cut()
