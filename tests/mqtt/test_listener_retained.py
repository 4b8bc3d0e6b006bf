"""Retained messages on the MQTT listener: a retained PUBLISH sets its
topic's retained message (an empty one clears it), a new subscription gets
the matching ones first with the retain flag, as 5.0's Retain Handling and
Retain As Published say; they survive a broker restart (the state
journal); a native reader sees the retained publish as a record with the
``mqtt-retain`` header; the bounds refuse and count. Timeouts only guard
against hangs: every assertion is on counts and order."""

from __future__ import annotations

import subprocess
from pathlib import Path

import trio

from broker.client import open_client
from broker.mqtt import (
    MQTT_3_1_1,
    Disconnect,
    PingReq,
    PingResp,
    PubAck,
    Publish,
    SubAck,
    Subscribe,
    Subscription,
    Will,
)
from broker.server.mqtt._retained import RETAINED, RetainedStore
from tests.server.helpers import url, wait_until

from .listener_helpers import (
    HANG_GUARD,
    V5,
    V311,
    WireClient,
    mqtt_broker,
    mqtt_port,
    paho_client,
    require_mosquitto_clients,
)


async def _retain(client: WireClient, topic: str, payload: bytes, qos: int = 1) -> None:
    """Publish ``payload`` retained and wait for its PUBACK (QoS 1)."""
    packet_id = 7 if qos else None
    await client.send(Publish(topic, payload, qos, retain=True, packet_id=packet_id))
    if qos:
        assert await client.next_packet() == PubAck(7)


async def _subscribe(client: WireClient, *subscriptions: Subscription) -> None:
    await client.send(Subscribe(1, subscriptions))
    suback = await client.next_packet()
    assert isinstance(suback, SubAck), suback


async def _nothing_more(client: WireClient) -> None:
    """Nothing is queued for ``client``: a PINGREQ's answer comes next."""
    await client.send(PingReq())
    assert await client.next_packet() == PingResp()


async def _close(client: WireClient) -> None:
    await client.send(Disconnect())
    await client.stream.aclose()


async def test_a_new_subscription_gets_the_retained_messages_first(tmp_path: Path) -> None:
    async with mqtt_broker(str(tmp_path / "data")) as broker:
        port = mqtt_port(broker)
        publisher, _ = await WireClient.connect(port, "pub", clean_start=True, expiry=0)
        await _retain(publisher, "home/kitchen/temp", b"21.5")
        await _retain(publisher, "home/hall/temp", b"19.0", qos=0)
        await _retain(publisher, "home/kitchen/temp", b"22.0")  # (replaces 21.5)
        await _retain(publisher, "home/attic/temp", b"5")
        await _retain(publisher, "home/attic/temp", b"")  # (clears it)
        await publisher.send(Publish("home/cellar/temp", b"12", 1, packet_id=8))  # (not retained)
        assert await publisher.next_packet() == PubAck(8)
        await _nothing_more(publisher)

        reader, _ = await WireClient.connect(port, "reader", clean_start=True, expiry=0)
        await _subscribe(reader, Subscription("home/+/temp", 1))
        got = await reader.publishes(2)
        assert [(p.topic, p.payload, p.qos, p.retain) for p in got] == [
            ("home/hall/temp", b"19.0", 0, True),  # (at the QoS it was published at)
            ("home/kitchen/temp", b"22.0", 1, True),
        ]
        assert got[1].packet_id is not None
        await reader.send(PubAck(got[1].packet_id))
        await _nothing_more(reader)
        # Live deliveries carry retain 0, retained or not (no Retain As Published).
        await _retain(publisher, "home/hall/temp", b"19.5")
        (live,) = await reader.publishes(1)
        assert (live.topic, live.payload, live.retain) == ("home/hall/temp", b"19.5", False)
        assert broker.mqtt is not None
        totals = broker.mqtt.totals()
        assert (totals.retained_messages, totals.retained_refused) == (2, 0)
        await _close(reader)
        await _close(publisher)


async def test_retain_handling_and_retain_as_published(tmp_path: Path) -> None:
    async with mqtt_broker(str(tmp_path / "data")) as broker:
        port = mqtt_port(broker)
        client, _ = await WireClient.connect(port, "opts", clean_start=True, expiry=0)
        await _retain(client, "a/b", b"kept")
        # Retain Handling 2: never.
        await _subscribe(client, Subscription("a/#", 1, retain_handling=2))
        await _nothing_more(client)
        # Retain Handling 1: only for a new subscription (a/# exists: none) ...
        await _subscribe(client, Subscription("a/#", 1, retain_handling=1))
        await _nothing_more(client)
        # ... and for a new one, yes.
        await _subscribe(client, Subscription("a/+", 0, retain_handling=1))
        (first,) = await client.publishes(1)
        assert (first.topic, first.payload, first.qos, first.retain) == ("a/b", b"kept", 0, True)
        # Retain Handling 0: at every SUBSCRIBE, also of an existing one.
        await _subscribe(client, Subscription("a/+", 0, retain_handling=0))
        (again,) = await client.publishes(1)
        assert again.retain and again.payload == b"kept"
        await _nothing_more(client)
        # Retain As Published: a live retained publish keeps its flag on a/+,
        # and not on a/# (which said 0).
        await client.send(
            Subscribe(2, (Subscription("a/+", 0, retain_as_published=True, retain_handling=2),))
        )
        assert isinstance(await client.next_packet(), SubAck)
        await client.send(Publish("a/b", b"new", 1, retain=True, packet_id=9))
        packets = [await client.next_packet() for _ in range(3)]
        acks = [p for p in packets if isinstance(p, PubAck)]
        publishes = sorted((p for p in packets if isinstance(p, Publish)), key=lambda p: p.qos)
        assert acks == [PubAck(9)]
        assert [(p.qos, p.retain) for p in publishes] == [(0, True), (1, False)]
        assert publishes[1].packet_id is not None
        await client.send(PubAck(publishes[1].packet_id))
        await _close(client)


async def test_retained_messages_survive_a_restart_and_native_readers_see_them(
    tmp_path: Path,
) -> None:
    data = str(tmp_path / "data")
    async with (
        mqtt_broker(data) as broker,
        open_client(url(broker), name="native") as native,
        native.subscribe("status.door", start="earliest") as subscription,
    ):
        client, _ = await WireClient.connect(mqtt_port(broker), "dev", clean_start=True)
        await _retain(client, "status/door", b"open")
        await _retain(client, "status/window", b"shut")
        await _retain(client, "status/window", b"")
        await _close(client)
        record = await subscription.receive()
        assert record.payload == b"open"
        assert record.headers == [("mqtt-qos", b"1"), ("mqtt-retain", b"1")]
    async with mqtt_broker(data) as broker:
        client, _ = await WireClient.connect(mqtt_port(broker), "late", clean_start=True)
        await _subscribe(client, Subscription("status/#", 1))
        (got,) = await client.publishes(1)
        assert (got.topic, got.payload, got.retain) == ("status/door", b"open", True)
        assert got.packet_id is not None
        await client.send(PubAck(got.packet_id))
        await _nothing_more(client)
        await _close(client)


async def test_a_will_with_the_retain_flag_is_retained(tmp_path: Path) -> None:
    async with mqtt_broker(str(tmp_path / "data")) as broker:
        port = mqtt_port(broker)
        dying, _ = await WireClient.connect(
            port, "dying", clean_start=True, will=Will("alive/dying", b"no", 1, retain=True)
        )
        await dying.cut()  # (no DISCONNECT: the will goes)
        assert broker.mqtt is not None
        await wait_until(lambda: len(broker.mqtt.retained) == 1, what="will retained")  # type: ignore[union-attr]
        reader, _ = await WireClient.connect(port, "reader", clean_start=True)
        await _subscribe(reader, Subscription("alive/+", 1))
        (got,) = await reader.publishes(1)
        assert (got.topic, got.payload, got.retain) == ("alive/dying", b"no", True)
        await reader.cut()


async def test_paho_in_3_1_1_and_5_gets_retained_messages() -> None:
    async with mqtt_broker() as broker:  # (memory-only: kept in memory)
        port = mqtt_port(broker)
        for version in (V311, V5):
            topic = f"cfg/{version}"
            async with paho_client(port, version=version) as publisher:
                await publisher.publish(topic, b"setting", qos=1, retain=True)
            async with paho_client(port, version=version) as reader:
                await reader.subscribe("cfg/#", qos=1)
                got = await reader.receive(1 if version == V311 else 2)
                assert [(m.topic, m.payload, m.retain) for m in got][-1] == (
                    topic,
                    b"setting",
                    True,
                )


async def test_mosquitto_pub_retains_and_mosquitto_sub_reads_it(tmp_path: Path) -> None:
    pub, sub = require_mosquitto_clients()
    async with mqtt_broker(str(tmp_path / "data")) as broker:
        port = str(mqtt_port(broker))
        with trio.fail_after(HANG_GUARD):
            for version in ("mqttv311", "mqttv5"):
                await trio.run_process(
                    [pub, "-h", "127.0.0.1", "-p", port, "-V", version, "-q", "1", "-r",
                     "-t", f"sign/{version}", "-m", f"hello {version}"],
                    capture_stdout=True, capture_stderr=True,
                )  # fmt: skip
            result = await trio.run_process(
                [sub, "-h", "127.0.0.1", "-p", port, "-V", "mqttv5", "-q", "1", "-t", "sign/#",
                 "-C", "2", "-v", "--retained-only"],
                capture_stdout=True, stderr=subprocess.STDOUT,
            )  # fmt: skip
    assert sorted(result.stdout.decode().splitlines()) == [
        "sign/mqttv311 hello mqttv311",
        "sign/mqttv5 hello mqttv5",
    ]


async def test_past_the_bounds_a_retained_publish_is_refused_and_counted(tmp_path: Path) -> None:
    async with mqtt_broker(str(tmp_path / "data")) as broker:
        assert broker.mqtt is not None
        store = broker.mqtt.retained
        store.max_messages = 2
        client, _ = await WireClient.connect(mqtt_port(broker), "c", clean_start=True)
        await _retain(client, "b/1", b"one")
        await _retain(client, "b/2", b"two")
        await _retain(client, "b/3", b"three")  # (a third topic: refused)
        await _retain(client, "b/2", b"TWO")  # (replacing is allowed)
        assert store.refused == 1 and len(store) == 2
        store.max_bytes = store.bytes  # (no room for more bytes) ...
        await _retain(client, "b/1", b"one, longer")  # ... refused: b/1 is cleared
        assert store.refused == 2 and len(store) == 1
        assert store.get("b/1") is None and store.get("b/2") is not None
        totals = broker.mqtt.totals()
        assert (totals.retained_messages, totals.retained_refused) == (1, 2)
        assert totals.retained_bytes == store.bytes
        await _close(client)


def test_the_store_drops_malformed_journal_values(tmp_path: Path) -> None:
    from broker.log import StateJournal

    with StateJournal(tmp_path / "journal") as journal:
        journal.put(RETAINED, "ok/topic", [1, b"tail"])
        journal.put(RETAINED, "bad/topic", ["what", 3])
        store = RetainedStore(journal)
        assert len(store) == 1 and store.get("ok/topic") == (1, b"tail")
        assert journal.get(RETAINED, "bad/topic") is None


async def test_3_1_1_subscribers_get_retained_messages(tmp_path: Path) -> None:
    async with mqtt_broker(str(tmp_path / "data")) as broker:
        port = mqtt_port(broker)
        client, _ = await WireClient.connect(port, "v3", version=MQTT_3_1_1, clean_start=True)
        await _retain(client, "x/y", b"z")
        await _subscribe(client, Subscription("x/y", 1))
        (got,) = await client.publishes(1)
        assert (got.payload, got.retain, got.qos) == (b"z", True, 1)
        await client.cut()
