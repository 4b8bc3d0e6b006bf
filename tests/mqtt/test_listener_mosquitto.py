"""The MQTT listener with Mosquitto's command-line clients (Debian's
``mosquitto-clients``; skipped without them): ``mosquitto_pub`` into the
broker's topics, read by the native client, and ``mosquitto_sub`` reading
what the native client and ``mosquitto_pub`` publish, at QoS 0 and 1, in
3.1.1 and 5.0. Timeouts only guard against hangs."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import trio

from broker.client import open_client
from tests.server.helpers import url, wait_subscribed, wait_until

from .listener_helpers import HANG_GUARD, mqtt_broker, mqtt_port, require_mosquitto_clients

VERSIONS = pytest.mark.parametrize("version", ["mqttv311", "mqttv5"])


@VERSIONS
@pytest.mark.parametrize("qos", [0, 1])
async def test_mosquitto_pub_to_native(version: str, qos: int, tmp_path: Path) -> None:
    pub, _ = require_mosquitto_clients()
    async with (
        mqtt_broker(str(tmp_path / "data")) as broker,
        open_client(url(broker), name="native") as native,
        native.subscribe("plant.line1") as subscription,
    ):
        await wait_subscribed(broker, "plant.line1")
        with trio.fail_after(HANG_GUARD):
            for index in range(3):
                await trio.run_process(
                    [pub, "-h", "127.0.0.1", "-p", str(mqtt_port(broker)), "-V", version,
                     "-q", str(qos), "-t", "plant/line1", "-m", f"reading {index}"],
                    capture_stdout=True, capture_stderr=True,
                )  # fmt: skip
            payloads = [(await subscription.receive()).payload for _ in range(3)]
    assert payloads == [b"reading 0", b"reading 1", b"reading 2"]


@VERSIONS
@pytest.mark.parametrize("qos", [0, 1])
async def test_mosquitto_sub_reads_native_and_mqtt_publishes(
    version: str, qos: int, tmp_path: Path
) -> None:
    pub, sub = require_mosquitto_clients()
    async with mqtt_broker(str(tmp_path / "data")) as broker, trio.open_nursery() as nursery:
        port = str(mqtt_port(broker))
        assert broker.mqtt is not None
        done = trio.Event()
        output: list[bytes] = []

        async def subscriber() -> None:
            result = await trio.run_process(
                [sub, "-h", "127.0.0.1", "-p", port, "-V", version, "-q", str(qos),
                 "-t", "plant/+", "-C", "4", "-v", "-i", "sub"],
                capture_stdout=True, capture_stderr=True,
            )  # fmt: skip
            output.append(result.stdout)
            done.set()

        nursery.start_soon(subscriber)
        await wait_until(
            lambda: any(c.deliveries.filters for c in broker.mqtt.connections.values()),  # type: ignore[union-attr]
            what="mosquitto_sub subscribed",
        )
        with trio.fail_after(HANG_GUARD):
            async with open_client(url(broker), name="native") as native:
                for index in range(3):
                    await native.publish("plant.line2", f"native {index}".encode())
            await trio.run_process(
                [pub, "-h", "127.0.0.1", "-p", port, "-V", version, "-q", str(qos),
                 "-t", "plant/line3", "-m", "from mosquitto_pub"],
                capture_stdout=True, capture_stderr=True,
            )  # fmt: skip
            await done.wait()
    lines = output[0].decode().splitlines()
    assert lines == [
        "plant/line2 native 0",
        "plant/line2 native 1",
        "plant/line2 native 2",
        "plant/line3 from mosquitto_pub",
    ]


def test_mosquitto_clients_are_runnable() -> None:
    """(Says which mosquitto clients the other tests ran with.)"""
    pub, _ = require_mosquitto_clients()
    result = subprocess.run([pub, "--help"], capture_output=True, timeout=HANG_GUARD)
    assert b"mosquitto_pub" in result.stdout + result.stderr
