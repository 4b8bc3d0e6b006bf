"""``flush = "always"`` with the fsync off the event loop: what a graceful
shutdown and a topic deletion do with batches whose fsync is under way.

The fsync is held back by a gate in the worker thread, as in
``test_flush_always`` (its ``Gate``), so the tests see the order of events, not timings."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import trio

from broker.client import open_client
from broker.log import _files as files_module
from broker.log._marks import read_checkpoint

from .helpers import TIMEOUT, running_broker, url, wait_until
from .test_flush_always import Gate, always_config


async def test_a_graceful_shutdown_confirms_what_waits_for_its_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A publish appended before the shutdown began is confirmed by it (as
    when the fsync ran inline): the drain waits for the fsync under way
    before the Goodbye, as it waits for the topics to route the rest."""
    gate = Gate(monkeypatch)
    async with (
        running_broker(always_config(tmp_path, shutdown_deadline=4.0)) as broker,
        open_client(url(broker), name="pub", reconnect=0) as publisher,
    ):
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
    gate = Gate(monkeypatch, closed=False)
    async with running_broker(always_config(tmp_path)) as broker:
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
        running_broker(always_config(tmp_path)) as broker,
        open_client(url(broker), name="pub") as publisher,
    ):
        await publisher.publish("sync.t", b"after")
        await publisher.flush()
        logs = broker.logs
        assert logs is not None
        topic_log = logs.store.open_logs()["sync.t"]
        assert topic_log.recovery.clean and not topic_log.recovery.gaps
        assert topic_log.next_offset == 2


async def test_a_failed_fsync_writes_its_records_again_and_confirms_only_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a failed fsync the kernel may have dropped the dirty pages (or
    marked them clean): the records are written to the file again before
    the next fsync, and confirmed only once one succeeds."""
    failures = [OSError(errno.EIO, "Input/output error")]
    real_fdatasync = os.fdatasync
    syncs: list[str] = []

    def failing_once(fd: int) -> None:
        if failures:
            syncs.append("failed")
            raise failures.pop()
        syncs.append("synced")
        real_fdatasync(fd)

    writes: list[tuple[str, int, int]] = []
    write_at = files_module.TermFile.write_at

    def recorded(self: files_module.TermFile, data: bytes | memoryview, position: int) -> None:
        writes.append((str(self.path), position, len(data)))
        write_at(self, data, position)

    async with running_broker(always_config(tmp_path)) as broker:
        logs = broker.logs
        assert logs is not None
        async with open_client(url(broker), name="pub") as publisher:
            await publisher.publish("sync.t", b"before")
            await publisher.flush()
            monkeypatch.setattr(os, "fdatasync", failing_once)
            monkeypatch.setattr(files_module.TermFile, "write_at", recorded)
            await publisher.publish("sync.t", b"x" * 100)
            flushed = trio.Event()

            async def flush() -> None:
                await publisher.flush()
                flushed.set()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(flush)
                await wait_until(lambda: syncs == ["failed"], what="the failed fsync")
                assert not flushed.is_set()
                with trio.fail_after(TIMEOUT):
                    await flushed.wait()  # (the retry, a second later)
        assert syncs[0] == "failed" and "synced" in syncs
        # The record was written once before the failed fsync, and again after it.
        topic_log = logs.store.open_logs()["sync.t"]
        term = [w for w in writes if w[0].startswith(str(topic_log.directory))]
        assert len(term) >= 2 and term[1][1:] == term[0][1:], writes
        assert topic_log.durable_offset == 2
