"""MQTT 5.0's No Local subscription option and Message Expiry Interval on
the listener, over the topic logs: a No Local subscription never gets its
client's own publishes (other subscriptions of the client do); a message
whose expiry passed before it could be delivered is not delivered (nor
kept as the retained message); one delivered in time carries the interval
left. Wire-level clients (exactly what is sent). The expiry test waits for
the wall clock to pass a one-second expiry: that wait is the condition under
test, not a guess at the machine's speed; other timeouts guard hangs."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio

from broker.client import open_client
from broker.mqtt import (
    MQTT_3_1_1,
    MQTT_5,
    Properties,
    PubAck,
    Publish,
    SubAck,
    Subscribe,
    Subscription,
)
from tests.server.helpers import url, wait_subscribed, wait_until

from .listener_helpers import WireClient, mqtt_broker, mqtt_port


async def _publish(
    client: WireClient,
    topic: str,
    payload: bytes,
    packet_id: int,
    *,
    expiry: int | None = None,
    retain: bool = False,
) -> None:
    """A QoS 1 PUBLISH, and its PUBACK (the client subscribes to nothing
    that delivers meanwhile)."""
    properties = Properties(message_expiry_interval=expiry)
    await client.send(Publish(topic, payload, 1, retain, False, packet_id, properties))
    ack = await client.next_packet()
    assert isinstance(ack, PubAck) and ack.packet_id == packet_id, ack


async def _subscribe(
    client: WireClient, packet_id: int, subscription: Subscription, identifier: int
) -> None:
    properties = Properties(subscription_identifiers=(identifier,))
    await client.send(Subscribe(packet_id, (subscription,), properties))
    suback = await client.next_packet()
    assert isinstance(suback, SubAck) and not suback.reasons[0].is_error, suback


async def test_no_local_skips_only_the_clients_own_publishes(tmp_path: Path) -> None:
    async with mqtt_broker(str(tmp_path / "data")) as broker:
        port = mqtt_port(broker)
        me, _ = await WireClient.connect(port, "me", clean_start=True)
        other, _ = await WireClient.connect(port, "other", clean_start=True, expiry=None)
        await _subscribe(me, 1, Subscription("chat/room", 1, no_local=True), identifier=1)
        await _subscribe(me, 2, Subscription("chat/#", 1), identifier=2)
        await wait_subscribed(broker, "chat.room", 2)
        await me.send(Publish("chat/room", b"mine", 1, packet_id=10))
        await _publish(other, "chat/room", b"theirs", 1)
        await _publish(other, "chat/room", b"end", 2)
        got: list[tuple[bytes, int]] = []
        while len(got) < 5:
            packet = await me.next_packet()
            if isinstance(packet, PubAck):
                continue  # (of "mine")
            assert isinstance(packet, Publish), packet
            assert packet.packet_id is not None
            await me.send(PubAck(packet.packet_id))
            (identifier,) = packet.properties.subscription_identifiers
            got.append((packet.payload, identifier))
        by_subscription = {
            number: [payload for payload, ident in got if ident == number] for number in (1, 2)
        }
        # The log's order is mine, theirs, end: the No Local one skipped "mine".
        assert by_subscription == {1: [b"theirs", b"end"], 2: [b"mine", b"theirs", b"end"]}
        async with (  # what the topic log holds
            open_client(url(broker)) as native,
            native.subscribe("chat.room", start="earliest") as records,
        ):
            mine = await records.receive()
        assert mine.payload == b"mine"
        assert dict(mine.headers or [])["mqtt-origin"] == b"me"
        await me.cut()
        await other.cut()
        # A persistent session keeps the option: back without a SUBSCRIBE.
        me, connack = await WireClient.connect(port, "me")
        assert connack.session_present
        await wait_subscribed(broker, "chat.room", 2)
        assert broker.mqtt is not None
        assert broker.mqtt.clients["me"].deliveries.filters["chat/room"].no_local
        await me.cut()


@pytest.mark.parametrize("version", [MQTT_3_1_1, MQTT_5], ids=["3.1.1", "5.0"])
async def test_an_expired_message_is_not_delivered(version: int, tmp_path: Path) -> None:
    async with mqtt_broker(str(tmp_path / "data")) as broker:
        port = mqtt_port(broker)
        away, _ = await WireClient.connect(port, "away", version=version, clean_start=False)
        await away.subscribe("news", qos=1)
        await wait_subscribed(broker, "news", 1)
        await away.cut()
        publisher, _ = await WireClient.connect(port, "pub", clean_start=True, expiry=None)
        started = time.time()
        await _publish(publisher, "news", b"short", 1, expiry=1)
        acknowledged_ms = time.time_ns() // 1_000_000  # (after the broker received it)
        await _publish(publisher, "news", b"long", 2, expiry=3600)
        await _publish(publisher, "news", b"plain", 3)
        await _publish(publisher, "ret/short", b"r1", 4, expiry=1, retain=True)
        await _publish(publisher, "ret/long", b"r2", 5, expiry=3600, retain=True)
        # Until "short" has certainly expired (by the wall clock, as the broker's).
        await trio.sleep(max(0.0, (acknowledged_ms + 1050) / 1000 - time.time()))
        assert time.time_ns() // 1_000_000 > acknowledged_ms + 1000
        away, connack = await WireClient.connect(port, "away", version=version)
        assert connack.session_present
        long, plain = await away.publishes(2)  # "short" would have come first
        assert (long.payload, plain.payload) == (b"long", b"plain")
        if version == MQTT_5:
            left = long.properties.message_expiry_interval
            assert left is not None and 3600 - (time.time() - started) - 1 <= left <= 3600
        assert plain.properties.message_expiry_interval is None
        assert not long.properties.user_properties  # (the expiry header is ours)
        await away.subscribe("ret/+", qos=1)
        (retained,) = await away.publishes(1)  # the expired one is not retained any more
        assert (retained.topic, retained.payload, retained.retain) == ("ret/long", b"r2", True)
        assert broker.mqtt is not None
        await wait_until(lambda: len(broker.mqtt.retained) == 1, what="the expired one dropped")  # type: ignore[union-attr]
        assert broker.mqtt.totals().dropped_expired == 1
        await away.cut()
        await publisher.cut()
