"""QoS 2 deliveries on the MQTT listener (PUBLISH, PUBREC, PUBREL, PUBCOMP
out), and a resumed session's deliveries in flight sent again with their
original packet ids and DUP set, its released ones with PUBREL again (MQTT
5.0 and 3.1.1 section 4.4): across a reconnection, a broker restart, and
(QoS 2) a kill -9. Timeouts only guard against hangs."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.client import open_client
from broker.mqtt import (
    MQTT_3_1_1,
    Disconnect,
    PingReq,
    PingResp,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
)
from tests.measure._process import free_port, wait_listening
from tests.server.helpers import url, wait_subscribed, wait_until
from tests.server.processes import running_broker

from .listener_helpers import VERSIONS, WireClient, mqtt_broker, mqtt_port, paho_client


@VERSIONS
async def test_paho_receives_at_qos_2_in_order(version: int, tmp_path: Path) -> None:
    async with (
        mqtt_broker(str(tmp_path / "data")) as broker,
        paho_client(mqtt_port(broker), version=version) as reader,
        paho_client(mqtt_port(broker), version=version) as writer,
    ):
        await reader.subscribe("q2/#", qos=2)
        await wait_subscribed(broker, "q2")
        for index in range(20):
            await writer.publish(f"q2/{index % 3}", str(index).encode(), qos=2)
        got = await reader.receive(20)
        assert [int(m.payload) for m in got] == list(range(20))
        assert {m.qos for m in got} == {2}
        assert broker.mqtt is not None
        await wait_until(
            lambda: all(not c.deliveries.in_flight for c in broker.mqtt.connections.values()),  # type: ignore[union-attr]
            what="every flow complete",
        )


async def _publish(address: str, topic: str, count: int) -> None:
    async with open_client(address, name="native-pub") as native:
        for index in range(count):
            await native.publish(topic, str(index).encode())
        await native.flush()


async def _in_flight_then_away(client: WireClient) -> tuple[Publish, Publish, Publish]:
    """Of three QoS 2 deliveries: the first completed, the second PUBREC'd
    (its PUBREL not answered), the third not acknowledged at all."""
    first, second, third = await client.publishes(3)
    assert [p.payload for p in (first, second, third)] == [b"0", b"1", b"2"]
    for publish in (first, second):
        assert publish.qos == 2 and publish.packet_id is not None
        await client.send(PubRec(publish.packet_id))
        assert await client.next_packet() == PubRel(publish.packet_id)
    assert first.packet_id is not None
    await client.send(PubComp(first.packet_id))
    await client.send(PingReq())  # (answered once the PUBCOMP is applied)
    assert await client.next_packet() == PingResp()
    return first, second, third


async def _resumed(client: WireClient, second: Publish, third: Publish) -> None:
    """PUBREL of the second again, the third again with its packet id and
    DUP, then the flows end and nothing else comes."""
    assert second.packet_id is not None and third.packet_id is not None
    assert await client.next_packet() == PubRel(second.packet_id)
    again = await client.next_packet()
    assert isinstance(again, Publish)
    assert (again.payload, again.packet_id, again.dup, again.qos) == (
        b"2",
        third.packet_id,
        True,
        2,
    )
    await client.send(PubComp(second.packet_id))
    await client.send(PubRec(third.packet_id))
    assert await client.next_packet() == PubRel(third.packet_id)
    await client.send(PubComp(third.packet_id))


@pytest.mark.parametrize("version", [5, MQTT_3_1_1], ids=["5.0", "3.1.1"])
async def test_a_resumed_session_resends_with_the_original_packet_ids(
    version: int, tmp_path: Path
) -> None:
    async with mqtt_broker(str(tmp_path / "data")) as broker:
        port = mqtt_port(broker)
        # (3.1.1: Clean Session 0 is what keeps the session)
        clean = version == 5
        client, _ = await WireClient.connect(port, "r", version=version, clean_start=clean)
        await client.subscribe("r/x", qos=2)
        await wait_subscribed(broker, "r.x")
        await _publish(url(broker), "r.x", 3)
        _, second, third = await _in_flight_then_away(client)
        await client.cut()
        assert broker.mqtt is not None
        await wait_until(lambda: not broker.mqtt.connections, what="closed")  # type: ignore[union-attr]
        again, connack = await WireClient.connect(port, "r", version=version)
        assert connack.session_present
        await _resumed(again, second, third)
        await again.send(Disconnect())
        await again.stream.aclose()


async def test_qos_1_in_flight_resent_with_its_packet_id_after_a_restart(tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    async with mqtt_broker(data) as broker:
        client, _ = await WireClient.connect(mqtt_port(broker), "one", clean_start=True)
        await client.subscribe("o/x", qos=1)
        await wait_subscribed(broker, "o.x")
        await _publish(url(broker), "o.x", 2)
        first, second = await client.publishes(2)
        assert first.packet_id is not None
        await client.send(PubAck(first.packet_id))
        await client.send(Disconnect())
        await client.stream.aclose()
        assert broker.mqtt is not None
        await wait_until(lambda: not broker.mqtt.connections, what="closed")  # type: ignore[union-attr]
    async with mqtt_broker(data) as broker:
        again, connack = await WireClient.connect(mqtt_port(broker), "one")
        assert connack.session_present
        (resent,) = await again.publishes(1)
        assert (resent.payload, resent.packet_id, resent.dup) == (b"1", second.packet_id, True)
        await again.send(PubAck(second.packet_id or 0))
        await again.send(Disconnect())
        await again.stream.aclose()


@pytest.mark.slow
async def test_qos_2_deliveries_survive_kill_9(tmp_path: Path) -> None:
    mqtt = free_port()
    with running_broker(tmp_path, f"mqtt_listen=127.0.0.1:{mqtt}") as broker:
        wait_listening(mqtt)
        client, _ = await WireClient.connect(mqtt, "k", clean_start=True)
        await client.subscribe("k/x", qos=2)
        await _publish(broker.url, "k.x", 3)
        _, second, third = await _in_flight_then_away(client)
        broker.kill()
        await client.stream.aclose()
        broker.start()
        wait_listening(mqtt)
        again, connack = await WireClient.connect(mqtt, "k")
        assert connack.session_present
        await _resumed(again, second, third)
        await again.send(Disconnect())
        await again.stream.aclose()
