"""Cluster mode's series of /metrics, its section of /stat.json and of
``broker stat``, and /readyz while the NATS connection is down (issue 44,
item 7), with a broker over streams in memory (``tests/server/run_streams``);
the readiness over a real nats-server killed and restarted:
``tests/nats/test_cluster_readiness.py``."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import SimpleNamespace

import trio
from prometheus_client import generate_latest

from broker.cli._stat_text import render
from broker.client import open_client
from broker.log import LogConfig, LogStore, encode_run
from broker.metrics import metrics_registry, serve_metrics, stat_document
from broker.metrics._cluster_families import CLUSTER_METRICS, FAILURE_REASONS
from broker.metrics._cluster_figures import add_cluster_families, cluster_figures
from broker.server import Broker
from broker.server.storage._topic_logs import Replication
from tests.metrics.test_metrics import Scrape, get
from tests.server.helpers import running_broker, url, wait_until
from tests.server.run_streams import MemoryStreams

OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
#: Hang guard (seconds).
DEADLINE = 60

Address = tuple[str, int]


def scrape(broker: Broker) -> Scrape:
    return Scrape(generate_latest(metrics_registry(broker, max_age=0)).decode())


async def publish(broker: Broker, topic: str, payloads: list[bytes]) -> None:
    """Publish ``payloads``; returns once every one is confirmed (stored in the stream)."""
    async with open_client(url(broker), name="pub") as client:
        for payload in payloads:
            await client.publish(topic, payload)
        await client.flush()


@asynccontextmanager
async def metrics_of(broker: Broker) -> AsyncIterator[Address]:
    """``broker``'s metrics endpoint on a free port, for the block."""
    async with trio.open_nursery() as nursery:
        address: Address = await nursery.start(serve_metrics, broker, "127.0.0.1", 0)
        yield address
        nursery.cancel_scope.cancel()


class Link:
    """A stand-in for the NATS client's connection (``connected``)."""

    def __init__(self) -> None:
        self.connected = True


def test_every_cluster_family_is_named_and_typed_like_the_others() -> None:
    names = [spec.name for spec in CLUSTER_METRICS]
    assert all(name.startswith("broker_cluster_") for name in names)
    # (Bounded: broker-wide; the one label has a fixed set of values.)
    labelled = {spec.name: spec.labels for spec in CLUSTER_METRICS if spec.labels}
    assert labelled == {"broker_cluster_store_failures_total": ("reason",)}
    for spec in CLUSTER_METRICS:
        assert spec.name.endswith("_total") == (spec.type == "counter"), spec.name
    assert {
        "broker_cluster_store_seconds",
        "broker_cluster_read_seconds",
        "broker_cluster_runs_in_flight",
        "broker_cluster_store_duplicates_total",
    } <= set(names)


async def test_a_broker_not_in_cluster_mode_exports_the_families_without_series(
    tmp_path: Path,
) -> None:
    async with running_broker(data_dir=str(tmp_path)) as broker:
        result = scrape(broker)
        document = stat_document(broker)
    for spec in CLUSTER_METRICS:
        (family,) = (f for f in result.families if f.name == spec.name.removesuffix("_total"))
        assert (family.type, family.samples) == (spec.type, []), spec.name
    assert document["cluster"] is None
    assert "\ncluster " not in render(document)  # (no section)


async def test_runs_sent_resent_and_stored_are_counted(tmp_path: Path) -> None:
    streams = MemoryStreams()
    with trio.fail_after(DEADLINE):
        async with running_broker(data_dir=str(tmp_path), streams=streams) as broker:
            await publish(broker, "t", [b"first"])
            stream = streams.streams["t"]
            before = scrape(broker)
            # The next run fails twice before being stored, once after: sent
            # once, sent again three times, stored once.
            stream.failures = ["before", "before", "after"]
            await publish(broker, "t", [b"second"])
            await wait_until(
                lambda: (
                    broker.logs is not None
                    and broker.logs.replication is not None
                    and not broker.logs.replication.replicator.busy
                ),
                what="nothing left to send",
            )
            after = scrape(broker)
            document = stat_document(broker)
    assert before("broker_cluster_connected") == 1
    assert before("broker_cluster_runs_resent_total") == 0
    assert before("broker_cluster_records_stored_total") == 1
    assert after("broker_cluster_connected") == 1
    assert after("broker_cluster_topics") == 1
    assert after("broker_cluster_topics_sending") == 0
    assert after("broker_cluster_topics_set_aside") == 0
    assert after("broker_cluster_runs_sent_total") == 2
    assert after("broker_cluster_runs_resent_total") == 3
    assert after("broker_cluster_records_stored_total") == 2
    assert after("broker_cluster_writes_fenced_total") == 0
    assert after("broker_cluster_runs_in_flight") == 0
    # Twice nothing was stored (no responders), once it was and the answer
    # was lost (a timeout): the last send is answered as a duplicate.
    failures = {r: after("broker_cluster_store_failures_total", reason=r) for r in FAILURE_REASONS}
    assert failures == {
        "timeout": 1,
        "no_responders": 2,
        "unavailable": 0,
        "connection": 0,
        "refused": 0,
    }
    assert before("broker_cluster_store_duplicates_total") == 0
    assert after("broker_cluster_store_duplicates_total") == 1
    # Two publishes were answered (the first run's, the second's last try);
    # the three unanswered ones are resends, not store times.
    assert after("broker_cluster_store_seconds_count") == 2
    assert after("broker_cluster_store_seconds_bucket", le="+Inf") == 2
    assert after("broker_cluster_store_seconds_bucket", le="10.0") == 2
    assert after("broker_cluster_store_seconds_sum") >= 0
    cluster = document["cluster"]
    assert cluster is not None
    assert cluster["connected"] is True
    assert (cluster["runs_sent"], cluster["runs_resent"], cluster["records_stored"]) == (2, 3, 2)
    assert cluster["stores"] == 2
    assert (cluster["store_duplicates"], cluster["runs_in_flight"]) == (1, 0)
    assert cluster["store_failures"] == failures
    assert (cluster["set_aside_total"], cluster["set_aside"]) == (0, {})
    text = render(document)
    assert "cluster      connected to its NATS servers" in text
    assert "runs_resent=3" in text
    assert "store_duplicates=1" in text
    assert "store failures: timeout=1 no_responders=2 unavailable=0" in text
    assert "set aside" not in text


async def test_runs_wait_in_flight_while_the_stream_does_not_answer(tmp_path: Path) -> None:
    """A stream with no responders: the run stays in flight (the gauge the
    lost-quorum alert watches), its failures counted, nothing stored; once
    the stream answers, it is stored and nothing is in flight."""
    streams = MemoryStreams()
    with trio.fail_after(DEADLINE):
        async with running_broker(data_dir=str(tmp_path), streams=streams) as broker:
            await publish(broker, "t", [b"first"])
            stream = streams.streams["t"]
            stream.failures = ["before"] * 1000
            assert broker.logs is not None and broker.logs.replication is not None
            failures = broker.logs.replication.replicator.store_failures
            async with trio.open_nursery() as nursery:
                nursery.start_soon(publish, broker, "t", [b"second"])
                await wait_until(lambda: failures["no_responders"] >= 3, what="sends refused")
                during = scrape(broker)
                stream.failures.clear()
            after = scrape(broker)
    assert during("broker_cluster_runs_in_flight") == 1
    assert during("broker_cluster_records_stored_total") == 1
    no_responders = during("broker_cluster_store_failures_total", reason="no_responders")
    assert no_responders >= 3
    assert after("broker_cluster_runs_in_flight") == 0
    assert after("broker_cluster_records_stored_total") == 2
    assert after("broker_cluster_store_failures_total", reason="no_responders") == no_responders
    assert after("broker_cluster_store_failures_total", reason="timeout") == 0
    assert after("broker_cluster_store_duplicates_total") == 0


async def test_the_reads_of_a_restore_are_timed(tmp_path: Path) -> None:
    """Restoring a topic of one run reads its stream twice (the run, then
    the end): two observations of the read histogram, in /stat.json too."""
    streams = MemoryStreams()
    with trio.fail_after(DEADLINE):
        async with running_broker(data_dir=str(tmp_path / "a"), streams=streams) as broker:
            await publish(broker, "t", [b"x"])
            first = scrape(broker)
        async with running_broker(data_dir=str(tmp_path / "b"), streams=streams) as broker:
            again = scrape(broker)
            document = stat_document(broker)
    assert first("broker_cluster_read_seconds_count") == 0  # (nothing to restore)
    assert again("broker_cluster_read_seconds_count") == 2
    assert again("broker_cluster_read_seconds_bucket", le="+Inf") == 2
    assert again("broker_cluster_read_seconds_sum") >= 0
    cluster = document["cluster"]
    assert cluster is not None and cluster["reads"] == 2


async def test_a_topic_set_aside_is_counted_and_named(tmp_path: Path) -> None:
    streams = MemoryStreams()
    bad = await streams.open_stream("bad")
    damaged = bytearray(encode_run(1, [b"x"], [1000]))
    damaged[-1] ^= 1
    bad.append_foreign(1, 1, bytes(damaged))
    with trio.fail_after(DEADLINE):
        async with running_broker(data_dir=str(tmp_path), streams=streams) as broker:
            result = scrape(broker)
            document = stat_document(broker)
            async with open_client(url(broker), name="admin") as client:
                await client.admin("delete-topic", topic="bad")
            assert scrape(broker)("broker_cluster_topics_set_aside") == 0
    assert result("broker_cluster_topics_set_aside") == 1
    cluster = document["cluster"]
    assert cluster is not None and cluster["set_aside_total"] == 1
    assert list(cluster["set_aside"]) == ["bad"]
    text = render(document)
    assert "topics set aside, not served (1;" in text
    assert "'bad'" in text


async def test_a_fenced_write_is_counted(tmp_path: Path) -> None:
    """A stream another writer appended to refuses this broker's run: the
    log is fenced, and counted (the replicator alone: what a fenced topic's
    publishers see is the engine's business)."""
    streams = MemoryStreams()
    replication = Replication(streams, "w1")
    host = SimpleNamespace(
        logs=SimpleNamespace(replication=replication),
        front_ends=1,
        sessions_claimed=0,
        sessions_taken=0,
        staging_counters=None,
    )
    store = LogStore(tmp_path, LogConfig(term_bytes=4096))
    log = replication.open(store, "t", LogConfig(term_bytes=4096))
    stored = trio.Event()
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(replication.replicator.run)
            log.append_many([b"mine"], 1000)
            replication.replicator.ask("t", log, stored.set)
            await stored.wait()
            streams.streams["t"].append_foreign(2, 1, encode_run(2, [b"theirs"], [2000]))
            log.append_many([b"refused"], 3000)
            replication.replicator.ask("t", log)
            await wait_until(lambda: not replication.replicator.busy, what="the run refused")
            nursery.cancel_scope.cancel()
    figures = cluster_figures(host)
    log.close()
    assert figures is not None
    assert (figures.runs_sent, figures.records_stored, figures.fenced) == (2, 1, 1)
    families = {spec.name: spec.family() for spec in CLUSTER_METRICS}
    add_cluster_families(families, figures)
    (sample,) = families["broker_cluster_writes_fenced_total"].samples
    assert (sample.name, sample.value) == ("broker_cluster_writes_fenced_total", 1)


async def test_readyz_is_503_while_the_nats_connection_is_down(tmp_path: Path) -> None:
    streams = MemoryStreams()
    with trio.fail_after(DEADLINE):
        async with (
            running_broker(data_dir=str(tmp_path), streams=streams) as broker,
            metrics_of(broker) as metrics,
        ):
            assert broker.logs is not None and broker.logs.replication is not None
            link = Link()
            broker.logs.replication.connection = link
            ready = await get(metrics, "/readyz")
            assert (ready.status, ready.body) == (200, b"ready\n")
            link.connected = False
            down = await get(metrics, "/readyz")
            assert down.status == 503
            assert b"not connected to the NATS servers" in down.body
            assert (await get(metrics, "/healthz")).status == 200
            result = scrape(broker)
            assert result("broker_cluster_connected") == 0
            assert result("broker_ready") == 0
            assert "NOT CONNECTED" in render(stat_document(broker))
            link.connected = True
            assert (await get(metrics, "/readyz")).status == 200
            assert scrape(broker)("broker_ready") == 1


async def test_what_the_cluster_runbooks_name_is_in_broker_stat(tmp_path: Path) -> None:
    """The fields the cluster alerts' runbook names are words of the text."""
    doc = OPERATIONS.read_text(encoding="utf-8")
    intro = doc.split("## Cluster mode alerts: runbook", 1)[1].split("\n### ", 1)[0]
    named = {word for word in re.findall(r"`([a-z_]+)`", intro)}
    assert {"runs_sent", "runs_resent", "writes_fenced"} <= named
    streams = MemoryStreams()
    bad = await streams.open_stream("bad")
    bad.append_foreign(1, 1, b"not a run")
    with trio.fail_after(DEADLINE):
        async with running_broker(data_dir=str(tmp_path), streams=streams) as broker:
            await publish(broker, "t", [b"x"])
            text = render(stat_document(broker))
    assert named <= set(re.findall(r"[a-z_]+", text)), named
    assert "NOT CONNECTED" in intro and "topics set aside" in text
