"""The MQTT listener end to end, over real TCP on 127.0.0.1 with paho-mqtt
(3.1.1 and 5.0) and the broker's own client: publish and subscribe at QoS 0
and 1 both ways, wildcards, the key and header mapping, PUBACK once the
record is in the topic log. Timeouts only guard against hangs."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from broker.client import open_client
from broker.metrics import BrokerCollector
from broker.server import Broker
from tests.server.helpers import url, wait_subscribed, wait_until

from .listener_helpers import (
    V5,
    V311,
    VERSIONS,
    mqtt_broker,
    mqtt_port,
    paho_client,
)

STORAGE = pytest.mark.parametrize("logged", [False, True], ids=["memory", "log"])


def _data_dir(logged: bool, tmp_path: Path) -> str | None:
    return str(tmp_path / "data") if logged else None


@VERSIONS
@STORAGE
async def test_paho_publishes_and_receives_at_qos_0_and_1(
    version: int, logged: bool, tmp_path: Path
) -> None:
    async with mqtt_broker(_data_dir(logged, tmp_path)) as broker:
        port = mqtt_port(broker)
        async with (
            paho_client(port, version=version, client_id="sub") as sub,
            paho_client(port, version=version, client_id="pub") as pub,
        ):
            assert [int(r.value) for r in await sub.subscribe("room/q1", qos=1)] == [1]
            assert [int(r.value) for r in await sub.subscribe("room/q0", qos=0)] == [0]
            await wait_subscribed(broker, "room.q1")
            for index in range(20):
                await pub.publish("room/q1", f"one-{index}".encode(), qos=1)
            await pub.publish("room/q0", b"zero", qos=0)
            got = await sub.receive(21)
            ones = [m for m in got if m.topic == "room/q1"]
            assert [m.payload for m in ones] == [f"one-{i}".encode() for i in range(20)]
            assert {m.qos for m in ones} == {1}
            zero = [m for m in got if m.topic == "room/q0"]
            assert [(m.payload, m.qos) for m in zero] == [(b"zero", 0)]
        await wait_until(lambda: not broker.mqtt or not broker.mqtt.connections, what="closed")
        assert broker.account.debt == 0


@STORAGE
async def test_mqtt_to_native_keeps_key_and_headers(logged: bool, tmp_path: Path) -> None:
    async with mqtt_broker(_data_dir(logged, tmp_path)) as broker:
        async with (
            open_client(url(broker), name="native") as native,
            native.subscribe("sensors.kitchen") as subscription,
            paho_client(mqtt_port(broker), version=V5, client_id="dev") as device,
        ):
            await wait_subscribed(broker, "sensors.kitchen")
            await device.publish(
                "sensors/kitchen",
                b"21.5",
                qos=1,
                user_properties=[("key", "k1"), ("unit", "C"), ("unit", "F")],
            )
            await device.publish("sensors/kitchen", b"plain", qos=0)
            first = await subscription.receive()
            second = await subscription.receive()
        assert first.payload == b"21.5"
        assert first.key == b"k1"
        assert list(first.headers or []) == [("unit", b"C"), ("unit", b"F"), ("mqtt-qos", b"1")]
        assert second.payload == b"plain"
        assert list(second.headers or []) == [("mqtt-qos", b"0")]
        assert second.key is None


@VERSIONS
@STORAGE
async def test_native_to_mqtt_carries_key_and_headers(
    version: int, logged: bool, tmp_path: Path
) -> None:
    async with mqtt_broker(_data_dir(logged, tmp_path)) as broker:
        async with (
            paho_client(mqtt_port(broker), version=version, client_id="app") as app,
            open_client(url(broker), name="native") as native,
        ):
            await app.subscribe("orders/eu", qos=1)
            await wait_subscribed(broker, "orders.eu")
            await native.publish("orders.eu", b"o-1", key=b"cust-7", headers=[("trace", b"t1")])
            (message,) = await app.receive()
        assert message.topic == "orders/eu"
        assert message.payload == b"o-1"
        if version == V5:
            assert message.properties.UserProperty == [("key", "cust-7"), ("trace", "t1")]


@VERSIONS
async def test_wildcards_match_as_mqtt_says(version: int, tmp_path: Path) -> None:
    async with mqtt_broker(str(tmp_path / "data")) as broker:
        async with (
            paho_client(mqtt_port(broker), version=version, client_id="w") as sub,
            open_client(url(broker), name="native") as native,
        ):
            await sub.subscribe("home/+/temp", qos=1)
            await sub.subscribe("office/#", qos=1)
            await sub.subscribe("#", qos=0)
            for topic in (
                "home.kitchen.temp",
                "home.kitchen.humidity",
                "office",
                "office.floor1.desk",
                "$SYS.uptime",
            ):
                await native.publish(topic, topic.encode())
            await native.publish("last", b"last")
            received: list[tuple[str, int]] = []
            while ("last", 0) not in received:
                (message,) = await sub.receive()
                received.append((message.topic, message.qos))
        by_qos = sorted(received)
        # Each matching subscription delivers at its own QoS; "#" never
        # matches the $-topic, nor does anything else here.
        assert by_qos == sorted(
            [
                ("home/kitchen/temp", 1),
                ("home/kitchen/temp", 0),
                ("home/kitchen/humidity", 0),
                ("office", 1),
                ("office", 0),
                ("office/floor1/desk", 1),
                ("office/floor1/desk", 0),
                ("last", 0),
            ]
        )


async def test_puback_means_the_record_is_in_the_log(tmp_path: Path) -> None:
    """Every PUBACK the publisher saw is a record the topic's log holds."""
    async with mqtt_broker(str(tmp_path / "data")) as broker:
        async with paho_client(mqtt_port(broker), version=V311, client_id="p") as pub:
            for index in range(50):
                await pub.publish("audit/trail", f"{index}".encode(), qos=1)
                topic = broker.topics["audit.trail"]
                assert topic.log is not None
                assert topic.log.written_offset >= index + 1
        async with (
            open_client(url(broker), name="reader") as reader,
            reader.subscribe("audit.trail", options={"from": "earliest"}) as subscription,
        ):
            payloads = [(await subscription.receive()).payload for _ in range(50)]
        assert payloads == [f"{i}".encode() for i in range(50)]


async def test_qos_2_publish_is_routed_once(tmp_path: Path) -> None:
    async with mqtt_broker(str(tmp_path / "data")) as broker:
        async with (
            open_client(url(broker), name="native") as native,
            native.subscribe("exact") as subscription,
            paho_client(mqtt_port(broker), version=V5, client_id="q2") as pub,
        ):
            await wait_subscribed(broker, "exact")
            for index in range(5):
                await pub.publish("exact", f"{index}".encode(), qos=2)
            await pub.publish("exact", b"end", qos=1)
            payloads = [(await subscription.receive()).payload for _ in range(6)]
        assert payloads == [b"0", b"1", b"2", b"3", b"4", b"end"]


async def test_subscription_granted_qos_2_and_unsubscribe(tmp_path: Path) -> None:
    async with (
        mqtt_broker(str(tmp_path / "data")) as broker,
        paho_client(mqtt_port(broker), version=V5, client_id="u") as client,
    ):
        assert [int(r.value) for r in await client.subscribe("t/2", qos=2)] == [2]
        assert [int(r.value) for r in await client.subscribe("$share/g/t/+", qos=1)] == [0x9E]
        await client.publish("t/2", b"a", qos=2)
        (message,) = await client.receive()
        assert (message.payload, message.qos) == (b"a", 2)
        await trio.to_thread.run_sync(client.client.unsubscribe, "t/2")
        await wait_until(
            lambda: not broker.topics.get("t.2") or not broker.topics["t.2"].subscriptions,
            what="the subscription gone",
        )
        await client.publish("t/2", b"b", qos=1)
        await client.publish("t/2b", b"c", qos=1)
        assert client.messages.empty()


def _samples(broker: Broker) -> dict[tuple[str, tuple[str, ...]], float]:
    collector = BrokerCollector(broker)
    try:
        return {
            (sample.name, tuple(sample.labels.values())): sample.value
            for family in collector.snapshot_now().families
            for sample in family.samples
        }
    finally:
        collector.close()


async def test_metrics_count_mqtt_connections_and_messages() -> None:
    async with mqtt_broker() as broker:
        before = _samples(broker)
        assert before["broker_connections_by_protocol", ("mqtt",)] == 0
        async with (
            paho_client(mqtt_port(broker), version=V5, client_id="m1") as one,
            open_client(url(broker), name="native"),
        ):
            await one.subscribe("m/x", qos=1)
            for _ in range(3):
                await one.publish("m/x", b"x", qos=1)
            await one.receive(3)
            live = _samples(broker)
            assert live["broker_connections_by_protocol", ("mqtt",)] == 1
            assert live["broker_connections_by_protocol", ("native",)] == 1
        await wait_until(lambda: broker.mqtt is not None and not broker.mqtt.connections)
        after = _samples(broker)
    assert after["broker_connections_by_protocol", ("mqtt",)] == 0
    assert after["broker_mqtt_connections_accepted_total", ()] == 1
    assert after["broker_mqtt_messages_in_total", ()] == 3
    assert after["broker_mqtt_messages_out_total", ()] == 3
    assert after["broker_mqtt_deliveries_dropped_total", ("overflow",)] == 0
