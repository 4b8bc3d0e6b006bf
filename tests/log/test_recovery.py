"""Crash safety: reopening, torn and corrupt terms, a full disk, the lock, kill -9."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.log import (
    HEADER_SIZE,
    DataDirLocked,
    DiskFull,
    LogStore,
    LogWriteError,
    TopicDirMismatch,
    TopicLog,
)
from broker.log import _files as files
from broker.protocol import TopicNameError
from tests.hypothesis_profiles import examples
from tests.log.helpers import T0, body, open_log, read_all

REPO = Path(__file__).resolve().parents[2]


def _terms(path: Path) -> list[Path]:
    return sorted(path.glob("*.term"))


def test_reopen_after_a_clean_close_finds_everything(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        for i in range(1, 101):
            log.append(body(i), T0 + i)
        bases = log.term_bases()
    with open_log(tmp_path) as log:
        assert log.recovery.clean and log.recovery.details == []
        assert log.term_bases() == bases
        assert read_all(log.reader()) == [(i, body(i)) for i in range(1, 101)]
        assert log.offset_at_time(T0 + 50) == 50
        assert log.append(b"more", T0) == 101  # and appends go on (time kept monotonic)
        assert log.offset_at_time(T0 + 100) == 100  # 101 is stored at T0 + 100 too
        assert log.offset_at_time(T0 + 101) == 102
    with open_log(tmp_path) as log:
        assert log.next_offset == 102 and log.recovery.clean


def test_a_bigger_term_from_an_earlier_config_is_reopened_whole(tmp_path: Path) -> None:
    with open_log(tmp_path, term_bytes=4096) as log:
        log.append_many([body(i, 50) for i in range(1, 40)], T0)
    with open_log(tmp_path, term_bytes=512) as log:
        assert log.recovery.clean
        log.append(b"x", T0)
        assert read_all(log.reader())[-2:] == [(39, body(39, 50)), (40, b"x")]


@settings(max_examples=examples(40))
@given(st.data())
def test_a_torn_last_term_loses_only_what_was_cut_and_says_so(data: st.DataObject) -> None:
    """The records cut from the end of the log used to go unreported (a
    last term cut to 0 bytes: its records lost, "cut 0 records"), and their
    offsets went to new records: every record lost is counted (the log knows
    the last offset it flushed), readers get a gap for exactly those, and
    the log goes on after them."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp)
        with open_log(path) as log:
            for i in range(1, 31):
                log.append(body(i), T0 + i)
        last = _terms(path)[-1]
        size = last.stat().st_size
        keep = data.draw(st.integers(0, size - 1))
        os.truncate(last, keep)
        with open_log(path) as log:
            reader = log.reader()
            records = read_all(reader)
            survivors = len(records)
            assert records == [(i, body(i)) for i in range(1, survivors + 1)]
            lost = 30 - survivors
            assert lost > 0 and log.recovery.cut_records == lost
            # (a last term cut to no record is removed: the log goes on in a new one)
            assert log.recovery.cut_bytes == keep - (last.stat().st_size if last.exists() else 0)
            assert log.recovery.gaps == [(survivors + 1, lost)]
            assert f"{lost} record" in log.recovery.details[0]
            run = log.read(survivors + 1)
            assert (run.gap, run.first_offset, run.tails) == (lost, 31, [])
            assert log.append(b"after", T0 + 99) == 31  # no offset is used twice
        with open_log(path) as log:
            assert log.recovery.clean and log.recovery.gaps == [(survivors + 1, lost)]
            assert read_all(log.reader())[-1] == (31, b"after")


@settings(max_examples=examples(40))
@given(st.data())
def test_a_corrupt_byte_loses_exactly_its_record(data: st.DataObject) -> None:
    """A flipped byte anywhere used to cut the log there and remove every
    later term (76% of a log lost for one byte in its 4th term of 11): now
    exactly the record holding it is lost, reported, and a gap for readers;
    a sealed term holding it is kept aside as ``.damaged``."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp)
        with open_log(path) as log:
            for i in range(1, 41):
                log.append(body(i), T0 + i)
            bases = [*log.term_bases(), 41]
        terms = _terms(path)
        index = data.draw(st.integers(0, len(terms) - 1))
        victim = terms[index]
        raw = bytearray(victim.read_bytes())
        where = data.draw(st.integers(0, len(raw) - 1))
        raw[where] ^= data.draw(st.integers(1, 255))
        victim.write_bytes(raw)
        damaged = bases[index] + where // (HEADER_SIZE + len(body(1)))
        with open_log(path) as log:
            recovery = log.recovery
            assert read_all(log.reader()) == [(i, body(i)) for i in range(1, 41) if i != damaged]
            assert recovery.cut_records == 1 and recovery.details
            assert f"lost at offset {damaged}:" in recovery.details[0]
            run = log.read(damaged)
            assert run.gap == 1 and run.first_offset == damaged + 1
            if index < len(terms) - 1:
                assert (path / f"{victim.name}.damaged").read_bytes() == raw
                assert recovery.cut_terms == 1
            assert log.append(b"again", T0 + 100) == 41


def test_a_missing_term_is_a_gap_and_the_terms_after_it_stay(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        for i in range(1, 41):
            log.append(body(i), T0 + i)
        bases = log.term_bases()
    _terms(tmp_path)[1].unlink()  # a hole in the middle
    with open_log(tmp_path) as log:
        assert log.term_bases() == [bases[0], *bases[2:]]
        assert log.next_offset == 41
        missing = bases[2] - bases[1]
        assert log.recovery.cut_records == missing and log.recovery.cut_terms == 0
        assert log.recovery.gaps == [(bases[1], missing)]
        assert "no term file holds them" in log.recovery.details[0]
        kept = [(i, body(i)) for i in range(1, 41) if not bases[1] <= i < bases[2]]
        assert read_all(log.reader()) == kept


# ---------------------------------------------------------------- a full disk


def _full_disk(monkeypatch: pytest.MonkeyPatch, after_bytes: int = 0) -> list[int]:
    """Make every write fail with ENOSPC (after ``after_bytes`` more bytes,
    written partly); returns a switch: ``switch.clear()`` gives the space back."""
    real = files.pwrite
    budget = [after_bytes]

    def pwrite(fd: int, data: memoryview, offset: int) -> int:
        if budget:
            if budget[0] <= 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            data = data[: budget[0]]
            budget[0] -= len(data)
        return real(fd, data, offset)

    monkeypatch.setattr(files, "pwrite", pwrite)
    return budget


def test_disk_full_with_flush_always(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with open_log(tmp_path, flush="always") as log:
        for i in range(1, 6):
            log.append(body(i), T0)
        assert log.durable_offset == 5
        switch = _full_disk(monkeypatch, after_bytes=7)  # a partial write, then ENOSPC
        with pytest.raises(DiskFull) as caught:
            log.append(body(6), T0)
        assert isinstance(caught.value, LogWriteError) and caught.value.errno == errno.ENOSPC
        with pytest.raises(DiskFull):
            log.append_many([body(6), body(7)], T0)
        assert log.next_offset == 6 and log.durable_offset == 5
        assert read_all(log.reader()) == [(i, body(i)) for i in range(1, 6)]
        switch.clear()
        assert log.append(body(6), T0) == 6
    with open_log(tmp_path) as log:
        assert log.recovery.clean
        assert read_all(log.reader()) == [(i, body(i)) for i in range(1, 7)]


def test_disk_full_with_flush_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with open_log(tmp_path, flush="batch", term_bytes=4096) as log:
        log.append(body(1), T0)
        log.flush()
        switch = _full_disk(monkeypatch, after_bytes=30)
        log.append(body(2), T0)
        log.append(body(3), T0)
        with pytest.raises(DiskFull):
            log.flush_due(T0)
        assert log.written_offset == 1
        with pytest.raises(DiskFull):
            log.append(body(4), T0)  # refused while the backlog cannot be written
        assert log.next_offset == 4
        # Records appended before the failure stay readable meanwhile.
        assert read_all(log.reader()) == [(i, body(i)) for i in range(1, 4)]
        assert os.path.getsize(_terms(tmp_path)[-1]) == len(body(1)) + 24  # whole records only
        switch.clear()
        assert log.append(body(4), T0) == 4
        log.flush()
        assert log.durable_offset == 4
    with open_log(tmp_path) as log:
        assert log.recovery.clean
        assert read_all(log.reader()) == [(i, body(i)) for i in range(1, 5)]


def test_disk_full_when_a_term_is_sealed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with open_log(tmp_path, flush="batch") as log:
        switch = _full_disk(monkeypatch)
        count = 0
        with pytest.raises(DiskFull):
            for i in range(1, 100):
                log.append(body(i), T0)
                count = i
        assert log.term_count == 1 and log.next_offset == count + 1
        switch.clear()
        for i in range(count + 1, 100):
            log.append(body(i), T0)
        assert log.term_count > 1
    with open_log(tmp_path) as log:
        assert log.recovery.clean
        assert read_all(log.reader()) == [(i, body(i)) for i in range(1, 100)]


# ---------------------------------------------------------------- flushing


def test_written_and_durable_offsets_follow_the_flush_policy(tmp_path: Path) -> None:
    with open_log(tmp_path, flush="batch", flush_interval_ms=100, term_bytes=4096) as log:
        log.append(b"a", T0)
        log.append(b"b", T0 + 10)
        assert (log.written_offset, log.durable_offset) == (0, 0)
        assert _next_flush(log) == T0 + 100
        assert log.flush_due(T0 + 50) is False
        assert (log.written_offset, log.durable_offset) == (2, 0)
        assert log.flush_due(T0 + 100) is True
        assert (log.written_offset, log.durable_offset) == (2, 2)
        assert _next_flush(log) is None
        assert log.flush_due(T0 + 500) is False
    with open_log(tmp_path, flush="always") as log:
        log.append(b"c", T0)
        assert log.durable_offset == 3 and _next_flush(log) is None


def _next_flush(log: TopicLog) -> int | None:
    return log.next_flush_at


# ---------------------------------------------------------------- the store


def test_the_data_dir_lock_refuses_a_second_opener(tmp_path: Path) -> None:
    with LogStore(tmp_path):
        with pytest.raises(DataDirLocked, match="in use by another broker"):
            LogStore(tmp_path)
        code = textwrap.dedent(
            f"""
            from broker.log import LogStore, DataDirLocked
            try:
                LogStore({str(tmp_path)!r})
            except DataDirLocked as exc:
                print("locked:", exc)
            """
        )
        out = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            check=True,
        )
        assert out.stdout.startswith("locked:") and out.stdout.count("\n") == 1
    with LogStore(tmp_path):  # released on close
        pass


def test_the_store_keeps_topics_apart_by_name(tmp_path: Path) -> None:
    names = ["orders", "a/b", "..", "é", "%2E%2E", "x" * 255]
    with LogStore(tmp_path) as store:
        for index, name in enumerate(names):
            store.topic(name).append(name.encode(), T0 + index)
        assert store.topic("orders") is store.topic("orders")
        with pytest.raises(TopicNameError):
            store.topic("has space")
    with LogStore(tmp_path) as store:
        assert sorted(store.stored_topics()) == sorted(names)
        for name in names:
            assert bytes(store.topic(name).read(1).tails[0]) == name.encode()


def test_a_topic_whose_metadata_was_lost_is_still_listed(tmp_path: Path) -> None:
    """A topic directory without its meta.json (its terms there) used to be
    left out of the stored topics (ListOffsets said nothing of it) while a
    subscription read it all: it is listed by its directory's name, and
    opening it writes the metadata again. A shortened name (``~``) cannot be
    read back: left out, as a directory with no terms."""
    names = ["orders", "a/b", "é", "x" * 255]
    with LogStore(tmp_path) as store:
        for index, name in enumerate(names):
            store.topic(name).append(name.encode(), T0 + index)
    for name in names:
        (tmp_path / "topics" / files.topic_dir_name(name) / "meta.json").unlink()
    (tmp_path / "topics" / "empty").mkdir()
    with LogStore(tmp_path) as store:
        assert sorted(store.stored_topics()) == sorted(names[:3])
        assert bytes(store.topic("a/b").read(1).tails[0]) == b"a/b"
        assert (tmp_path / "topics" / files.topic_dir_name("a/b") / "meta.json").exists()


def test_a_topic_dir_of_another_topic_is_refused(tmp_path: Path) -> None:
    with open_log(tmp_path):
        pass
    with pytest.raises(TopicDirMismatch):
        TopicLog.open(tmp_path, "other")


KILLED = """
import os, signal, sys
from broker.log import LogStore, LogConfig
store = LogStore(sys.argv[1], LogConfig(term_bytes=4096, flush=sys.argv[2]))
log = store.topic("t")
for i in range(1, 301):
    log.append(b"r%d:" % i * 3, 1000 + i)
    if i % 7 == 0:
        log.write()   # the end of a batch (flush="batch")
        print(log.written_offset, flush=True)
    if i == 250:
        os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("flush", ["always", "batch"])
def test_kill_9_keeps_every_written_record_once_in_order(tmp_path: Path, flush: str) -> None:
    result = subprocess.run(
        [sys.executable, "-c", KILLED, str(tmp_path), flush],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == -signal.SIGKILL
    reported = int(result.stdout.split()[-1])
    with LogStore(tmp_path) as store:
        log = store.topic("t")
        records = read_all(log.reader())
    expected = 250 if flush == "always" else reported
    assert len(records) >= expected
    assert records == [(i, b"r%d:" % i * 3) for i in range(1, len(records) + 1)]


# ---------------------------------------------------------------- term indexes


def _scans(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Record the base of every term that opening scans record by record."""
    from broker.log import _damage
    from broker.log._format import Scan
    from broker.log._format import scan as real

    scanned: list[int] = []

    def scan(data: bytes, limit: int, first_offset: int, min_time: int = 0) -> Scan:
        scanned.append(first_offset)
        return real(data, limit, first_offset, min_time)

    monkeypatch.setattr(_damage, "scan", scan)
    return scanned


def test_sealed_terms_open_by_their_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with open_log(tmp_path) as log:
        for i in range(1, 101):
            log.append(body(i), T0 + i)
        bases = log.term_bases()
    assert len(list(tmp_path.glob("*.index"))) == len(bases) - 1
    scanned = _scans(monkeypatch)
    with open_log(tmp_path) as log:
        assert scanned == [bases[-1]]  # only the active term, record by record
        assert log.recovery.clean and log.term_bases() == bases
        assert read_all(log.reader()) == [(i, body(i)) for i in range(1, 101)]
        assert log.offset_at_time(T0 + 33) == 33


def test_a_bad_index_means_a_scan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with open_log(tmp_path) as log:
        for i in range(1, 101):
            log.append(body(i), T0 + i)
        bases = log.term_bases()
    indexes = sorted(tmp_path.glob("*.index"))
    indexes[0].write_bytes(indexes[0].read_bytes()[:-1])  # torn
    raw = bytearray(indexes[1].read_bytes())
    raw[-1] ^= 1  # corrupt
    indexes[1].write_bytes(raw)
    indexes[2].unlink()  # missing
    scanned = _scans(monkeypatch)
    with open_log(tmp_path) as log:
        assert scanned == [bases[0], bases[1], bases[2], bases[-1]]
        assert log.recovery.clean
        assert read_all(log.reader()) == [(i, body(i)) for i in range(1, 101)]


def test_a_truncated_sealed_term_loses_its_torn_record_only(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        for i in range(1, 101):
            log.append(body(i), T0 + i)
        bases = log.term_bases()
    middle = _terms(tmp_path)[1]
    os.truncate(middle, middle.stat().st_size - 3)
    with open_log(tmp_path) as log:
        assert log.next_offset == 101 and log.term_bases() == bases
        torn = bases[2] - 1  # its last record
        assert log.recovery.gaps == [(torn, 1)] and log.recovery.cut_records == 1
        assert read_all(log.reader()) == [(i, body(i)) for i in range(1, 101) if i != torn]


def test_a_failed_fsync_undoes_the_append(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with open_log(tmp_path, flush="always") as log:
        log.append(body(1), T0)
        size = _terms(tmp_path)[-1].stat().st_size

        def fail(fd: int) -> None:
            raise OSError(errno.EIO, "I/O error")

        monkeypatch.setattr(os, "fdatasync", fail)
        with pytest.raises(LogWriteError) as caught:
            log.append(body(2), T0)
        assert not isinstance(caught.value, DiskFull)
        assert _terms(tmp_path)[-1].stat().st_size == size and log.next_offset == 2
        monkeypatch.undo()
        for i in range(2, 60):
            log.append(body(i), T0 + i)
        bases = log.term_bases()
    scanned = _scans(monkeypatch)
    with open_log(tmp_path) as log:
        assert scanned == [bases[-1]]  # the first term's index (its crc) is right
        assert read_all(log.reader()) == [(i, body(i)) for i in range(1, 60)]


def test_a_topic_can_be_deleted(tmp_path: Path) -> None:
    with LogStore(tmp_path) as store:
        log = store.topic("gone")
        log.append(b"x", T0)
        held = log.read(1).tails
        store.topic("kept").append(b"y", T0)
        assert store.delete_topic("gone") is True
        assert store.delete_topic("gone") is False
        assert log.closed and bytes(held[0]) == b"x"
        assert store.stored_topics() == ["kept"]
        assert store.topic("gone").next_offset == 1  # a new log, from offset 1
