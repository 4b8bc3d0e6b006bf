"""Reading a log without opening it (in a thread, for a log not opened
since the start): its first and next offsets for a ``ListOffsets``, and the
terms retention by age would delete; always what opening it would find,
and nothing on disk changes."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.log._recover import expired_terms, survey
from tests.hypothesis_profiles import examples
from tests.log.helpers import T0, body, open_log


def _files(path: Path) -> dict[str, bytes]:
    return {file.name: file.read_bytes() for file in sorted(path.iterdir()) if file.is_file()}


def _opened(path: Path) -> tuple[int, int]:
    with open_log(path) as log:
        end = log.written_offset + 1
        return min(log.first_offset, end), end


@settings(max_examples=examples(60), deadline=None)
@given(
    records=st.integers(0, 60),
    damage=st.sampled_from(["none", "truncate", "flip", "hole"]),
    data=st.data(),
)
def test_a_survey_finds_what_opening_finds_and_changes_nothing(
    records: int, damage: str, data: st.DataObject
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp)
        with open_log(path) as log:
            for i in range(1, records + 1):
                log.append(body(i), T0 + i)
        terms = sorted(path.glob("*.term"))
        victim = terms[data.draw(st.integers(0, len(terms) - 1))]
        size = victim.stat().st_size
        if damage == "truncate" and size:
            os.truncate(victim, data.draw(st.integers(0, size - 1)))
        elif damage == "flip" and size:
            raw = bytearray(victim.read_bytes())
            raw[data.draw(st.integers(0, size - 1))] ^= data.draw(st.integers(1, 255))
            victim.write_bytes(raw)
        elif damage == "hole" and len(terms) > 2:
            terms[1].unlink()
        before = _files(path)
        surveyed = survey(path)
        assert _files(path) == before  # read only: nothing cut, created or removed
        assert surveyed == _opened(path)


def test_an_empty_directory_reads_as_an_empty_log(tmp_path: Path) -> None:
    assert survey(tmp_path) == (1, 1)
    assert list(tmp_path.iterdir()) == []
    assert _opened(tmp_path) == (1, 1)


@settings(max_examples=examples(100), deadline=None)
@given(
    records=st.integers(0, 60),
    cutoff=st.integers(0, 62),
    damage=st.sampled_from(["none", "index", "hole"]),
    data=st.data(),
)
def test_the_expired_terms_are_those_an_open_log_deletes(
    records: int, cutoff: int, damage: str, data: st.DataObject
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "log"
        with open_log(path, retain_seconds=1.0) as log:
            for i in range(1, records + 1):
                log.append(body(i), T0 + i)
        terms = sorted(path.glob("*.term"))
        if damage == "index":
            indexes = sorted(path.glob("*.index"))
            if indexes:
                indexes[data.draw(st.integers(0, len(indexes) - 1))].unlink()
        elif damage == "hole" and len(terms) > 2:
            terms[1].unlink()
        before = _files(path)
        expired = expired_terms(path, T0 + cutoff)
        assert _files(path) == before  # read only
        copy = Path(tmp) / "copy"
        shutil.copytree(path, copy)
        with open_log(copy, retain_seconds=1.0) as log:
            log.expire(T0 + cutoff + 1000)  # (now - retain_seconds == the cutoff)
        deleted = set(before) - set(_files(copy))
        names = {p.name for p in expired}
        # Every term found is one the open log deletes; it may delete more
        # only where an index is missing (those are left to it).
        assert names <= deleted
        if damage == "none":
            assert names == {name for name in deleted if name.endswith(".term")}
