"""Tending the topic logs while the disk fails: a log whose write or fsync
fails is logged once (not at every tending, ten times a second), tried
again every second, and said to be fine again once it is."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from broker.log import LogConfig, LogError, LogStore
from broker.server.storage._topic_logs import IDLE_FILE_MS, SYNC_RETRY_MS, TopicLogs, wall_ms
from tests.log.test_idle_files import term_fds


class FailingLog:
    """A topic log whose first ``failures`` syncs fail."""

    def __init__(self, failures: int) -> None:
        self.topic = "t"
        self.closed = False
        self.next_flush_at = 0
        self.failures = failures
        self.attempts = 0

    def start_sync(self) -> None:
        self.attempts += 1
        if self.attempts <= self.failures:
            raise LogError("[Errno 28] No space left on device")


async def test_a_failing_sync_is_logged_once_and_tried_every_second(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # (A worker's store: a single process's would gather the workers' journals.)
    store: Any = SimpleNamespace(journal=SimpleNamespace(recovered_cut_bytes=0), worker="w0")
    logs = TopicLogs(store, None)  # type: ignore[arg-type]
    failing = FailingLog(failures=3)
    logs._dirty.add(failing)  # type: ignore[arg-type]
    caplog.set_level(logging.INFO, logger="broker")
    now = 1_000_000
    for _ in range(100):  # ten seconds of tending, every 100 ms
        await logs.tend(now)
        now += 100
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert "No space left on device" in errors[0].getMessage()
    assert failing.attempts == 4  # three failures a second apart, then the success
    assert any("written and synced again" in r.getMessage() for r in caplog.records)
    assert not logs._dirty
    assert SYNC_RETRY_MS == 1000


class Settings:
    def log_config(self, topic: str) -> LogConfig:
        return LogConfig(term_bytes=4096)


def test_retention_passes_give_back_the_files_of_idle_logs(tmp_path: Path) -> None:
    """A broker holds a descriptor per topic written lately, not per topic
    ever written: retention's pass (every ten seconds) releases the active
    term file of each log idle for IDLE_FILE_MS with everything synced."""
    with LogStore(tmp_path) as store:
        logs = TopicLogs(store, Settings())
        now = wall_ms()
        for i in range(20):
            topic_log = logs.open(f"t{i}")
            topic_log.append(b"x", now)
            topic_log.flush()
        busy = logs.open("busy")
        busy.append(b"x", now)
        logs.log_written(busy, 1)  # written, its fsync not done yet
        assert term_fds(tmp_path) == 21
        logs.expire(now + IDLE_FILE_MS - 1)
        assert term_fds(tmp_path) == 21
        logs.expire(now + IDLE_FILE_MS)
        assert term_fds(tmp_path) == 1  # the one with an fsync due keeps it
        logs.open("t3").append(b"y", now + IDLE_FILE_MS)
        logs.open("t3").flush()
        assert term_fds(tmp_path) == 2
        assert [bytes(t) for t in logs.open("t3").read(1).tails] == [b"x", b"y"]
