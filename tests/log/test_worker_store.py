"""A worker's log store: its own journal, and a lock per open topic (the fence)."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.log import DataDirLocked, LogStore


def test_two_workers_share_a_data_directory_but_never_a_topic(tmp_path: Path) -> None:
    with LogStore(tmp_path, worker="w0") as w0, LogStore(tmp_path, worker="w1") as w1:
        w0.topic("a").append(b"one", 0)
        end = w0.topic("a").next_offset
        w1.topic("b").append(b"two", 0)
        with pytest.raises(DataDirLocked, match="the log of topic 'a' is in use"):
            w1.topic("a")
        w0.journal.put("cursors", "k", 1)
        w0.journal.flush()
        assert (tmp_path / "workers" / "w0" / "state.journal").exists()
        assert not (tmp_path / "state.journal").exists()
        with pytest.raises(DataDirLocked, match="worker w0"):
            LogStore(tmp_path, worker="w0")
    # Closed: ownership moves, the data stays (another worker count, say).
    with LogStore(tmp_path, worker="w2") as w2:
        assert w2.topic("a").next_offset == end
        assert sorted(w2.stored_topics()) == ["a", "b"]


def test_deleting_a_topic_releases_its_lock(tmp_path: Path) -> None:
    with LogStore(tmp_path, worker="w0") as w0, LogStore(tmp_path, worker="w1") as w1:
        fresh = w0.topic("gone").next_offset
        w0.topic("gone").append(b"x", 0)
        assert w0.delete_topic("gone")
        assert w1.topic("gone").next_offset == fresh


def test_retention_of_a_log_not_opened_keeps_off_a_log_another_worker_holds(
    tmp_path: Path,
) -> None:
    """Retention deletes expired terms of a log nobody opened here without
    opening it; not if it was opened meanwhile (its own retention decides),
    nor if another worker holds the topic's directory (the fence)."""
    from broker.log import LogConfig

    config = LogConfig(term_bytes=4096)
    with LogStore(tmp_path, config) as store:
        log = store.topic("t")
        for i in range(300):
            log.append(b"x" * 100, 1000 + i)
    with (
        LogStore(tmp_path, config, worker="w0") as w0,
        LogStore(tmp_path, config, worker="w1") as w1,
    ):
        due = w0.expired_terms("t", 10**12)
        assert len(due) >= 2 and all(path.exists() for path in due)
        w1.topic("t")  # w1 holds it now
        assert w0.remove_expired("t", due) == 0
        assert all(path.exists() for path in due)
    with LogStore(tmp_path, config, worker="w0") as w0:
        w0.topic("t")
        assert w0.remove_expired("t", due) == 0  # open here: its own expire() decides
    with LogStore(tmp_path, config, worker="w0") as w0:
        assert w0.remove_expired("t", due) == len(due)
        assert not any(path.exists() for path in due)
        log = w0.topic("t")
        assert log.recovery.clean and log.first_offset > 1 and log.next_offset == 301
