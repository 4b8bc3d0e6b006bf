"""Shared subscriptions (``$share/GROUP/TOPIC``) on the MQTT listener: the
broker's consumer groups. Members share a topic's messages, each message to
one member; a member that leaves with messages unacknowledged has them
delivered to another; a native ``group=`` member of the same name is in the
same group. Counts and sets only: nothing depends on the machine's speed
(timeouts only guard against hangs)."""

from __future__ import annotations

import queue
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import trio

from broker.client import Message, open_client
from broker.mqtt import Publish, SubAck, Subscribe, Subscription
from broker.server import Broker
from tests.server.helpers import url, wait_subscribed, wait_until

from .listener_helpers import (
    HANG_GUARD,
    V5,
    VERSIONS,
    PahoClient,
    WireClient,
    mqtt_broker,
    mqtt_port,
    paho_client,
)


def _group_of(broker: Broker, topic: str, name: str) -> Any:
    assert broker.groups is not None
    for group in broker.groups.groups.values():
        if group.topic.topic_name == topic and group.name == name:
            return group
    raise AssertionError(f"no group {name!r} of {topic!r}")


def _drain(clients: list[PahoClient], total: int) -> list[list[paho.MQTTMessage]]:
    """Every client's messages until ``total`` came across them (in a thread)."""
    got: list[list[paho.MQTTMessage]] = [[] for _ in clients]
    count = 0
    idle = 0.0
    while count < total:
        progressed = False
        for index, client in enumerate(clients):
            try:
                got[index].append(client.messages.get(timeout=0.01))
            except queue.Empty:
                continue
            count += 1
            progressed = True
        idle = 0.0 if progressed else idle + 0.01 * len(clients)
        if idle > HANG_GUARD:
            raise AssertionError(f"only {count} of {total} messages came")
    return got


async def _publish(broker: Broker, topic: str, numbers: range) -> None:
    async with open_client(url(broker), name="native-pub") as native:
        for number in numbers:
            await native.publish(topic, str(number).encode())
        await native.flush()


@VERSIONS
async def test_members_share_a_topic_each_message_once(version: int, tmp_path: Path) -> None:
    async with mqtt_broker(str(tmp_path / "data")) as broker:
        port = mqtt_port(broker)
        async with (
            paho_client(port, version=version, client_id="m1") as m1,
            paho_client(port, version=version, client_id="m2") as m2,
            paho_client(port, version=version, client_id="m3") as m3,
            paho_client(port, version=version, client_id="plain") as plain,
            paho_client(port, version=version, client_id="pub") as pub,
        ):
            for member in (m1, m2, m3):
                granted = await member.subscribe("$share/workers/jobs/eu", qos=1)
                assert [int(r.value) for r in granted] == [1]
            assert [int(r.value) for r in await plain.subscribe("jobs/eu", qos=1)] == [1]
            await wait_subscribed(broker, "jobs.eu", 4)
            for index in range(300):
                await pub.publish("jobs/eu", f"{index}".encode(), qos=1)
            got = await trio.to_thread.run_sync(_drain, [m1, m2, m3], 300)
            payloads = sorted(int(m.payload) for share in got for m in share)
            assert payloads == list(range(300))  # each exactly once across the members
            assert all(share for share in got)  # each member got a share
            assert {m.qos for share in got for m in share} == {1}
            assert {m.topic for share in got for m in share} == {"jobs/eu"}
            everything = await plain.receive(300)  # a plain subscription gets them all
            assert [int(m.payload) for m in everything] == list(range(300))
            group = _group_of(broker, "jobs.eu", "workers")
            assert len(group.members) == 3
            await wait_until(lambda: group.state.floor == 301, what="every message settled")
            assert group.state.redelivered == 0
        await wait_until(lambda: not broker.mqtt or not broker.mqtt.connections, what="closed")
        assert broker.account.debt == 0


@VERSIONS
async def test_a_member_leaving_has_its_unacknowledged_messages_go_to_another(
    version: int, tmp_path: Path
) -> None:
    async with mqtt_broker(str(tmp_path / "data")) as broker:
        port = mqtt_port(broker)
        # The first member acknowledges nothing (a wire-level client: no PUBACK).
        holder, _ = await WireClient.connect(port, "holder", version=version, clean_start=True)
        await holder.subscribe("$share/g/work", qos=1)
        await wait_subscribed(broker, "work", 1)
        await _publish(broker, "work", range(0, 10))
        held = await holder.publishes(10)  # the only member: it has them all
        assert sorted(int(p.payload) for p in held) == list(range(10))
        async with paho_client(port, version=version, client_id="other") as other:
            assert [int(r.value) for r in await other.subscribe("$share/g/work")] == [1]
            await wait_subscribed(broker, "work", 2)
            await _publish(broker, "work", range(10, 30))
            await holder.cut()  # it leaves mid-stream, holding what it did not acknowledge
            got = await other.receive(30)
            assert sorted(int(m.payload) for m in got) == list(range(30))
            group = _group_of(broker, "work", "g")
            await wait_until(lambda: group.state.floor == 31, what="every message settled")
            assert group.state.redelivered >= 10
            assert other.messages.empty()


async def test_native_and_mqtt_members_are_one_group(tmp_path: Path) -> None:
    async with (
        mqtt_broker(str(tmp_path / "data")) as broker,
        paho_client(mqtt_port(broker), version=V5, client_id="mqtt-member") as mqtt_member,
        open_client(url(broker)) as native,
    ):
        assert [int(r.value) for r in await mqtt_member.subscribe("$share/workers/jobs")] == [1]
        native_got: list[Message] = []
        async with native.subscribe("jobs", group="workers") as member:
            await wait_subscribed(broker, "jobs", 2)
            assert len(broker.groups.groups) == 1  # type: ignore[union-attr]
            await _publish(broker, "jobs", range(200))
            group = _group_of(broker, "jobs", "workers")
            received: list[paho.MQTTMessage] = []

            async def take_native() -> None:
                async for message in member:
                    native_got.append(message)
                    message.ack()

            with trio.fail_after(HANG_GUARD):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(take_native)
                    while len(native_got) + len(received) < 200:
                        try:
                            received.append(mqtt_member.messages.get_nowait())
                        except queue.Empty:
                            await trio.sleep(0.005)
                    await wait_until(lambda: group.state.floor == 201, what="all settled")
                    nursery.cancel_scope.cancel()
        numbers = [int(m.payload) for m in native_got] + [int(m.payload) for m in received]
        assert sorted(numbers) == list(range(200))
        assert native_got and received


async def test_shared_filters_granted_refused_and_without_retained(tmp_path: Path) -> None:
    async with mqtt_broker(str(tmp_path / "data")) as broker:
        port = mqtt_port(broker)
        client, connack = await WireClient.connect(port, "s", clean_start=True, expiry=None)
        assert connack.properties.shared_subscription_available is None  # (available)
        await client.send(Subscribe(1, (Subscription("t/r", 1),)))  # a plain one, beside
        assert isinstance(await client.next_packet(), SubAck)
        async with paho_client(port, version=V5, client_id="pub") as pub:
            await pub.publish("t/r", b"retained", qos=1, retain=True)
            (plain,) = await client.publishes(1)
            assert plain.payload == b"retained"
            subscriptions = (
                Subscription("$share/g/t/r", 2),  # granted 1: a group delivers at least once
                Subscription("$share/g/t/+", 1),  # a wildcard: no group spans a pattern
                Subscription("$share/g/#", 1),
                Subscription("$share/a b/t/r", 1),  # not a broker group name
            )
            await client.send(Subscribe(2, subscriptions))
            suback = await client.next_packet()
            assert isinstance(suback, SubAck)
            assert [int(r) for r in suback.reasons] == [1, 0x9E, 0x9E, 0x8F]
            await wait_subscribed(broker, "t.r", 2)
            await pub.publish("t/r", b"live", qos=1)
            first, second = await client.publishes(2)  # no retained message for the share
        assert isinstance(first, Publish) and isinstance(second, Publish)
        assert [first.payload, second.payload] == [b"live", b"live"]
        assert {first.retain, second.retain} == {False}
        await client.cut()


async def test_a_memory_only_broker_has_no_shared_subscriptions() -> None:
    async with mqtt_broker() as broker:
        client, connack = await WireClient.connect(
            mqtt_port(broker), "m", clean_start=True, expiry=None
        )
        assert connack.properties.shared_subscription_available == 0
        await client.send(Subscribe(1, (Subscription("$share/g/t", 1),)))
        suback = await client.next_packet()
        assert isinstance(suback, SubAck) and [int(r) for r in suback.reasons] == [0x9E]
        await client.cut()


async def test_a_persistent_session_stays_a_member(tmp_path: Path) -> None:
    async with mqtt_broker(str(tmp_path / "data")) as broker:
        port = mqtt_port(broker)
        client, _ = await WireClient.connect(port, "keeper", clean_start=True)
        await client.subscribe("$share/g/jobs", qos=1)
        await wait_subscribed(broker, "jobs", 1)
        await client.cut()
        await wait_until(lambda: not broker.mqtt or not broker.mqtt.connections, what="gone")
        await _publish(broker, "jobs", range(5))  # kept in the group's log meanwhile
        client, connack = await WireClient.connect(port, "keeper")
        assert connack.session_present
        got = await client.publishes(5)  # a member again, without a SUBSCRIBE
        assert sorted(int(p.payload) for p in got) == list(range(5))
        await client.cut()
