"""Will messages on the MQTT listener: published when a connection ends
without a normal DISCONNECT (a cut, a protocol error), with its user
properties as headers; not after a normal DISCONNECT; with a 5.0 Will
Delay Interval, not if the client comes back in time, else once it is
over. Each check reads the topic with a native subscriber up to a marker
published after, so nothing depends on timing (timeouts are hang guards)."""

from __future__ import annotations

from pathlib import Path

import trio

from broker.client import open_client
from broker.mqtt import (
    MQTT_3_1_1,
    MQTT_5,
    ConnAck,
    Connect,
    Disconnect,
    Properties,
    Will,
    encode_packet,
)
from tests.server.helpers import url, wait_subscribed, wait_until

from .listener_helpers import WireClient, mqtt_broker, mqtt_port


def _will(payload: bytes, **properties: object) -> Will:
    return Will("status/dev", payload, properties=Properties(**properties))  # type: ignore[arg-type]


async def test_a_cut_connection_publishes_its_will_and_a_normal_one_does_not(
    tmp_path: Path,
) -> None:
    async with (
        mqtt_broker(str(tmp_path / "data")) as broker,
        open_client(url(broker), name="watcher") as watcher,
        watcher.subscribe("status.dev") as status,
    ):
        await wait_subscribed(broker, "status.dev")
        port = mqtt_port(broker)
        for version, client_id in ((MQTT_5, "dev5"), (MQTT_3_1_1, "dev3")):
            # Ends with DISCONNECT: no will.
            quiet = Connect(client_id, version, will=_will(b"never"))
            client = await _raw(port, quiet)
            await client.send(Disconnect())
            await client.stream.aclose()
            # Cut: its will.
            props = {"user_properties": (("state", "gone"),)} if version == MQTT_5 else {}
            lost = Connect(client_id, version, will=_will(f"{client_id} lost".encode(), **props))
            client = await _raw(port, lost)
            await client.stream.aclose()
            message = await status.receive()
            assert message.payload == f"{client_id} lost".encode()
            if version == MQTT_5:
                assert list(message.headers or []) == [("state", b"gone"), ("mqtt-qos", b"0")]
        assert broker.mqtt is not None
        await wait_until(lambda: not broker.mqtt.connections, what="closed")  # type: ignore[union-attr]
        async with open_client(url(broker), name="marker") as marker:
            await marker.publish("status.dev", b"marker")
        assert (await status.receive()).payload == b"marker"  # (and no "never" before it)


async def _raw(port: int, connect: Connect) -> WireClient:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    client = WireClient(stream, connect.protocol_version)
    await stream.send_all(encode_packet(connect, connect.protocol_version))
    connack = await client.next_packet()
    assert isinstance(connack, ConnAck) and not connack.reason.is_error, connack
    return client


async def test_a_delayed_will_waits_for_the_client_to_come_back(tmp_path: Path) -> None:
    async with (
        mqtt_broker(str(tmp_path / "data")) as broker,
        open_client(url(broker), name="watcher") as watcher,
        watcher.subscribe("status.dev") as status,
    ):
        await wait_subscribed(broker, "status.dev")
        assert broker.mqtt is not None
        port = mqtt_port(broker)
        session = Properties(session_expiry_interval=600)
        # Back within the delay: no will.
        first = Connect("late", MQTT_5, clean_start=True, properties=session,
                        will=_will(b"not sent", will_delay_interval=600))  # fmt: skip
        client = await _raw(port, first)
        await client.stream.aclose()
        await wait_until(lambda: broker.mqtt.wills.waiting == 1, what="the will waiting")  # type: ignore[union-attr]
        again = Connect("late", MQTT_5, clean_start=False, properties=session)
        client = await _raw(port, again)
        assert broker.mqtt.wills.waiting == 0
        await client.send(Disconnect())
        await client.stream.aclose()
        # Not back: sent once the delay is over (1 s).
        short = Connect("gone", MQTT_5, properties=session,
                        will=_will(b"delayed", will_delay_interval=1))  # fmt: skip
        client = await _raw(port, short)
        await client.stream.aclose()
        assert (await status.receive()).payload == b"delayed"
        assert broker.mqtt.wills.published == 1
