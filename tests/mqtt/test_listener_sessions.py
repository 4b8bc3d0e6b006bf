"""Persistent MQTT sessions on the listener (Clean Start 0): the
subscriptions are kept while the client is away and go on, without a
SUBSCRIBE, from what the client acknowledged (durable cursors); what was
in flight unacknowledged comes again; a clean start discards the session;
a broker restart keeps the session (its subscriptions, positions and
inbound QoS 2 packet ids). Driven with a wire-level client of ``broker.mqtt``'s codec
(exactly which PUBACKs are sent) and paho. Timeouts only guard against hangs."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

from broker.client import open_client
from broker.mqtt import (
    MQTT_3_1_1,
    Disconnect,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    UnsubAck,
    Unsubscribe,
)
from broker.server.mqtt._sessions import _parse_session
from tests.server.helpers import url, wait_subscribed, wait_until

from .listener_helpers import V5, V311, WireClient, mqtt_broker, mqtt_port, paho_client


def _numbers(publishes: list[Publish]) -> list[int]:
    return [int(p.payload) for p in publishes]


async def _publish(broker: Any, topic: str, numbers: range) -> None:
    async with open_client(url(broker), name="native-pub") as native:
        for number in numbers:
            await native.publish(topic, str(number).encode())
        await native.flush()


async def test_a_session_goes_on_from_what_was_acknowledged(tmp_path: Path) -> None:
    async with mqtt_broker(str(tmp_path / "data")) as broker:
        port = mqtt_port(broker)
        client, connack = await WireClient.connect(port, "keeper", clean_start=True)
        assert not connack.session_present
        await client.subscribe("jobs/+")
        await _publish(broker, "jobs.a", range(0, 6))
        first = await client.publishes(6)
        assert _numbers(first) == list(range(6))
        for publish in first[:3]:  # 0, 1 and 2 processed; 3, 4 and 5 not
            assert publish.packet_id is not None
            await client.send(PubAck(publish.packet_id))
        assert broker.mqtt is not None
        (connection,) = broker.mqtt.connections.values()
        await wait_until(lambda: len(connection.deliveries.in_flight) == 3, what="PUBACKs applied")
        await client.cut()
        await wait_until(lambda: not broker.mqtt.connections, what="closed")  # type: ignore[union-attr]
        await _publish(broker, "jobs.a", range(6, 9))  # while it is away
        again, connack = await WireClient.connect(port, "keeper")
        assert connack.session_present
        redelivered = await again.publishes(6)  # no SUBSCRIBE: the session has it
        assert _numbers(redelivered) == [3, 4, 5, 6, 7, 8]
        for publish in redelivered:
            assert publish.packet_id is not None
            await again.send(PubAck(publish.packet_id))
        await again.send(Disconnect())
        await again.stream.aclose()
        await wait_until(lambda: not broker.mqtt.connections, what="closed")  # type: ignore[union-attr]
        # A clean start discards it: nothing of the past, no session.
        fresh, connack = await WireClient.connect(port, "keeper", clean_start=True, expiry=0)
        assert not connack.session_present
        await _publish(broker, "jobs.a", range(9, 10))
        await fresh.send(Disconnect())
        await fresh.stream.aclose()
        await wait_until(lambda: not broker.mqtt.connections, what="closed")  # type: ignore[union-attr]
        assert "keeper" not in broker.mqtt.sessions.kept
        assert broker.logs is not None
        assert not [key for key, _ in broker.logs.cursors.items() if "mqtt-" in key]


async def test_paho_clean_session_false_resumes_in_3_1_1_and_5(tmp_path: Path) -> None:
    async with mqtt_broker(str(tmp_path / "data")) as broker:
        port = mqtt_port(broker)
        for version in (V311, V5):
            name = f"paho-{version}"
            topic = f"feed{version}"
            async with paho_client(port, version=version, client_id=name, persistent=True) as c:
                await c.subscribe(f"{topic}/#", qos=1)
                await wait_subscribed(broker, topic)
            await _publish(broker, topic, range(4))
            async with paho_client(port, version=version, client_id=name, persistent=True) as c:
                assert c.session_present
                got = await c.receive(4)
                assert [m.payload for m in got] == [b"0", b"1", b"2", b"3"]


async def test_a_session_survives_a_broker_restart(tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    async with mqtt_broker(data) as broker:
        client, _ = await WireClient.connect(mqtt_port(broker), "durable", clean_start=True)
        await client.subscribe("log/x")
        await client.subscribe("log/gone")
        await client.send(Unsubscribe(2, ("log/gone",)))
        assert isinstance(await client.next_packet(), UnsubAck)
        await wait_subscribed(broker, "log.x")
        await _publish(broker, "log.x", range(5))
        got = await client.publishes(5)
        for publish in got[:2]:
            assert publish.packet_id is not None
            await client.send(PubAck(publish.packet_id))
        await client.send(Disconnect())
        await client.stream.aclose()
        await wait_until(lambda: not broker.mqtt.connections, what="closed")  # type: ignore[union-attr]
    async with mqtt_broker(data) as broker:
        assert broker.mqtt is not None
        assert list(broker.mqtt.sessions.kept["durable"].filters) == ["log/x"]
        client, connack = await WireClient.connect(mqtt_port(broker), "durable")
        assert connack.session_present  # (its filters are kept, and its positions)
        assert _numbers(await client.publishes(3)) == [2, 3, 4]  # (no SUBSCRIBE)
        await _publish(broker, "log.x", range(5, 6))
        assert _numbers(await client.publishes(1)) == [5]
        await client.cut()


async def test_inbound_qos_2_survives_a_broker_restart(tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    publish = Publish("twice/never", b"once", qos=2, packet_id=9)
    async with mqtt_broker(data) as broker:
        client, _ = await WireClient.connect(mqtt_port(broker), "q2r", clean_start=True)
        await client.send(publish)
        assert await client.next_packet() == PubRec(9)
        await client.cut()  # (no PUBREL: the client will resend the PUBLISH)
    async with mqtt_broker(data) as broker:
        client, connack = await WireClient.connect(mqtt_port(broker), "q2r")
        assert connack.session_present
        await client.send(replace(publish, dup=True))
        assert await client.next_packet() == PubRec(9)  # (received already: not routed)
        await client.send(PubRel(9))
        assert await client.next_packet() == PubComp(9)
        await client.send(replace(publish, payload=b"new", packet_id=9))  # (free again: a new one)
        assert await client.next_packet() == PubRec(9)
        await client.send(PubRel(9))
        assert await client.next_packet() == PubComp(9)
        await client.send(Disconnect())
        await client.stream.aclose()
        async with (
            open_client(url(broker), name="reader") as reader,
            reader.subscribe("twice.never", start="earliest") as subscription,
        ):
            payloads = [(await subscription.receive()).payload for _ in range(2)]
            offsets = await reader.offsets(["twice.never"])
        assert payloads == [b"once", b"new"]
        first, end = offsets["twice.never"]
        assert end - first == 2  # (no third record: no duplicate)


def test_journal_sessions_expire_by_the_wall_clock() -> None:
    parse = _parse_session
    connected = parse({"f": [["a/#", 1, None, False]], "exp": 60, "gone": None}, 100.0, 5000.0)
    assert connected is not None and connected.expires == 160.0  # (from the restart)
    assert connected.filters == {"a/#": (1, None, False, False, None)}
    left = parse({"f": [], "exp": 60, "gone": 4990.0}, 100.0, 5000.0)
    assert left is not None and left.expires == 150.0  # (10 s of its 60 gone)
    never = parse({"f": [["b", 2, 7, True]], "exp": None, "gone": 1.0}, 100.0, 5000.0)
    assert never is not None and never.expires == math.inf
    no_local = parse({"f": [["c", 1, None, False, True]], "exp": 5, "gone": None}, 0.0, 0.0)
    assert no_local is not None and no_local.filters == {"c": (1, None, False, True, None)}
    since = parse({"f": [["d", 1, None, False, False, 1234]], "exp": 5, "gone": None}, 0.0, 0.0)
    assert since is not None and since.filters == {"d": (1, None, False, False, 1234)}
    late = {"f": [["x", 1, None, False, False, "soon"]], "exp": 1, "gone": None}
    for bad in ([], {"f": [["x", 3, None, False]], "exp": 1, "gone": None}, {"exp": "1"}, late):
        assert parse(bad, 0.0, 0.0) is None


async def test_no_session_without_topic_logs_nor_with_expiry_0(tmp_path: Path) -> None:
    async with mqtt_broker() as broker:  # memory-only
        client, connack = await WireClient.connect(mqtt_port(broker), "m", expiry=60)
        assert connack.properties.session_expiry_interval == 0
        await client.subscribe("m/t")
        await client.send(Disconnect())
        await client.stream.aclose()
        await wait_until(lambda: not broker.mqtt.connections, what="closed")  # type: ignore[union-attr]
        client, connack = await WireClient.connect(mqtt_port(broker), "m", expiry=60)
        assert not connack.session_present
        await client.cut()
    async with mqtt_broker(str(tmp_path / "data")) as broker:
        client, connack = await WireClient.connect(mqtt_port(broker), "z", expiry=0)
        assert connack.properties.session_expiry_interval is None
        await client.subscribe("z/t")
        await client.send(Disconnect())
        await client.stream.aclose()
        await wait_until(lambda: not broker.mqtt.connections, what="closed")  # type: ignore[union-attr]
        client, connack = await WireClient.connect(mqtt_port(broker), "z")
        assert not connack.session_present
        await client.cut()
        client, connack = await WireClient.connect(
            mqtt_port(broker), "v3", version=MQTT_3_1_1, clean_start=False
        )
        assert not connack.session_present
        await client.cut()
        await wait_until(lambda: "v3" in broker.mqtt.sessions.kept, what="kept")  # type: ignore[union-attr]


async def test_qos_2_publish_resent_to_a_resumed_session_is_routed_once(tmp_path: Path) -> None:
    async with mqtt_broker(str(tmp_path / "data")) as broker:
        port = mqtt_port(broker)
        client, _ = await WireClient.connect(port, "q2", clean_start=True)
        publish = Publish("once/only", b"exactly", qos=2, packet_id=5)
        await client.send(publish)
        assert await client.next_packet() == PubRec(5)
        await client.cut()  # (before its PUBREL: the client resends the PUBLISH)
        await wait_until(lambda: not broker.mqtt.connections, what="closed")  # type: ignore[union-attr]
        again, connack = await WireClient.connect(port, "q2")
        assert connack.session_present
        await again.send(replace(publish, dup=True))
        assert await again.next_packet() == PubRec(5)
        await again.send(PubRel(5))
        assert await again.next_packet() == PubComp(5)
        await again.send(Disconnect())
        await again.stream.aclose()
        await _publish(broker, "once.only", range(1))  # (a marker after it)
        async with (
            open_client(url(broker), name="reader") as reader,
            reader.subscribe("once.only", start="earliest") as subscription,
        ):
            payloads = [(await subscription.receive()).payload for _ in range(2)]
        assert payloads == [b"exactly", b"0"]
