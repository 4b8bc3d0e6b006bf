"""Tending the topic logs while the disk fails: a log whose write or fsync
fails is logged once (not at every tending, ten times a second), tried
again every second, and said to be fine again once it is."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest

from broker.log import LogError
from broker.server._logs import SYNC_RETRY_MS, TopicLogs


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
    store: Any = SimpleNamespace(journal=SimpleNamespace(recovered_cut_bytes=0))
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
