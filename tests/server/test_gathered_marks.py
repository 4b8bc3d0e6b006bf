"""The publish marks of a read's batches, written together: a connection's
read of publishes to many topics gathers their batches (``TopicLogs.gather``)
and writes the state journal once for all their marks, and still every
batch's mark is written before its records reach the log's file (see
``_publish_marks``); a journal that cannot be written leaves every
gathered batch waiting, none of it in a log, until a retry gets it in."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from accounts import Account
from broker.log import DiskFull, LogConfig, LogStore, StateJournal, TopicLog
from broker.server.storage._publish_marks import MARKS
from broker.server.storage._topic_logs import TopicLogs
from broker.server.topics._topic import Routed, Topic

SESSION = b"\x01" * 16


class Settings:
    def log_config(self, topic: str) -> LogConfig:
        return LogConfig()


class Origin:
    """A publish connection: what was routed (confirmed), in order."""

    def __init__(self) -> None:
        self.confirmed: list[tuple[int, int]] = []

    def routed(self, routed: Routed) -> None:
        self.confirmed.append((routed.handle, len(routed.tails)))


def batch(origin: Origin, handle: int, first: int, count: int) -> Routed:
    """``count`` publishes of SESSION's topic handle ``handle``, from its ``first``."""
    tails = [b"p%d" % n for n in range(first, first + count)]
    runs = [(SESSION, handle, first, count)]
    return Routed(tails, origin, handle, 0, [None] * count, runs)


class Watch:
    """The journal's writes, and what it held each time a log was written."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, journal: StateJournal) -> None:
        self.journal_writes = 0
        #: Per log write: the topic, and the marks the journal file had then.
        self.log_writes: list[tuple[str, dict[str, object]]] = []
        self.fail_journal = 0
        journal_write = StateJournal.write
        log_write = TopicLog.write

        def write(this: StateJournal) -> None:
            if this is journal and this.pending:
                if self.fail_journal:
                    self.fail_journal -= 1
                    raise DiskFull("[Errno 28] No space left on device")
                self.journal_writes += 1
            journal_write(this)

        def write_log(this: TopicLog) -> None:
            assert not journal.pending  # every mark put is written
            self.log_writes.append((this.topic, dict(journal.items(MARKS))))
            log_write(this)

        monkeypatch.setattr(StateJournal, "write", write)
        monkeypatch.setattr(TopicLog, "write", write_log)


def topics_of(logs: TopicLogs, count: int) -> list[Topic]:
    topics = [Topic(f"t{n}", {}, logs.open(f"t{n}"), logs) for n in range(count)]
    for topic in topics:
        topic.publishers = 1  # (kept: a channel is bound to each)
    return topics


def turn() -> Any:
    return SimpleNamespace(account=Account("pub", high_watermark=1 << 20, low_watermark=1 << 19))


def test_one_journal_write_covers_the_marks_of_a_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with LogStore(tmp_path) as store:
        logs = TopicLogs(store, Settings())
        watch = Watch(monkeypatch, logs.journal)
        topics = topics_of(logs, 5)
        origin = Origin()
        logs.gather()
        for handle, topic in enumerate(topics):
            topic.handle(turn(), batch(origin, handle, 1, 2))
        topics[0].handle(turn(), batch(origin, 0, 3, 1))  # a second batch of one topic
        assert not origin.confirmed and watch.journal_writes == 0  # gathered
        logs.release()
        # One write for the first batch of every topic, one for the second.
        assert watch.journal_writes == 2
        assert origin.confirmed == [(0, 2), (1, 2), (2, 2), (3, 2), (4, 2), (0, 1)]
        assert [topic.log.next_offset for topic in topics if topic.log] == [4, 3, 3, 3, 3]
        # Each log was written with the mark of what it took in the journal.
        for (name, marks), handle, first, offset, count in zip(
            watch.log_writes,
            [0, 1, 2, 3, 4, 0],
            [1, 1, 1, 1, 1, 3],
            [1, 1, 1, 1, 1, 3],
            [2, 2, 2, 2, 2, 1],
            strict=True,
        ):
            assert name == f"t{handle}"
            assert marks[f"{SESSION.hex()}/{handle}"] == [name, first, offset, count]


def test_a_journal_that_cannot_be_written_holds_every_gathered_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with LogStore(tmp_path) as store:
        logs = TopicLogs(store, Settings())
        watch = Watch(monkeypatch, logs.journal)
        topics = topics_of(logs, 3)
        origin = Origin()
        watch.fail_journal = 1
        logs.gather()
        for handle, topic in enumerate(topics):
            topic.handle(turn(), batch(origin, handle, 1, 2))
        logs.release()
        # Nothing went into a log, nothing was confirmed: all of it waits.
        assert not origin.confirmed and not watch.log_writes
        assert all(topic.held and topic.log and topic.log.next_offset == 1 for topic in topics)
        assert logs.append_errors == 3
        # A batch sent meanwhile waits behind them, gathered or not.
        logs.gather()
        topics[1].handle(turn(), batch(origin, 1, 3, 1))
        logs.release()
        assert not origin.confirmed
        logs.retry()
        # (Topics are retried in no set order; each topic's batches in order.)
        assert sorted(origin.confirmed) == [(0, 2), (1, 1), (1, 2), (2, 2)]
        assert origin.confirmed.index((1, 2)) < origin.confirmed.index((1, 1))
        assert not any(topic.held for topic in topics)
        for name, marks in watch.log_writes:
            handle = int(name[1:])
            mark = marks[f"{SESSION.hex()}/{handle}"]
            assert isinstance(mark, list) and mark[0] == name
        assert [t.log.next_offset for t in topics if t.log] == [3, 4, 3]
