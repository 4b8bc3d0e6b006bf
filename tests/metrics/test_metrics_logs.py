"""The topic log series of /metrics and the ``logs`` section of /stat.json,
with a real broker on a data directory (issue 21, items 9 and 10)."""

from __future__ import annotations

import errno
import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
from prometheus_client import generate_latest
from prometheus_client.metrics_core import Metric

from broker.client import open_client
from broker.config import BrokerConfig
from broker.log import LogConfig
from broker.log import _files as log_files
from broker.metrics import METRICS, BrokerCollector, metrics_registry, stat_document
from broker.metrics._log_families import LOG_METRICS
from broker.metrics._log_walk import log_walk
from broker.protocol import BindTopic, Goodbye, Subscribe
from broker.server import Broker
from tests.metrics.test_metrics import Scrape as TextScrape
from tests.server.helpers import TIMEOUT, RawClient, make_config, running_broker, url, wait_until

PER_TOPIC = [spec.name for spec in LOG_METRICS if spec.labels == ("topic",)]


class Scrape(TextScrape):
    """One scrape of a broker's collector, parsed: ``scrape(name, **labels)``."""

    def __init__(self, broker: Broker) -> None:
        super().__init__(generate_latest(metrics_registry(broker, max_age=0)).decode())

    def family(self, name: str) -> Metric:
        """The family ``name`` (without its ``_total``)."""
        (family,) = (f for f in self.families if f.name == name)
        return family

    def topics(self, name: str) -> dict[str, float]:
        """The ``topic`` label values of family ``name``'s series, and their values."""
        return {
            dict(labels)["topic"]: value
            for (sample, labels), value in self.samples.items()
            if sample == name
        }


async def publish(
    broker: Broker, topic: str, payloads: list[bytes], *, one_by_one: bool = False
) -> None:
    """Publish ``payloads`` and wait until every one is confirmed (in the log);
    ``one_by_one``: each confirmed before the next is sent."""
    async with open_client(url(broker), name="pub") as client:
        for payload in payloads:
            await client.publish(topic, payload)
            if one_by_one:
                await client.flush()
        await client.flush()


@asynccontextmanager
async def stuck_subscriber(broker: Broker, topic: str) -> AsyncIterator[RawClient]:
    """A reliable subscriber to ``topic`` (from the log's end) that never reads
    nor acknowledges: its lag grows with every record published."""
    raw = await RawClient.connect(broker)
    try:
        await raw.handshake("stuck")
        await raw.send(BindTopic(topic), Subscribe(0, "reliable", {}))
        await wait_until(
            lambda: bool(broker.topics.get(topic) and broker.topics[topic].subscriptions),
            what=f"subscribed to {topic}",
        )
        yield raw
        await raw.send(Goodbye(0, "done"))  # the session ends: its subscription goes
    finally:
        await raw.aclose()


def open_log(broker: Broker, topic: str) -> Any:
    assert broker.logs is not None
    return broker.logs.store.open_logs()[topic]


# ====================================================================== /metrics


async def test_the_series_follow_what_is_published_and_not_read(tmp_path: Path) -> None:
    async with running_broker(make_config(data_dir=str(tmp_path))) as broker:
        async with stuck_subscriber(broker, "t"):
            await publish(broker, "t", [b"r%d" % i for i in range(25)])
            assert broker.logs is not None
            logs = broker.logs
            await wait_until(lambda: logs.fsyncs >= 1, what="a batch fsync")
            scrape = Scrape(broker)
            topic_log = open_log(broker, "t")
            assert scrape("broker_log_appends_total") == 25
            assert scrape("broker_topic_logs") == 1
            assert scrape("broker_topic_log_first_offset", topic="t") == 1
            assert scrape("broker_topic_log_last_offset", topic="t") == 25
            assert scrape("broker_topic_log_terms", topic="t") == 1
            assert scrape("broker_topic_log_bytes", topic="t") == topic_log.size_bytes > 25 * 2
            assert scrape("broker_log_bytes") == topic_log.size_bytes
            # The stuck subscriber started at offset 1 and processed nothing.
            assert scrape("broker_subscription_lag_records", topic="t") == 25
            assert scrape("broker_subscription_max_lag_records") == 25
            assert scrape("broker_topic_blocked", topic="t") == 0
            assert scrape("broker_topics_blocked") == 0
            assert scrape("broker_log_append_errors_total") == 0
            assert scrape("broker_log_truncated_records_total") == 0
            assert scrape("broker_log_truncated_bytes_total") == 0
            assert scrape("broker_topic_logs_detailed") == 1
            free, size = scrape("broker_data_dir_free_bytes"), scrape("broker_data_dir_size_bytes")
            assert 0 < free <= size
            stat = os.statvfs(tmp_path)
            assert size == stat.f_blocks * stat.f_frsize
            # Every timed fsync is in the histogram, and in its +Inf bucket.
            fsyncs = scrape("broker_log_fsync_seconds_count")
            assert fsyncs >= 1
            assert scrape("broker_log_fsync_seconds_bucket", le="+Inf") == fsyncs
            assert scrape("broker_log_fsync_seconds_sum") >= 0
        # The subscriber went: nobody lags; the log stays.
        await wait_until(lambda: not broker.topics.get("t"), what="topic released")
        after = Scrape(broker)
        assert after("broker_subscription_max_lag_records") == 0
        assert after("broker_topic_log_last_offset", topic="t") == 25


async def test_a_memory_only_broker_exports_the_log_families_without_series() -> None:
    async with running_broker(make_config()) as broker:
        await publish(broker, "t", [b"x"])
        scrape = Scrape(broker)
        for spec in LOG_METRICS:
            family = scrape.family(spec.name.removesuffix("_total"))
            assert family.samples == [], spec.name
        assert stat_document(broker)["logs"] is None


async def test_the_series_count_does_not_grow_with_the_topics(tmp_path: Path) -> None:
    """40 topics, metrics_top=2: per-topic series for the 2 with the most bytes
    and the 2 with the most lag; broker-wide figures cover all 40."""
    config = make_config(data_dir=str(tmp_path), metrics_top=2)
    async with running_broker(config) as broker:
        async with open_client(url(broker), name="pub") as client:
            for index in range(40):
                await client.publish(f"t{index:02}", b"x" * 10)
            await client.publish("t07", b"y" * 5000)  # the largest
            await client.publish("t08", b"y" * 3000)  # the second largest
            await client.flush()
        async with stuck_subscriber(broker, "t20"), stuck_subscriber(broker, "t30"):
            await publish(broker, "t20", [b"z"] * 3)
            await publish(broker, "t30", [b"z"] * 5)
            scrape = Scrape(broker)
        assert scrape("broker_topic_logs") == 40
        assert scrape("broker_log_appends_total") == 40 + 2 + 3 + 5
        assert broker.logs is not None
        total = sum(log.size_bytes for log in broker.logs.store.open_logs().values())
        assert scrape("broker_log_bytes") == total
        assert scrape("broker_subscription_max_lag_records") == 5
        detailed = scrape.topics("broker_topic_log_bytes")
        assert list(detailed) == ["t07", "t08", "t30", "t20"]
        assert scrape("broker_topic_logs_detailed") == 4
        for name in PER_TOPIC:
            assert set(scrape.topics(name)) == set(detailed), name
        assert scrape.topics("broker_subscription_lag_records") == {
            "t07": 0,
            "t08": 0,
            "t30": 5,
            "t20": 3,
        }
        log_series = [key for key in scrape.samples if ("topic", "t00") in key[1]]
        assert log_series == []


async def test_the_log_walk_gives_the_loop_a_turn_between_chunks(tmp_path: Path) -> None:
    async with running_broker(make_config(data_dir=str(tmp_path))) as broker:
        async with open_client(url(broker), name="pub") as client:
            for index in range(20):
                await client.publish(f"t{index}", b"x")
            await client.flush()
        walk = log_walk(broker, 3, 4)
        turns = 0
        try:
            while True:
                next(walk)
                turns += 1
        except StopIteration as stop:
            figures = stop.value
        assert turns == 4  # after logs 4, 8, 12 and 16
        assert figures.logs == 20 and len(figures.top) == 3


async def test_a_blocked_topic_is_counted_until_its_reader_lets_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """when_full="block" with a reader holding the oldest term: the publisher
    waits, the topic is blocked, its append errors counted; the reader
    leaving unblocks it."""
    small = LogConfig(term_bytes=4096, retain_bytes=3 * 4096, when_full="block")
    monkeypatch.setattr(BrokerConfig, "log_config", lambda self, topic: small)
    async with running_broker(make_config(data_dir=str(tmp_path))) as broker:
        # The nursery ends once the publisher has every record confirmed:
        # after the stuck reader left and the waiting batches got in.
        with trio.fail_after(TIMEOUT):
            async with trio.open_nursery() as nursery, stuck_subscriber(broker, "t"):
                # One record a batch: a batch is appended whole or not at all.
                nursery.start_soon(
                    partial(publish, one_by_one=True), broker, "t", [b"p" * 500] * 100
                )
                logs = broker.logs
                assert logs is not None
                # The batch that does not fit waits, its LogFull counted.
                await wait_until(
                    lambda: bool(broker.topics["t"].held) and logs.append_errors >= 1,
                    what="blocked",
                )
                scrape = Scrape(broker)
                assert scrape("broker_topics_blocked") == 1
                assert scrape("broker_topic_blocked", topic="t") == 1
                assert scrape("broker_log_append_errors_total") >= 1
                assert scrape("broker_topic_log_first_offset", topic="t") == 1
                assert scrape("broker_subscription_lag_records", topic="t") > 0
                (entry,) = stat_document(broker)["logs"]["topics"]
                assert entry["name"] == "t" and entry["blocked"] is True
                assert entry["held"] >= 1 and entry["error"]
                assert stat_document(broker)["logs"]["blocked_topics"] == 1
        after = Scrape(broker)
        assert after("broker_topics_blocked") == 0
        assert after("broker_log_appends_total") == 100
        assert after("broker_topic_log_last_offset", topic="t") == 100


class FullDisk:
    """While :attr:`full`, every write to a topic log fails with ENOSPC."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.full = False
        self._real = log_files.pwrite
        monkeypatch.setattr(log_files, "pwrite", self._pwrite)

    def _pwrite(self, fd: int, data: memoryview, offset: int) -> int:
        if self.full:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return self._real(fd, data, offset)


async def publish_through_a_full_disk(broker: Broker, disk: FullDisk) -> Scrape:
    """One record published, then three while the disk is full, then space
    returns; the scrape taken while the publisher waited."""
    await publish(broker, "t", [b"before"])
    logs = broker.logs
    assert logs is not None
    disk.full = True
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(publish, broker, "t", [b"during"] * 3)
            await wait_until(
                lambda: (
                    "t" in broker.topics
                    and bool(broker.topics["t"].held)
                    and logs.append_errors >= 1
                ),
                what="blocked by the disk",
            )
            scrape = Scrape(broker)
            (entry,) = stat_document(broker)["logs"]["topics"]
            assert entry["blocked"] and "No space left" in entry["error"]
            disk.full = False  # space returns: the broker retries by itself
    return scrape


async def test_a_full_disk_blocks_the_topic_until_space_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSPC on every write: the topic's publishes wait, what the alerts use
    says so (blocked, append errors), and it clears by itself once writes
    succeed again."""
    disk = FullDisk(monkeypatch)
    async with running_broker(make_config(data_dir=str(tmp_path))) as broker:
        during = await publish_through_a_full_disk(broker, disk)
        assert during("broker_topics_blocked") == 1
        assert during("broker_topic_blocked", topic="t") == 1
        assert during("broker_log_append_errors_total") == 1  # one episode
        # A batch's publish marks are written to the state journal before it
        # is appended (issue 46): on the full disk nothing more is appended.
        assert during("broker_log_appends_total") == 1
        after = Scrape(broker)
        assert after("broker_topics_blocked") == 0
        assert after("broker_topic_blocked", topic="t") == 0
        assert after("broker_topic_log_last_offset", topic="t") == 4


def tear_the_last_record(data_dir: Path) -> None:
    (term,) = sorted(data_dir.rglob("*.term"))
    os.truncate(term, term.stat().st_size - 5)


async def test_records_cut_at_start_up_are_counted(tmp_path: Path) -> None:
    async with running_broker(make_config(data_dir=str(tmp_path))) as broker:
        await publish(broker, "t", [b"r%03d" % i for i in range(30)])
    tear_the_last_record(tmp_path)
    async with running_broker(make_config(data_dir=str(tmp_path))) as broker:
        await publish(broker, "t", [b"next"])
        recovery = open_log(broker, "t").recovery
        assert not recovery.clean
        scrape = Scrape(broker)
        assert scrape("broker_log_truncated_bytes_total") == recovery.cut_bytes > 0
        # The torn record is one record lost (it used to be counted 0).
        assert scrape("broker_log_truncated_records_total") == recovery.cut_records == 1
        # 29 kept, 30 lost (not used again), and "next" at 31.
        assert scrape("broker_topic_log_last_offset", topic="t") == 31
        assert stat_document(broker)["logs"]["truncated_bytes"] == recovery.cut_bytes
        assert stat_document(broker)["logs"]["truncated_records"] == 1


def test_every_log_family_is_exported() -> None:
    names = {spec.name for spec in METRICS}
    assert {spec.name for spec in LOG_METRICS} <= names
    assert {
        "broker_topic_log_bytes",
        "broker_topic_log_first_offset",
        "broker_topic_log_last_offset",
        "broker_topic_log_terms",
        "broker_subscription_lag_records",
        "broker_log_appends_total",
        "broker_log_fsync_seconds",
        "broker_log_truncated_records_total",
        "broker_log_append_errors_total",
        "broker_topics_blocked",
        "broker_data_dir_free_bytes",
        "broker_data_dir_size_bytes",
    } <= names
    for spec in LOG_METRICS:
        assert spec.labels in ((), ("topic",)), spec.name


# ====================================================================== /stat.json


async def test_stat_json_shows_offsets_positions_lags_and_cursors(tmp_path: Path) -> None:
    async with running_broker(make_config(data_dir=str(tmp_path))) as broker:
        await publish(broker, "t", [b"a%d" % i for i in range(1, 11)])
        async with (
            open_client(url(broker), name="reader") as client,
            client.subscribe("t", options={"from": "earliest", "cursor": "c1"}) as sub,
            stuck_subscriber(broker, "t"),
        ):
            with trio.fail_after(TIMEOUT):
                for _ in range(10):
                    await sub.receive()
            cursors = broker.cursors
            assert cursors is not None
            await wait_until(lambda: cursors.position("\x00t\x00c1") == 11, what="acked")
            await publish(broker, "t", [b"b1", b"b2"])
            collector = BrokerCollector(broker, max_age=0)
            try:
                document = stat_document(broker, collector)
            finally:
                collector.close()
            json.dumps(document, allow_nan=False)
        assert document["version"] == 2
        logs = document["logs"]
        assert logs["data_dir"] == str(tmp_path)
        assert 0 < logs["free_bytes"] <= logs["size_bytes"]
        assert logs["topics_total"] == 1 and logs["appends"] == 12
        assert logs["subscriptions"] == 2 and logs["max_lag"] == 2
        (topic,) = logs["topics"]
        assert {k: topic[k] for k in ("name", "first_offset", "last_offset", "terms")} == {
            "name": "t",
            "first_offset": 1,
            "last_offset": 12,
            "terms": 1,
        }
        assert topic["bytes"] == logs["bytes"] > 0
        assert (topic["held"], topic["blocked"], topic["error"]) == (0, False, None)
        assert topic["lag"] == 2 and topic["subscriptions_total"] == 2
        by_cursor = {s["cursor"]: s for s in topic["subscriptions"]}
        reader, stuck = by_cursor["c1"], by_cursor[None]
        # The reader processed 1..10 and was sent (or is being sent) 11 and 12.
        assert reader["acked"] == 10 and reader["lag"] == 2 and reader["position"] >= 11
        # The stuck one subscribed at the end (offset 11): sent nothing yet.
        assert (stuck["position"], stuck["acked"], stuck["lag"]) == (11, 10, 2)
        assert logs["cursors_listed"] == "stored" and logs["cursors_total"] == 1
        assert logs["cursors"] == [
            {
                "principal": None,
                "topic": "t",
                "cursor": "c1",
                "position": 11,
                "lag": 2,
                "subscribed": True,
            }
        ]
        # A detailed connection's log subscription shows acked, lag and its cursor.
        subscriptions = [s for c in document["connections"] for s in c["subscriptions"]]
        mine = next(s for s in subscriptions if s.get("cursor") == "c1")
        assert (mine["acked"], mine["lag"], mine["next_seq"]) == (10, 2, reader["position"])
