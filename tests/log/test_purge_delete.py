"""Deleting records from the start of a log (purge, Kafka's DeleteRecords),
deleting a topic, and reading the last N records."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.log import DataDirLocked, LogClosed, LogConfig, LogStore, Start, list_stored_topics
from broker.log._marks import write_start
from broker.log._recover import survey
from tests.log.helpers import T0, body, open_log, read_all

CONFIG = LogConfig(term_bytes=512)


def _terms(path: Path) -> list[Path]:
    return sorted(path.glob("*.term"))


def _bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.iterdir() if p.is_file())


# ---------------------------------------------------------------- purge


def test_a_purge_inside_the_active_term(tmp_path: Path) -> None:
    with open_log(tmp_path, flush="always") as log:
        for i in range(1, 6):
            log.append(body(i), T0 + i)
        assert log.term_count == 1
        reader = log.reader()
        assert log.purge_before(3) == 2
        assert log.first_offset == 3 and log.next_offset == 6
        run = reader.read()
        assert (run.first_offset, run.gap) == (3, 2)
        assert [bytes(t) for t in run.tails] == [body(i) for i in (3, 4, 5)]
        assert reader.gap == 2 and reader.lag == 3
        assert log.read(1).gap == 2 and log.read(4).gap == 0
        assert log.purge_before(3) == 0 and log.purge_before(1) == 0
        assert log.offset_at_time(0) == 3
        with pytest.raises(Exception, match="not in its log"):
            log.times(2, 1)
        assert log.times(3, 1) == [T0 + 3]
    assert survey(tmp_path) == (3, 6)
    with open_log(tmp_path) as log:
        assert log.recovery.clean and log.recovery.gaps == []
        assert (log.first_offset, log.next_offset) == (3, 6)
        assert read_all(log.reader()) == [(i, body(i)) for i in (3, 4, 5)]
        assert log.append(b"more", T0) == 6


def test_a_purge_across_terms_deletes_whole_terms_at_once(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        for i in range(1, 101):
            log.append(body(i, 40), T0 + i)
        log.flush()
        bases = log.term_bases()
        assert len(bases) >= 5
        before = _bytes(tmp_path)
        target = bases[3] + 2  # inside the fourth term
        reader = log.reader(Start.at(bases[1] + 1))
        assert log.purge_before(target) == target - 1
        assert log.term_bases() == bases[3:]
        assert [p.name for p in _terms(tmp_path)] == [f"{b:020d}.term" for b in bases[3:]]
        assert _bytes(tmp_path) < before
        assert log.first_offset == target
        run = reader.read()
        assert (run.first_offset, run.gap) == (target, target - bases[1] - 1)
        assert read_all(log.reader()) == [(i, body(i, 40)) for i in range(target, 101)]
        assert log.reader(Start.earliest()).position == target
        assert log.offset_at_time(T0) == target
        # On a term's base: the terms before go, no record of it is hidden.
        assert log.purge_before(bases[4]) == bases[4] - target
        assert log.term_bases()[0] == bases[4] == log.first_offset
    with open_log(tmp_path) as log:
        assert log.recovery.clean
        assert log.first_offset == bases[4] and log.next_offset == 101


def test_a_purge_overrides_readers_that_hold_retention(tmp_path: Path) -> None:
    with open_log(tmp_path, retain_bytes=1024, when_full="block") as log:
        holder = log.reader()
        for i in range(1, 11):
            log.append(body(i, 40), T0 + i)
        assert log.purge_before(8) == 7
        run = holder.read()
        assert (run.first_offset, run.gap) == (8, 7)
        holder.advance_to(run.next_offset)
        assert holder.gap == 0


def test_a_purge_is_clamped_to_what_is_written(tmp_path: Path) -> None:
    with open_log(tmp_path, flush="batch") as log:
        for i in range(1, 4):
            log.append(body(i), T0)
        log.write()
        log.append(body(4), T0)  # appended, not written yet
        assert log.written_offset == 3
        assert log.purge_before(10**9) == 3
        assert (log.first_offset, log.next_offset) == (4, 5)
        assert read_all(log.reader()) == [(4, body(4))]
        log.flush()
        assert log.purge_before(10**9) == 1  # everything: an empty log that goes on
        assert log.first_offset == log.next_offset == 5
        assert log.read(1).tails == [] and log.read(1).first_offset == 5
    with open_log(tmp_path) as log:
        assert (log.first_offset, log.next_offset) == (5, 5)
        assert log.append(b"x", T0) == 5
        assert read_all(log.reader()) == [(5, b"x")]


def test_a_purge_holds_after_a_restart_of_the_store(tmp_path: Path) -> None:
    with LogStore(tmp_path, CONFIG) as store:
        log = store.topic("t")
        for i in range(1, 61):
            log.append(body(i, 40), T0 + i)
        assert log.purge_before(29) == 28
        bases = log.term_bases()
        assert bases[0] < 29  # the mark is inside a term
    with LogStore(tmp_path, CONFIG) as store:
        assert store.survey("t") == (29, 61)
        (listed,) = store.list_topics()
        assert (listed.first, listed.end) == (29, 61)
        log = store.topic("t")
        assert log.recovery.clean and log.gap_records == 0
        assert (log.first_offset, log.next_offset) == (29, 61)
        assert log.read(1).gap == 28
        assert read_all(log.reader()) == [(i, body(i, 40)) for i in range(29, 61)]
        assert log.reader(Start.last(100)).position == 29


def test_a_purge_cut_off_by_a_crash_is_finished_at_the_next_open(tmp_path: Path) -> None:
    """The mark is durable before a term file is removed: a crash between
    leaves terms wholly below it, which reading ignores and opening removes."""
    with open_log(tmp_path) as log:
        for i in range(1, 61):
            log.append(body(i, 40), T0 + i)
        bases = log.term_bases()
    target = bases[2] + 1
    write_start(tmp_path, target)
    assert survey(tmp_path) == (target, 61)
    with open_log(tmp_path) as log:
        assert log.recovery.clean
        assert log.first_offset == target and log.term_bases() == bases[2:]
        assert [p.name for p in _terms(tmp_path)] == [f"{b:020d}.term" for b in bases[2:]]
        assert read_all(log.reader()) == [(i, body(i, 40)) for i in range(target, 61)]


def test_purged_records_lost_at_the_end_are_not_reported_lost(tmp_path: Path) -> None:
    """A power cut that loses records written (not fsynced) and purged: the
    log goes on after the purge, reporting nothing lost below the mark."""
    with open_log(tmp_path) as log:
        for i in range(1, 11):
            log.append(body(i), T0 + i)
    write_start(tmp_path, 8)
    (term,) = _terms(tmp_path)
    term.write_bytes(term.read_bytes()[:0])  # its records gone
    (tmp_path / "checkpoint").unlink()
    with open_log(tmp_path) as log:
        assert log.recovery.cut_records == 0
        assert (log.first_offset, log.next_offset) == (8, 8)
        assert log.append(b"x", T0) == 8


# ---------------------------------------------------------------- Start.last


def test_start_last_reads_the_last_records(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        Start.last(0)
    with open_log(tmp_path) as log:
        assert log.reader(Start.last(5)).position == 1  # empty log
        for i in range(1, 61):
            log.append(body(i), T0 + i)
        assert log.reader(Start.last(1)).position == 60
        assert read_all(log.reader(Start.last(3))) == [(i, body(i)) for i in (58, 59, 60)]
        assert log.reader(Start.last(60)).position == 1
        assert log.reader(Start.last(1000)).position == 1
        log.write()
        assert log.purge_before(50) == 49
        assert log.reader(Start.last(20)).position == 50
        assert log.reader(Start.last(2)).position == 59


# ---------------------------------------------------------------- delete


def test_deleting_an_open_topic(tmp_path: Path) -> None:
    with LogStore(tmp_path, CONFIG) as store:
        log = store.topic("gone")
        for i in range(1, 41):
            log.append(body(i, 40), T0 + i)
        log.purge_before(5)
        reader = log.reader()
        held = log.read(10).tails
        store.topic("kept").append(b"k", T0)
        directory = log.directory
        assert store.delete_topic("gone") is True
        assert not directory.exists()
        assert list((tmp_path / "deleted").iterdir()) == []
        assert log.closed and bytes(held[0]) == body(10, 40)
        with pytest.raises(LogClosed):
            reader.read()
        with pytest.raises(LogClosed):
            log.append(b"x", T0)
        with pytest.raises(LogClosed):
            log.purge_before(20)
        assert store.delete_topic("gone") is False
        assert store.stored_topics() == ["kept"]
        assert [topic.name for topic in store.list_topics()] == ["kept"]
        fresh = store.topic("gone")
        assert fresh is not log
        assert (fresh.first_offset, fresh.next_offset) == (1, 1)  # a new log, from 1
        assert fresh.append(b"new", T0) == 1
    with LogStore(tmp_path, CONFIG) as store:
        assert read_all(store.topic("gone").reader()) == [(1, b"new")]


def test_deleting_a_topic_not_open(tmp_path: Path) -> None:
    with LogStore(tmp_path, CONFIG) as store:
        for i in range(1, 30):
            store.topic("gone").append(body(i, 40), T0)
        store.topic("kept").append(b"k", T0)
    with LogStore(tmp_path, CONFIG) as store:
        assert store.delete_topic("gone") is True
        assert store.delete_topic("never") is False
        assert store.stored_topics() == ["kept"]
        assert store.topic("gone").next_offset == 1
        assert read_all(store.topic("kept").reader()) == [(1, b"k")]


def test_a_tombstone_left_by_a_crash_is_removed_at_the_next_open(tmp_path: Path) -> None:
    with LogStore(tmp_path, CONFIG) as store:
        store.topic("gone").append(b"x", T0)
        store.topic("kept").append(b"k", T0)
    # A crash just after the rename: the directory is in deleted/, not removed.
    (tmp_path / "deleted").mkdir()
    tombstone = tmp_path / "deleted" / "0123456789abcdef"
    (tmp_path / "topics" / "gone").rename(tombstone)
    (tmp_path / "deleted" / "stray").write_bytes(b"")
    assert [topic.name for topic in list_stored_topics(tmp_path)] == ["kept"]
    with LogStore(tmp_path, CONFIG) as store:
        assert list((tmp_path / "deleted").iterdir()) == []
        assert store.stored_topics() == ["kept"]
        assert store.topic("gone").next_offset == 1


def test_a_worker_cannot_delete_a_topic_another_holds(tmp_path: Path) -> None:
    with LogStore(tmp_path, worker="w0") as w0, LogStore(tmp_path, worker="w1") as w1:
        w0.topic("a").append(b"x", T0)
        with pytest.raises(DataDirLocked, match="the log of topic 'a' is in use"):
            w1.delete_topic("a")
        assert w0.topic("a").read(1).tails  # still there, still open
        w0.topic("b").append(b"y", T0)
        w0.close()
        assert w1.delete_topic("a") is True
        assert w1.stored_topics() == ["b"]
