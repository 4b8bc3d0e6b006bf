"""TopicLog.times: the receive times of a run of records, as stored."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.log import LogError, TopicLog

from .helpers import T0, body, open_log


def _append_timed(log: TopicLog, count: int) -> list[int]:
    """Append ``count`` records, a few per receive time; the times stored."""
    stored = []
    for i in range(count):
        offset = log.append(body(log.next_offset, 40), T0 + 3 * (i // 4))
        assert offset == len(stored) + 1
        stored.append(T0 + 3 * (i // 4))
    log.write()
    return stored


def test_times_of_any_range_are_those_appended_across_terms(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        stored = _append_timed(log, 100)
        assert log.term_count > 3  # (the ranges below cross terms)
        assert log.times(1, 100) == stored
        for first, count in ((1, 1), (5, 17), (40, 61), (100, 1), (7, 0)):
            assert log.times(first, count) == stored[first - 1 : first - 1 + count]


def test_times_of_a_read_run_match_it(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        stored = _append_timed(log, 60)
        run = log.read(11, 30)
        assert run.tails
        assert log.times(run.first_offset, len(run.tails)) == stored[10 : 10 + len(run.tails)]


def test_times_survive_a_reopen_and_never_go_back(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        log.append(b"a", T0 + 10)
        log.append(b"b", T0 + 5)  # the clock stepped back: stored as T0 + 10
        log.append_many([b"c", b"d"], T0 + 20)
        log.write()
        assert log.times(1, 4) == [T0 + 10, T0 + 10, T0 + 20, T0 + 20]
    with open_log(tmp_path) as log:
        assert log.times(1, 4) == [T0 + 10, T0 + 10, T0 + 20, T0 + 20]


def test_times_of_records_not_in_the_log_raise(tmp_path: Path) -> None:
    with open_log(tmp_path, retain_bytes=1024, when_full="drop-oldest") as log:
        _append_timed(log, 100)
        first = log.first_offset
        assert first > 1
        with pytest.raises(LogError):
            log.times(first - 1, 2)
        with pytest.raises(LogError):
            log.times(log.next_offset - 1, 2)
        assert len(log.times(first, log.next_offset - first)) == log.next_offset - first
    with pytest.raises(LogError):
        log.times(first, 1)  # closed
