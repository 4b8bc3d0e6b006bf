"""TopicLog: appends, runs, offsets across terms, start positions, retention."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.log import HEADER_SIZE, LogClosed, LogConfig, LogFull, RecordTooLarge, Start
from tests.log.helpers import T0, body, open_log, read_all


def test_offsets_are_consecutive_from_one_across_terms(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        assert (log.first_offset, log.next_offset) == (1, 1)
        offsets = [log.append(body(i), T0 + i) for i in range(1, 101)]
        assert offsets == list(range(1, 101))
        assert log.term_count > 3
        bases = log.term_bases()
        assert bases[0] == 1 and bases == sorted(bases)
        assert read_all(log.reader()) == [(i, body(i)) for i in range(1, 101)]
        assert sorted(p.name for p in tmp_path.glob("*.term")) == [f"{b:020d}.term" for b in bases]


def test_a_run_stays_in_one_term_and_respects_its_limits(tmp_path: Path) -> None:
    with open_log(tmp_path, term_bytes=4096) as log:
        for i in range(1, 151):
            log.append(body(i, 20), T0)
        run = log.read(1, max_records=10)
        assert (run.first_offset, len(run.tails), run.gap) == (1, 10, 0)
        run = log.read(5, max_bytes=3 * (HEADER_SIZE + 20))
        assert [bytes(t) for t in run.tails] == [body(i, 20) for i in (5, 6, 7)]
        assert len(log.read(5, max_bytes=1).tails) == 1  # at least one record
        assert log.read(151).tails == [] and log.read(1000).tails == []
        terms = log.term_bases()
        assert len(terms) > 1
        run = log.read(1, max_records=10_000)
        assert run.next_offset == terms[1]


def test_reads_are_slices_of_the_term_buffer_not_copies(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        log.append(b"abc", T0)
        (tail,) = log.read(1).tails
        assert isinstance(tail, memoryview) and tail.readonly
        assert tail.obj is log.read(1).tails[0].obj
        log.append(b"def", T0)
        assert bytes(tail) == b"abc"  # appends never touch committed bytes


def test_a_record_larger_than_a_term_is_refused(tmp_path: Path) -> None:
    with open_log(tmp_path, term_bytes=512) as log:
        log.append(bytes(512 - HEADER_SIZE), T0)
        with pytest.raises(RecordTooLarge):
            log.append(bytes(513 - HEADER_SIZE), T0)
        with pytest.raises(RecordTooLarge):
            log.append_many([b"ok", bytes(600)], T0)
        assert log.next_offset == 2


def test_append_many_returns_the_count_and_shares_one_time(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        assert log.append_many([], T0) == 0
        assert log.append_many([body(i) for i in range(1, 41)], T0 + 7) == 40
        assert read_all(log.reader()) == [(i, body(i)) for i in range(1, 41)]
        assert log.offset_at_time(T0 + 7) == 1 and log.offset_at_time(T0 + 8) == 41


def test_times_never_go_back(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        log.append(b"a", T0 + 10)
        log.append(b"b", T0 + 5)  # the clock stepped back: stored as T0 + 10
        log.append(b"c", T0 + 20)
        assert log.offset_at_time(T0 + 6) == 1
        assert log.offset_at_time(T0 + 11) == 3


def test_start_positions(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        for i in range(1, 61):
            log.append(body(i), T0 + 10 * i)
        assert log.reader(Start.earliest()).position == 1
        assert log.reader(Start.latest()).position == 61
        assert log.reader(Start.at(17)).position == 17
        assert log.reader(Start.from_time(T0 + 250)).position == 25
        assert log.reader(Start.from_time(T0 + 251)).position == 26
        assert log.reader(Start.from_time(0)).position == 1
        assert log.reader(Start.from_time(T0 + 10_000)).position == 61
        with pytest.raises(ValueError):
            Start.at(0)


def test_a_reader_beyond_the_end_waits(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        reader = log.reader(Start.at(5))
        for i in range(1, 5):
            log.append(body(i), T0)
            assert reader.read().tails == []
        log.append(body(5), T0)
        assert read_all(reader) == [(5, body(5))]


def test_latest_sees_only_new_records(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        log.append(b"old", T0)
        reader = log.reader(Start.latest())
        assert reader.read().tails == []
        log.append(b"new", T0)
        assert read_all(reader) == [(2, b"new")]


def test_a_reader_moves_forward_only(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        log.append(b"a", T0)
        reader = log.reader()
        reader.advance_to(2)
        with pytest.raises(ValueError):
            reader.advance_to(1)
        with pytest.raises(ValueError):
            reader.advance_to(3)
        assert reader.lag == 0


# ---------------------------------------------------------------- retention


def _fill(log_append: object, count: int, start: int = 1) -> None:
    for i in range(start, start + count):
        log_append(body(i, 40), T0 + i)  # type: ignore[operator]


def test_retain_bytes_deletes_whole_terms_oldest_first(tmp_path: Path) -> None:
    with open_log(tmp_path, term_bytes=512, retain_bytes=2048) as log:
        _fill(log.append, 200)
        assert log.size_bytes <= 2048
        assert log.term_count >= 2
        first = log.first_offset
        assert first > 1 and first == log.term_bases()[0]
        assert read_all(log.reader()) == [(i, body(i, 40)) for i in range(first, 201)]
        files = sorted(tmp_path.glob("*.term"))
        assert files[0].name == f"{first:020d}.term" and len(files) == log.term_count


def test_drop_oldest_tells_a_reader_behind_how_many_it_missed(tmp_path: Path) -> None:
    with open_log(tmp_path, retain_bytes=1024, when_full="drop-oldest") as log:
        reader = log.reader()
        _fill(log.append, 100)
        first = log.first_offset
        assert reader.gap == first - 1 > 0
        run = reader.read()
        assert (run.first_offset, run.gap) == (first, first - 1)
        reader.advance_to(run.next_offset)
        assert reader.gap == 0
        # A start offset before the first retained record reports its gap too.
        run = log.reader(Start.at(3)).read()
        assert (run.first_offset, run.gap) == (first, first - 3)


def test_block_refuses_appends_while_a_reader_needs_the_oldest_term(tmp_path: Path) -> None:
    with open_log(tmp_path, retain_bytes=1024, when_full="block") as log:
        reader = log.reader()
        appended = 0
        with pytest.raises(LogFull):
            for i in range(1, 1000):
                log.append(body(i, 40), T0)
                appended = i
        assert log.first_offset == 1 and log.next_offset == appended + 1
        with pytest.raises(LogFull):
            log.append(b"x", T0)
        assert log.next_offset == appended + 1  # refused, nothing appended
        # The reader moves past the oldest term: the log deletes it and goes on.
        reader.advance_to(log.term_bases()[1])
        assert log.append(b"x", T0) == appended + 1
        assert log.first_offset == reader.position
        assert reader.gap == 0
        # A closed reader holds nothing back.
        reader.close()
        _fill(log.append, 200, appended + 2)
        assert log.first_offset > appended


def test_unregistered_readers_do_not_block(tmp_path: Path) -> None:
    with open_log(tmp_path, retain_bytes=1024, when_full="block") as log:
        log.reader(register=False)
        _fill(log.append, 200)
        assert log.first_offset > 1


def test_append_many_stops_where_the_log_filled(tmp_path: Path) -> None:
    with open_log(tmp_path, retain_bytes=1024, when_full="block") as log:
        log.reader()
        count = log.append_many([body(i, 40) for i in range(1, 200)], T0)
        assert 0 < count < 199 and log.next_offset == count + 1
        with pytest.raises(LogFull):
            log.append_many([b"x"], T0)


def test_retain_seconds_deletes_sealed_terms_by_their_newest_record(tmp_path: Path) -> None:
    with open_log(tmp_path, retain_seconds=10) as log:
        _fill(log.append, 30)  # times T0 + 1 .. T0 + 30 ms
        bases = log.term_bases()
        assert len(bases) >= 3
        assert log.expire(T0 + 10_000) == 0
        log.append(b"late", T0 + 60_000)
        assert log.expire(T0 + 10_000 + bases[1] - 1) == 0  # its newest is exactly 10 s old
        assert log.expire(T0 + 10_000 + bases[1]) == 1  # only the first term is older
        assert log.first_offset == bases[1]
        assert log.expire(T0 + 100_000) == len(bases) - 2  # never the active term
        assert log.term_count == 1 and log.first_offset == log.term_bases()[0]


def test_retain_seconds_waits_for_a_blocking_reader(tmp_path: Path) -> None:
    with open_log(tmp_path, retain_seconds=1, when_full="block") as log:
        reader = log.reader()
        _fill(log.append, 30)
        assert log.expire(T0 + 100_000) == 0
        reader.advance_to(log.term_bases()[1])
        assert log.expire(T0 + 100_000) == 1


def test_a_closed_log_refuses(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.close()
    log.close()
    with pytest.raises(LogClosed):
        log.append(b"x", T0)
    with pytest.raises(LogClosed):
        log.read(1)


def test_config_is_checked() -> None:
    with pytest.raises(ValueError):
        LogConfig(term_bytes=10)
    with pytest.raises(ValueError):
        LogConfig(when_full="wait")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        LogConfig(flush="never")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        LogConfig(retain_bytes=0)


def test_slices_outlive_eviction_and_deletion(tmp_path: Path) -> None:
    with open_log(tmp_path, mapped_terms=1, retain_bytes=2048) as log:
        _fill(log.append, 10)
        held = log.read(1).tails  # from a term that will be sealed, evicted, deleted
        _fill(log.append, 20, 11)
        assert read_all(log.reader(Start.at(log.first_offset)))  # maps and evicts terms
        _fill(log.append, 200, 31)
        assert log.first_offset > 10
        assert [bytes(t) for t in held] == [body(i, 40) for i in range(1, 1 + len(held))]


def test_reads_across_many_sealed_terms_with_one_mapped(tmp_path: Path) -> None:
    with open_log(tmp_path, mapped_terms=1) as log:
        _fill(log.append, 100)
    with open_log(tmp_path, mapped_terms=1) as log:
        expected = [(i, body(i, 40)) for i in range(1, 101)]
        assert read_all(log.reader(), max_records=3) == expected
        assert read_all(log.reader(Start.at(57))) == expected[56:]
        assert log.offset_at_time(T0 + 80) == 80


def test_lag_counts_what_waits(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        reader = log.reader()
        _fill(log.append, 5)
        assert reader.lag == 5
        reader.advance_to(3)
        assert reader.lag == 3
