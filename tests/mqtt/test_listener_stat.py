"""``/stat.json`` (``broker stat``) shows the MQTT listener: its counts and
its connections, bounded as the native ones are (``metrics_top`` with the
most debt, as many more with the most in flight). Counts only."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from broker.cli._stat_text import render
from broker.metrics import _stat_schema as schema
from broker.metrics import stat_document
from broker.metrics._stat_schema import StatDocument
from broker.server.mqtt import MQTTConnectionStatistics
from tests.server.helpers import wait_subscribed, wait_until
from tests.workers.test_stat_rules import hints, problems

from .listener_helpers import WireClient, mqtt_broker, mqtt_port, paho_client


def test_the_row_has_the_fields_of_the_figures() -> None:
    fields = [f.name for f in dataclasses.fields(MQTTConnectionStatistics)]
    assert list(hints(schema.MQTTConnectionRow)) == [*fields, "account"]


async def test_stat_shows_mqtt_connections_bounded(tmp_path: Path) -> None:
    async with mqtt_broker(str(tmp_path / "data"), metrics_top=1) as broker:
        port = mqtt_port(broker)
        stuck, _ = await WireClient.connect(port, "stuck", clean_start=True)
        await stuck.subscribe("$share/g/t", qos=1)
        await stuck.subscribe("t", qos=1)
        idle, _ = await WireClient.connect(port, "idle", clean_start=True, expiry=None)
        async with paho_client(port, client_id="pub") as pub:
            await wait_subscribed(broker, "t", 2)
            for index in range(3):
                await pub.publish("t", b"%d" % index, qos=1)
            await stuck.publishes(6)  # (acknowledges none: 6 in flight to it)
            assert broker.mqtt is not None
            await wait_until(lambda: len(broker.mqtt.connections) == 3, what="three clients")  # type: ignore[union-attr]
            document = stat_document(broker)
        json.dumps(document, allow_nan=False)
        assert problems(document, StatDocument) == []
        mqtt = document["mqtt"]
        assert mqtt is not None
        assert (mqtt["connections_open"], mqtt["connections_accepted"]) == (3, 3)
        rows = {row["client_id"]: row for row in mqtt["connections"]}
        assert len(rows) <= 2  # (metrics_top 1 by debt, 1 by what is in flight)
        row = rows["stuck"]
        assert (row["subscriptions"], row["shared_subscriptions"], row["in_flight_out"]) == (
            2,
            1,
            6,
        )
        assert (row["version"], row["state"], row["persistent"]) == ("5.0", "connected", True)
        text = render(document)
        assert f"mqtt         {mqtt['address']}" in text
        assert "client_id='stuck'" in text
        await stuck.cut()
        await idle.cut()


async def test_no_mqtt_section_without_a_listener(tmp_path: Path) -> None:
    async with mqtt_broker(str(tmp_path / "data"), mqtt_listen="") as broker:
        document = stat_document(broker)
    assert document["mqtt"] is None
    assert "mqtt " not in render(document)
