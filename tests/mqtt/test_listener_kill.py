"""The MQTT listener's durable state across a ``kill -9`` of a real broker
process: a persistent session (its subscriptions, its inbound QoS 2 packet
ids: exactly once) and the retained messages are in the state journal
before the broker says anything that relies on them (SUBACK, PUBREC,
PUBACK). And the restart's resolution of a QoS 2 packet id whose record
may not have reached its log (the journal is written before the log)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from broker.client import open_client
from broker.log import StateJournal
from broker.mqtt import (
    Disconnect,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    Subscription,
)
from broker.server.mqtt._sessions import QOS2, SESSIONS, MQTTSessions
from tests.measure._process import free_port, wait_listening
from tests.server.processes import running_broker

from .listener_helpers import WireClient

pytestmark = pytest.mark.slow


async def test_session_qos_2_and_retained_survive_kill_9(tmp_path: Path) -> None:
    mqtt = free_port()
    with running_broker(tmp_path, f"mqtt_listen=127.0.0.1:{mqtt}") as broker:
        wait_listening(mqtt)
        client, _ = await WireClient.connect(mqtt, "k9", clean_start=True)
        await client.subscribe("k/in")
        publish = Publish("k/q2", b"exactly once", qos=2, packet_id=3)
        await client.send(publish)
        assert await client.next_packet() == PubRec(3)
        await client.send(Publish("k/ret", b"kept", 1, retain=True, packet_id=4))
        assert await client.next_packet() == PubAck(4)
        broker.kill()  # (right after the acknowledgements: nothing written later)
        await client.stream.aclose()

        broker.start()
        wait_listening(mqtt)
        again, connack = await WireClient.connect(mqtt, "k9")
        assert connack.session_present
        await again.send(replace(publish, dup=True))
        assert await again.next_packet() == PubRec(3)  # (received before: not routed)
        await again.send(PubRel(3))
        assert await again.next_packet() == PubComp(3)
        # Its subscription goes on without a SUBSCRIBE.
        other, _ = await WireClient.connect(mqtt, "other", clean_start=True, expiry=0)
        await other.send(Publish("k/in", b"hello", 1, packet_id=1))
        assert await other.next_packet() == PubAck(1)
        (got,) = await again.publishes(1)
        assert (got.topic, got.payload) == ("k/in", b"hello")
        # The retained message is there.
        await other.send(Subscribe(2, (Subscription("k/ret", 1),)))
        assert isinstance(await other.next_packet(), SubAck)
        (retained,) = await other.publishes(1)
        assert (retained.payload, retained.retain) == (b"kept", True)
        for each in (again, other):
            await each.send(Disconnect())
            await each.stream.aclose()
        async with open_client(broker.url, name="reader") as reader:
            first, end = (await reader.offsets(["k.q2"]))["k.q2"]
        assert end - first == 1  # (the QoS 2 publish once, not twice)


def test_a_restart_drops_qos_2_ids_whose_records_missed_the_log(tmp_path: Path) -> None:
    """The journal says where a QoS 2 publish goes before its log is
    written: after a crash between the two, the packet id is dropped (the
    client's resend is routed), and kept where the log has the record."""
    with StateJournal(tmp_path / "journal") as journal:
        journal.put(SESSIONS, "c", {"f": [], "exp": None, "gone": None})
        journal.put(QOS2, "c\x00" + "1", ["t", 10])  # the log ends at 10: not in it
        journal.put(QOS2, "c\x00" + "2", ["t", 9])  # in it
        journal.put(QOS2, "c\x00" + "3", [])  # acknowledged (PUBREC): in it
        journal.put(QOS2, "gone\x00" + "4", [])  # of no session: stray
        sessions = MQTTSessions(
            object(),  # type: ignore[arg-type]  (a cursor book: not used here)
            journal,
            log_end=lambda topic: 10 if topic == "t" else None,
            now=0.0,
        )
        assert sessions.kept["c"].inbound_qos2 == frozenset({2, 3})
        assert sessions.qos2_dropped == 1
        assert [key for key, _ in journal.items(QOS2)] == ["c\x002", "c\x003"]


async def test_paho_v5_resumes_its_session_after_kill_9(tmp_path: Path) -> None:
    """An independent client: paho (5.0, Clean Start 0) gets the session
    back after a kill -9 and goes on receiving without subscribing again."""
    from .listener_helpers import paho_client

    mqtt = free_port()
    with running_broker(tmp_path, f"mqtt_listen=127.0.0.1:{mqtt}") as broker:
        wait_listening(mqtt)
        async with paho_client(mqtt, client_id="paho-k9", persistent=True) as client:
            await client.subscribe("feed/#", qos=1)
        broker.kill()
        broker.start()
        wait_listening(mqtt)
        async with paho_client(mqtt, client_id="paho-k9", persistent=True) as client:
            assert client.session_present
            async with paho_client(mqtt) as publisher:
                await publisher.publish("feed/a", b"after the crash", qos=1)
            (message,) = await client.receive(1)
            assert message.payload == b"after the crash"
