"""A store holds at most ``open_files`` term files open, however many logs
it has open: the least recently used file is closed first (fsynced first if
a write to it is not), and opens again at its next write, in place.

Before, every log written in the last 30 s held its file: a broker under
``ulimit -n 1024`` ran out of descriptors at about 1,000 topics (new topics
refused, accepts failing, syncs of existing topics failing)."""

from __future__ import annotations

import errno
import os
import resource
from pathlib import Path

import pytest

from broker.log import LogConfig, LogStore, LogWriteError
from broker.log._open_files import MIN_OPEN_FILES, default_open_files
from tests.log.helpers import T0, body, read_all
from tests.log.test_idle_files import term_fds

CONFIG = LogConfig(term_bytes=4096)


def names(count: int) -> list[str]:
    return [f"topic{i}" for i in range(count)]


def test_many_logs_hold_at_most_the_bound_of_open_files(tmp_path: Path) -> None:
    with LogStore(tmp_path, CONFIG, open_files=4) as store:
        for round_ in range(3):  # each round writes every log again
            for number, name in enumerate(names(20)):
                log = store.topic(name, now_ms=T0)
                log.append(body(round_ * 100 + number), T0)
                log.flush()
                assert term_fds(tmp_path) <= 4
        assert len(store.files) == 4
        assert store.files.evictions >= 3 * 20 - 4
        assert store.files.opens == store.files.evictions + 4
        logs = store.open_logs()
        assert len(logs) == 20
        for number, name in enumerate(names(20)):
            expected = [(r + 1, body(r * 100 + number)) for r in range(3)]
            assert read_all(logs[name].reader()) == expected
            assert logs[name].durable_offset == 3
    with LogStore(tmp_path, CONFIG, open_files=4) as store:  # and all on disk
        for number, name in enumerate(names(20)):
            expected = [(r + 1, body(r * 100 + number)) for r in range(3)]
            assert read_all(store.topic(name).reader()) == expected


def fds_under(path: Path) -> list[str]:
    """What this process's descriptors under ``path`` name."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(path)):
            found.append(target)
    return found


def test_sealed_terms_indexes_and_directories_hold_no_descriptor(tmp_path: Path) -> None:
    """Every descriptor a log holds is its active term file's: sealed terms
    are read through maps (which keep none), index files, recovery and
    directory syncs open theirs for the call only."""
    config = LogConfig(term_bytes=512)
    with LogStore(tmp_path, config, open_files=3) as store:
        for name in names(10):
            log = store.topic(name, now_ms=T0)
            for offset in range(1, 61):
                log.append(body(offset), T0)
            log.flush()
            assert log.term_count > 3
        for name, log in store.open_logs().items():
            assert len(read_all(log.reader())) == 60, name  # maps its sealed terms
        held = fds_under(tmp_path)
        assert all(target.endswith((".term", ".lock")) for target in held), held
        assert len([target for target in held if target.endswith(".term")]) <= 3
    with LogStore(tmp_path, config, open_files=3) as store:  # recovery of all ten
        for name in names(10):
            assert len(read_all(store.topic(name).reader())) == 60
        assert len([t for t in fds_under(tmp_path) if t.endswith(".term")]) <= 3


def test_a_file_with_writes_not_synced_is_synced_before_it_is_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """flush="batch": records written (in the page cache), their fsync not
    due yet. Making room for other files syncs them first, so nothing a
    publisher was told is written is ever left unsynced behind a closed
    descriptor; the log then needs no sync of its own for them."""
    synced: list[int] = []
    real_fdatasync = os.fdatasync

    def fdatasync(fd: int) -> None:
        synced.append(fd)
        real_fdatasync(fd)

    with LogStore(tmp_path, CONFIG, open_files=2) as store:
        first = store.topic("first", now_ms=T0)
        first.append(body(1), T0)
        first.write()  # written, not fsynced
        assert first.durable_offset == 0
        monkeypatch.setattr(os, "fdatasync", fdatasync)
        for name in names(3):  # two more files: "first" is the least recently used
            log = store.topic(name, now_ms=T0)
            log.append(body(1), T0)
            log.write()
        assert store.files.eviction_syncs >= 1
        assert len(synced) >= 1
        assert term_fds(tmp_path) <= 2
        assert first.start_sync() is None  # synced as it was closed
        assert first.durable_offset == 1
        first.append(body(2), T0)  # opens again, at its end
        first.flush()
    with LogStore(tmp_path, CONFIG) as store:
        assert read_all(store.topic("first").reader()) == [(1, body(1)), (2, body(2))]


def test_a_failed_sync_keeps_the_file_open_and_the_log_is_told(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An fsync that fails while making room leaves that file open (beyond
    the bound for a while) and its error is raised by the log's next sync,
    which a broker logs and retries: the error is not swallowed."""
    with LogStore(tmp_path, CONFIG, open_files=1) as store:
        first = store.topic("first", now_ms=T0)
        first.append(body(1), T0)
        first.write()
        real_fdatasync = os.fdatasync
        calls = 0

        def fail_once(fd: int) -> None:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise OSError(errno.EIO, "Input/output error")
            real_fdatasync(fd)

        monkeypatch.setattr(os, "fdatasync", fail_once)
        store.files.make_room()  # as a new file would: the sync fails
        assert len(store.files) == 1  # kept open
        with pytest.raises(LogWriteError, match="Input/output error"):
            first.start_sync()  # the failure, reported to the log once
        job = first.start_sync()  # tried again
        assert job is not None
        job.run()
        job.finish()
        assert job.error is None
        assert first.durable_offset == 1


def test_no_descriptor_left_closes_another_log_file_and_opens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Below the bound, the process may still have no descriptor left (its
    connections took them): a log file then closes the least recently used
    one and opens, rather than refuse its topic."""
    with LogStore(tmp_path, CONFIG, open_files=100) as store:
        for name in names(3):
            log = store.topic(name, now_ms=T0)
            log.append(body(1), T0)
            log.flush()
        assert len(store.files) == 3
        real_open = os.open
        refused = 0

        def emfile_once(path: object, flags: int, *args: object) -> int:
            nonlocal refused
            if str(path).endswith(".term") and flags & os.O_RDWR and not refused:
                refused += 1
                raise OSError(errno.EMFILE, "Too many open files")
            return real_open(path, flags, *args)  # type: ignore[arg-type]

        monkeypatch.setattr(os, "open", emfile_once)
        log = store.topic("new", now_ms=T0)
        log.append(body(1), T0)
        log.flush()
        assert refused == 1
        assert store.files.evictions == 1
        assert len(store.files) == 3


def test_the_default_bound_is_a_quarter_of_the_open_file_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for soft, bound in ((1024, 256), (65536, 16384), (40, MIN_OPEN_FILES)):
        monkeypatch.setattr(resource, "getrlimit", lambda _which, s=soft: (s, s))
        assert default_open_files() == bound
    infinity = resource.RLIM_INFINITY
    monkeypatch.setattr(resource, "getrlimit", lambda _which: (infinity, infinity))
    assert default_open_files() == (1 << 20) // 4


def test_a_bound_below_one_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        LogStore(tmp_path, CONFIG, open_files=-1)
