"""Reading a log's first and next offsets without opening it (what a
``ListOffsets`` of a log not opened since the start does, in a thread):
always what opening it would find, and nothing on disk changes."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.log._recover import survey
from tests.log.helpers import T0, body, open_log


def _files(path: Path) -> dict[str, bytes]:
    return {file.name: file.read_bytes() for file in sorted(path.iterdir()) if file.is_file()}


def _opened(path: Path) -> tuple[int, int]:
    with open_log(path) as log:
        end = log.written_offset + 1
        return min(log.first_offset, end), end


@settings(max_examples=60, deadline=None)
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
