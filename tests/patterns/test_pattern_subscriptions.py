"""Pattern subscriptions end to end, on real TCP: every record of every
matched topic, existing and made later, in order per topic, none of
another topic; in every mode; per-topic starts and durable cursors."""

from __future__ import annotations

import datetime
from collections import defaultdict
from pathlib import Path

import pytest
import trio

from broker.client import Message, open_client
from tests.server.helpers import running_broker, url

from .helpers import take


async def _publish(broker_url: str, plan: list[tuple[str, int]]) -> None:
    async with open_client(broker_url) as client:
        for topic, count in plan:
            for index in range(count):
                await client.publish(topic, b"%s/%d" % (topic.encode(), index))
        await client.flush()


def _by_topic(messages: list[Message]) -> dict[str, list[bytes]]:
    out: dict[str, list[bytes]] = defaultdict(list)
    for message in messages:
        out[message.topic].append(message.payload)
    return dict(out)


@pytest.mark.parametrize("logs", [True, False], ids=["log", "memory"])
async def test_existing_and_later_topics_in_order_and_nothing_else(
    tmp_path: Path, logs: bool
) -> None:
    settings = {"data_dir": str(tmp_path)} if logs else {}
    async with running_broker(**settings) as broker, open_client(url(broker)) as client:
        await _publish(url(broker), [("orders.eu", 1), ("orders.us", 1)])  # exist before
        async with client.subscribe("orders.*") as sub:
            plan = [("orders.eu", 30), ("orders.us", 20), ("orders.eu.x", 5), ("other", 5)]
            plan += [("orders.asia", 25)]  # made after the subscription
            await _publish(url(broker), plan)
            got = await take(sub, 75)
            topics = _by_topic(got)
            assert sorted(topics) == ["orders.asia", "orders.eu", "orders.us"]
            for topic, count in (("orders.eu", 30), ("orders.us", 20), ("orders.asia", 25)):
                assert topics[topic] == [b"%s/%d" % (topic.encode(), i) for i in range(count)]
            assert [m.seq for m in got] == list(range(1, 76))
            if logs:  # offsets per topic
                eu = [m.offset for m in got if m.topic == "orders.eu"]
                assert eu == list(range(2, 32))
            with trio.move_on_after(0.2):
                extra = await sub.receive()
                pytest.fail(f"unexpected {extra}")


async def test_from_earliest_reads_each_topic_on_disk(tmp_path: Path) -> None:
    async with running_broker(data_dir=str(tmp_path)) as broker:
        await _publish(url(broker), [("a.1", 10), ("a.2", 10), ("b.1", 3)])
    async with (
        running_broker(data_dir=str(tmp_path)) as broker,
        open_client(url(broker)) as client,
        client.subscribe("a.>", start="earliest") as sub,
        client.subscribe("*.1", start=-2) as last,
    ):
        got = await take(sub, 20)
        topics = _by_topic(got)
        assert {t: len(v) for t, v in topics.items()} == {"a.1": 10, "a.2": 10}
        got = await take(last, 4)
        expected = [("a.1", 9), ("a.1", 10), ("b.1", 2), ("b.1", 3)]
        assert sorted((m.topic, m.offset) for m in got) == expected


@pytest.mark.parametrize("mode", ["lossy", "latest"])
async def test_dropping_modes(tmp_path: Path, mode: str) -> None:
    async with (
        running_broker(data_dir=str(tmp_path)) as broker,
        open_client(url(broker)) as client,
        client.subscribe("m.*", mode=mode) as sub,
    ):
        await _publish(url(broker), [("m.a", 3), ("m.b", 3)])
        got = await take(sub, 6 if mode == "lossy" else 2)
        assert {m.topic for m in got} == {"m.a", "m.b"}


async def test_from_time_applies_to_each_topic(tmp_path: Path) -> None:
    async with running_broker(data_dir=str(tmp_path)) as broker:
        await _publish(url(broker), [("t.a", 3), ("t.b", 3)])
        await trio.sleep(0.05)  # (record times are in ms: the next ones are later)
        since = datetime.datetime.now(datetime.UTC)
        await trio.sleep(0.05)
        await _publish(url(broker), [("t.a", 2), ("t.b", 1), ("t.c", 1)])
        async with open_client(url(broker)) as client, client.subscribe("t.*", start=since) as sub:
            got = await take(sub, 4)
            assert sorted((m.topic, m.offset) for m in got) == [
                ("t.a", 4),
                ("t.a", 5),
                ("t.b", 4),
                ("t.c", 1),
            ]
