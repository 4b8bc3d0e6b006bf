"""``flush = "always"`` with the fsync off the event loop: what a graceful
shutdown and a topic deletion do with batches whose fsync is under way.

The fsync is held back by a gate in the worker thread, as in
``test_flush_always``, so the tests see the order of events, not timings."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import trio

from broker.client import open_client
from broker.config import BrokerConfig, TopicRule
from broker.log import _log as log_module
from broker.log._marks import read_checkpoint

from .helpers import TIMEOUT, make_config, running_broker, url, wait_until


class _Gate:
    """Holds the fsyncs of the log layer's worker threads while ``closed``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.open = threading.Event()
        self.open.set()
        self.waiting = 0
        run = log_module.SyncJob.run

        def gated(job: log_module.SyncJob) -> None:
            if not self.open.is_set():
                self.waiting += 1
            self.open.wait(TIMEOUT)
            run(job)

        monkeypatch.setattr(log_module.SyncJob, "run", gated)


def _config(tmp_path: Path, **overrides: object) -> BrokerConfig:
    return make_config(
        data_dir=str(tmp_path), topics=(TopicRule("sync.*", flush="always"),), **overrides
    )


async def test_a_graceful_shutdown_confirms_what_waits_for_its_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A publish appended before the shutdown began is confirmed by it (as
    when the fsync ran inline): the drain waits for the fsync under way
    before the Goodbye, as it waits for the topics to route the rest."""
    gate = _Gate(monkeypatch)
    gate.open.clear()
    async with running_broker(_config(tmp_path, shutdown_deadline=4.0)) as broker:
        async with open_client(url(broker), name="pub", reconnect=0) as publisher:
            await publisher.publish("sync.t", b"one")
            await wait_until(lambda: gate.waiting >= 1, what="the fsync to start")
            async with trio.open_nursery() as nursery:
                nursery.start_soon(broker.shutdown)
                await wait_until(lambda: broker.closing, what="the shutdown")
                await trio.sleep(0.2)  # (a 200 ms fsync: slow, not unheard of)
                gate.open.set()
            assert publisher.statistics()["confirmed"] == 1


async def test_deleting_a_topic_during_its_fsync_leaves_the_new_log_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The old log's fsync, finishing after the delete, must not write its
    checkpoint into the directory of the log that replaced it: recovery
    would take the new log for one that lost records up to it."""
    gate = _Gate(monkeypatch)
    async with running_broker(_config(tmp_path)) as broker:
        logs = broker.logs
        assert logs is not None
        async with (
            open_client(url(broker), name="pub") as publisher,
            open_client(url(broker), name="admin") as admin,
        ):
            for index in range(50):
                await publisher.publish("sync.t", b"%d" % index)
            await publisher.flush()
            gate.open.clear()
            await publisher.publish("sync.t", b"last")
            await wait_until(lambda: gate.waiting >= 1, what="the fsync to start")
            fsyncs = logs.fsyncs
            row = (await admin.admin("delete-topic", topic="sync.t"))[0]
            assert row["deleted"] is True
            with trio.fail_after(TIMEOUT):
                await publisher.flush()  # (confirmed with the delete)
            gate.open.set()
            await wait_until(lambda: logs.fsyncs > fsyncs, what="the old fsync to end")
            await trio.sleep(0.05)
            new_log = logs.store.open_logs()["sync.t"]
            assert new_log.next_offset == 1
            assert read_checkpoint(new_log.directory) <= new_log.durable_offset
    # And after a restart the new (empty) log lost nothing.
    async with (
        running_broker(_config(tmp_path)) as broker,
        open_client(url(broker), name="pub") as publisher,
    ):
        await publisher.publish("sync.t", b"after")
        await publisher.flush()
        logs = broker.logs
        assert logs is not None
        topic_log = logs.store.open_logs()["sync.t"]
        assert topic_log.recovery.clean and not topic_log.recovery.gaps
        assert topic_log.next_offset == 2
