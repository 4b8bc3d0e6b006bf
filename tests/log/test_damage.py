"""Damage inside a topic log (issue 40, item 1): a damaged range of a
term is set aside and reported, every intact record before and after it
stays readable, and readers get a gap for exactly the offsets lost."""

from __future__ import annotations

import os
from pathlib import Path

from broker.log import TopicLog
from broker.log._recover import survey
from tests.log.helpers import T0, body, open_log, read_all, records_of

COUNT = 200


def _terms(path: Path) -> list[Path]:
    return sorted(path.glob("*.term"))


def _filled(path: Path) -> list[int]:
    with open_log(path) as log:
        for i in range(1, COUNT + 1):
            log.append(body(i), T0 + i)
        return log.term_bases()


def _zero(term: Path, start: int, size: int) -> set[int]:
    """Zero ``size`` bytes of ``term`` from ``start``; the offsets it damaged."""
    hit = {o for o, s, e in records_of(term) if s < start + size and start < e}
    raw = bytearray(term.read_bytes())
    raw[start : start + size] = bytes(size)
    term.write_bytes(bytes(raw))
    return hit


def _check(log: TopicLog, lost: set[int]) -> None:
    """Every record but ``lost`` is read, in order, and a gap covers exactly ``lost``."""
    assert read_all(log.reader()) == [(i, body(i)) for i in range(1, COUNT + 1) if i not in lost]
    gapped: set[int] = set()
    offset = log.first_offset
    while offset < log.next_offset:
        run = log.read(offset)
        gapped.update(range(offset, offset + run.gap))
        offset = run.next_offset
    assert gapped == lost


def test_zeros_in_a_sealed_term_lose_only_the_records_they_hit(tmp_path: Path) -> None:
    bases = _filled(tmp_path)
    term = _terms(tmp_path)[1]
    lost = _zero(term, 40, 60)
    original = term.read_bytes()
    with open_log(tmp_path) as log:
        _check(log, lost)
        assert log.recovery.cut_records == len(lost) and log.recovery.cut_terms == 1
        assert log.recovery.gaps == [(min(lost), len(lost))]
        assert log.term_bases()[:2] == [bases[0], bases[1]]
        assert log.next_offset == COUNT + 1
    assert (tmp_path / f"{term.name}.damaged").read_bytes() == original


def test_damage_in_a_sealed_term_without_its_index_is_found_by_search(tmp_path: Path) -> None:
    _filled(tmp_path)
    term = _terms(tmp_path)[2]
    term.with_suffix(".index").unlink()
    lost = _zero(term, records_of(term)[3][1] + 2, 5)  # (its crc and size fields)
    with open_log(tmp_path) as log:
        _check(log, lost)
        assert log.recovery.cut_records == len(lost) == 1


def test_damage_in_the_middle_of_the_last_term_keeps_the_records_after_it(
    tmp_path: Path,
) -> None:
    _filled(tmp_path)
    term = _terms(tmp_path)[-1]
    records = records_of(term)
    assert len(records) > 3
    lost = _zero(term, records[1][1] + 30, 4)
    with open_log(tmp_path) as log:
        _check(log, lost)
        assert log.recovery.cut_records == 1
        assert log.append(b"more", T0 + 999) == COUNT + 1
    with open_log(tmp_path) as log:
        assert log.recovery.clean and log.recovery.gaps == [(min(lost), 1)]
        assert read_all(log.reader(), 1000)[-1] == (COUNT + 1, b"more")


def test_a_whole_sealed_term_damaged_is_one_gap(tmp_path: Path) -> None:
    bases = _filled(tmp_path)
    term = _terms(tmp_path)[2]
    lost = _zero(term, 0, term.stat().st_size)
    assert lost == set(range(bases[2], bases[3]))
    with open_log(tmp_path) as log:
        _check(log, lost)
        assert log.recovery.gaps == [(bases[2], len(lost))]
        assert not term.exists() and (tmp_path / f"{term.name}.damaged").exists()


def test_losses_are_reported_once_and_their_gaps_stay(tmp_path: Path) -> None:
    bases = _filled(tmp_path)
    terms = _terms(tmp_path)
    lost = _zero(terms[1], 50, 1)
    lost |= {o for o, _, _ in records_of(terms[3])}
    terms[3].unlink()
    with open_log(tmp_path) as log:
        assert log.recovery.cut_records == len(lost)
        first = log.recovery.gaps
    for _ in range(2):
        with open_log(tmp_path) as log:
            assert log.recovery.clean and log.recovery.gaps == first
            assert all("known since an earlier start" in line for line in log.recovery.details)
            assert log.gap_records == len(lost)
            _check(log, lost)
    assert survey(tmp_path) == (1, COUNT + 1)
    assert bases[3] in {first for first, _ in first}


def test_a_repair_cut_short_is_done_again(tmp_path: Path) -> None:
    """A crash while a damaged term is set aside (its later runs written,
    the original not yet replaced): the next opening does it again, and
    loses nothing more."""
    _filled(tmp_path)
    term = _terms(tmp_path)[1]
    lost = _zero(term, 60, 1)
    damaged = term.read_bytes()
    index = term.with_suffix(".index").read_bytes()
    with open_log(tmp_path):
        pass
    # Put the original back, as if the crash came before it was replaced.
    os.unlink(tmp_path / f"{term.name}.damaged")
    term.write_bytes(damaged)
    term.with_suffix(".index").write_bytes(index)
    with open_log(tmp_path) as log:
        _check(log, lost)
        assert (tmp_path / f"{term.name}.damaged").read_bytes() == damaged


def test_the_last_term_cut_to_nothing_is_reported_from_the_checkpoint(tmp_path: Path) -> None:
    bases = _filled(tmp_path)
    os.truncate(_terms(tmp_path)[-1], 0)
    lost = set(range(bases[-1], COUNT + 1))
    with open_log(tmp_path) as log:
        _check(log, lost)
        assert log.recovery.cut_records == len(lost)
        assert "missing at the end of the log" in log.recovery.details[0]
        assert log.next_offset == COUNT + 1
    assert survey(tmp_path) == (1, COUNT + 1)


def test_a_sealed_term_cut_to_nothing_is_reported_once(tmp_path: Path) -> None:
    """(An empty first term file used to stay, and its offsets were
    reported lost again at every opening.)"""
    bases = _filled(tmp_path)
    for number in (1, 0):
        term = _terms(tmp_path)[number]
        lost = set(range(bases[number], bases[number + 1]))
        os.truncate(term, 0)
        with open_log(tmp_path) as log:
            assert log.recovery.cut_records == len(lost)
            assert not term.exists()
        with open_log(tmp_path) as log:
            assert log.recovery.clean


def test_a_sync_off_the_loop_writes_the_checkpoint_in_its_thread(tmp_path: Path) -> None:
    """The broker syncs logs with :class:`SyncJob` (its ``run`` in a worker
    thread): the checkpoint that tells recovery what was flushed is written
    there, after the fsync, and ``finish`` on the log's thread adds no I/O."""
    from broker.log._marks import read_checkpoint

    with open_log(tmp_path) as log:
        for _ in range(5):
            log.append(body(20), T0)
        job = log.start_sync()
        assert job is not None
        assert read_checkpoint(tmp_path) == 0
        job.run()
        assert read_checkpoint(tmp_path) == 5
        (tmp_path / "checkpoint").unlink()
        job.finish()
        assert not (tmp_path / "checkpoint").exists()
        assert log.durable_offset == 5
