"""``flush = "always"``: each record is fsynced before its ``Confirm``, and
the fsync runs off the event loop (``TopicLogs._serve_syncs``): while one
topic's fsync is under way every other connection goes on; its publisher
is confirmed, and its subscribers see the records, once they are durable;
one fsync covers what was appended while the one before ran.

The fsync is held back by a gate in the worker thread (``SyncJob.run``
waits for it), so the tests see the order of events, not timings."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import trio

from broker.client import open_client
from broker.config import BrokerConfig, TopicRule
from broker.log import _log as log_module
from broker.log._marks import read_checkpoint

from .helpers import TIMEOUT, assert_round_trip, make_config, running_broker, url, wait_until


class Gate:
    """Holds the fsyncs of the log layer's worker threads while ``open`` is
    not set (from the start, unless ``closed`` is False); ``waiting``
    counts those it held."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *, closed: bool = True) -> None:
        self.open = threading.Event()
        if not closed:
            self.open.set()
        self.waiting = 0
        run = log_module.SyncJob.run

        def gated(job: log_module.SyncJob) -> None:
            if not self.open.is_set():
                self.waiting += 1
            self.open.wait(TIMEOUT)
            run(job)

        monkeypatch.setattr(log_module.SyncJob, "run", gated)


def always_config(tmp_path: Path, **overrides: object) -> BrokerConfig:
    """A broker on ``tmp_path`` whose topics ``sync.*`` fsync every append."""
    return make_config(
        data_dir=str(tmp_path), topics=(TopicRule("sync.*", flush="always"),), **overrides
    )


async def test_the_loop_goes_on_while_an_fsync_waits_and_the_confirm_follows_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = Gate(monkeypatch)
    async with running_broker(always_config(tmp_path)) as broker:
        logs = broker.logs
        assert logs is not None
        async with (
            open_client(url(broker), name="reader") as reader,
            reader.subscribe("sync.t", options={"from": "earliest"}) as subscription,
            open_client(url(broker), name="pub") as publisher,
        ):
            await publisher.publish("sync.t", b"one")
            flushed = trio.Event()

            async def flush() -> None:
                await publisher.flush()
                flushed.set()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(flush)
                await wait_until(lambda: gate.waiting >= 1, what="the fsync to start")
                # The fsync waits in its thread: other clients go on...
                await assert_round_trip(broker, topic="other")
                # ...and the record is neither confirmed nor delivered.
                topic_log = logs.store.open_logs()["sync.t"]
                assert topic_log.next_offset == 2 and topic_log.durable_offset == 0
                await trio.sleep(0.05)
                assert not flushed.is_set()
                with trio.move_on_after(0.05):
                    await subscription.receive()
                    pytest.fail("a record was delivered before it was durable")
                gate.open.set()
                with trio.fail_after(TIMEOUT):
                    await flushed.wait()
            # What a power cut would keep (the checkpoint written after the
            # fsync) holds the confirmed record.
            assert topic_log.durable_offset == 1
            assert read_checkpoint(topic_log.directory) >= 1
            with trio.fail_after(TIMEOUT):
                message = await subscription.receive()
            assert (message.offset, message.payload) == (1, b"one")


async def test_one_fsync_covers_what_was_appended_while_the_last_ran(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = Gate(monkeypatch)
    async with running_broker(always_config(tmp_path)) as broker:
        logs = broker.logs
        assert logs is not None
        async with open_client(url(broker), name="pub") as publisher:
            await publisher.publish("sync.t", b"first")
            await wait_until(lambda: gate.waiting >= 1, what="the first fsync")
            for index in range(200):
                await publisher.publish("sync.t", b"r%d" % index)
            before = logs.fsyncs
            gate.open.set()
            with trio.fail_after(TIMEOUT):
                await publisher.flush()
        topic_log = logs.store.open_logs()["sync.t"]
        assert topic_log.durable_offset == 201
        # The 200 appended while the first fsync ran took one or two more.
        assert 1 <= logs.fsyncs - before <= 3, logs.fsyncs - before


async def test_a_batch_topic_beside_it_is_confirmed_without_waiting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only "always" topics wait for their fsync: a "batch" topic of the
    same broker is confirmed once written, while an "always" fsync waits."""
    gate = Gate(monkeypatch)
    async with (
        running_broker(always_config(tmp_path)) as broker,
        open_client(url(broker), name="pub") as publisher,
    ):
        await publisher.publish("sync.t", b"held")
        await wait_until(lambda: gate.waiting >= 1, what="the fsync to start")
        async with open_client(url(broker), name="other") as other:
            for index in range(20):
                await other.publish("batch.t", b"b%d" % index)
            with trio.fail_after(TIMEOUT):
                await other.flush()
        gate.open.set()
