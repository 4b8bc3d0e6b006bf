"""An idle log gives its file descriptor back: a broker with many topics holds
a descriptor per topic written lately, not per topic ever written (it used
to run out of them: with a limit of 256, at 244 topics every accept failed).
The next write opens the file again; when that fails (no descriptors left),
the write fails as a disk error does: records kept, appends refused until a
write succeeds, nothing lost."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from broker.log import LogWriteError, TopicLog
from tests.log.helpers import T0, body, open_log, read_all

IDLE = 30_000


def term_fds(path: Path) -> int:
    """Descriptors this process holds on term files under ``path``."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(path)) and target.endswith(".term"):
            count += 1
    return count


def written(log: TopicLog, first: int, last: int, now_ms: int) -> None:
    for i in range(first, last + 1):
        log.append(body(i), now_ms)
    log.flush()


def test_an_idle_durable_log_releases_its_file_and_the_next_write_opens_it(
    tmp_path: Path,
) -> None:
    with open_log(tmp_path, term_bytes=4096) as log:
        written(log, 1, 5, T0)
        assert term_fds(tmp_path) == 1
        assert not log.release_file(T0 + IDLE - 1, IDLE)  # not idle long enough
        assert log.release_file(T0 + IDLE, IDLE)
        assert term_fds(tmp_path) == 0
        assert not log.release_file(T0 + 2 * IDLE, IDLE)  # nothing more to give back
        assert read_all(log.reader()) == [(i, body(i)) for i in range(1, 6)]
        written(log, 6, 8, T0 + 2 * IDLE)
        assert term_fds(tmp_path) == 1
    with open_log(tmp_path, term_bytes=4096) as log:  # what was written is on disk
        assert read_all(log.reader()) == [(i, body(i)) for i in range(1, 9)]


def test_a_log_with_records_not_yet_synced_keeps_its_file(tmp_path: Path) -> None:
    with open_log(tmp_path, term_bytes=4096) as log:
        log.append(body(1), T0)
        assert not log.release_file(T0 + 10 * IDLE, IDLE)
        log.write()  # written, not fsynced
        assert not log.release_file(T0 + 10 * IDLE, IDLE)
        log.flush()
        assert log.release_file(T0 + 10 * IDLE, IDLE)


def test_no_descriptor_left_to_open_it_again_is_a_write_error_that_passes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with open_log(tmp_path, term_bytes=4096) as log:
        written(log, 1, 2, T0)
        assert log.release_file(T0 + IDLE, IDLE)
        real_open = os.open

        def no_fds(path: object, flags: int, *args: object) -> int:
            if str(path).endswith(".term"):
                raise OSError(errno.EMFILE, "Too many open files")
            return real_open(path, flags, *args)  # type: ignore[arg-type]

        monkeypatch.setattr(os, "open", no_fds)
        log.append(body(3), T0 + IDLE)  # in memory: readable at once
        with pytest.raises(LogWriteError, match="Too many open files"):
            log.flush()
        with pytest.raises(LogWriteError):  # refused until a write succeeds
            log.append(body(4), T0 + IDLE)
        monkeypatch.setattr(os, "open", real_open)
        log.flush()
        log.append(body(4), T0 + IDLE)
        log.flush()
    with open_log(tmp_path, term_bytes=4096) as log:
        assert read_all(log.reader()) == [(i, body(i)) for i in range(1, 5)]


def test_a_full_term_rotates_after_its_file_was_released(tmp_path: Path) -> None:
    with open_log(tmp_path, term_bytes=512) as log:
        written(log, 1, 3, T0)
        assert log.release_file(T0 + IDLE, IDLE)
        written(log, 4, 60, T0 + IDLE)  # several new terms
        assert log.term_count > 2
        assert term_fds(tmp_path) == 1
    with open_log(tmp_path, term_bytes=512) as log:
        assert read_all(log.reader()) == [(i, body(i)) for i in range(1, 61)]


def test_no_descriptor_left_for_a_sync_is_a_write_error_not_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fsync in a thread syncs a duplicate of the file's descriptor; with
    none left, os.dup raised a bare OSError out of the logs' tending task,
    which ended the whole broker (its listener gone). It is a LogWriteError,
    which tending logs and retries."""
    with open_log(tmp_path, term_bytes=4096) as log:
        log.append(body(1), T0)

        def no_fds(fd: int) -> int:
            raise OSError(errno.EMFILE, "Too many open files")

        with monkeypatch.context() as patched:
            patched.setattr(os, "dup", no_fds)
            with pytest.raises(LogWriteError, match="Too many open files"):
                log.start_sync()
        job = log.start_sync()
        assert job is not None
        job.run()
        job.finish()
        assert log.durable_offset == 1
