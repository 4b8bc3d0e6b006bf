"""A stateful property test: the state journal against a plain dict, through
puts, deletes, writes, flushes, compactions, clean reopens and kills."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from broker.log import StateJournal
from tests.hypothesis_profiles import examples

SPACES = st.sampled_from(["cursors", "sessions", "staging.staged"])
KEYS = st.sampled_from(["a", "b", "c", "00000000000000000001", "ä/\x00"])
SCALARS = (
    st.integers(-(2**64), 2**64)
    | st.text(max_size=20)
    | st.binary(max_size=80)
    | st.booleans()
    | st.floats(allow_nan=False)
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=8,
)

Model = dict[tuple[str, str], object]


class JournalMachine(RuleBasedStateMachine):
    """``model`` is what the journal must hold now; ``written`` what a kill
    must leave (the state as of the last write)."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="state-journal-"))
        self.journal = StateJournal(self.dir / "state.journal", compact_min_bytes=600)
        self.model: Model = {}
        self.written: Model = {}

    def teardown(self) -> None:
        self.journal.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    @rule(space=SPACES, key=KEYS, value=VALUES)
    def put(self, space: str, key: str, value: object) -> None:
        self.journal.put(space, key, value)
        self.model[(space, key)] = value

    @rule(space=SPACES, key=KEYS)
    def delete(self, space: str, key: str) -> None:
        self.journal.delete(space, key)
        self.model.pop((space, key), None)

    @rule(sync=st.booleans())
    def write(self, sync: bool) -> None:
        if sync:
            self.journal.flush()
        else:
            self.journal.write()
        self.written = dict(self.model)

    @rule()
    def compact(self) -> None:
        self.journal.compact()
        self.written = dict(self.model)
        assert self.journal.file_bytes == self.journal.live_bytes

    @rule(kill=st.booleans())
    def reopen(self, kill: bool) -> None:
        if kill:
            self.journal._abandon()
            self.model = dict(self.written)
        else:
            self.journal.close()
            self.written = dict(self.model)
        live = self.journal.live_bytes
        self.journal = StateJournal(self.dir / "state.journal", compact_min_bytes=600)
        assert self.journal.recovered_cut_bytes == 0
        if not kill:  # the size of the live state is accounted the same way
            assert self.journal.live_bytes == live

    @invariant()
    def holds_the_model(self) -> None:
        journal = self.journal
        seen: Model = {}
        for space in journal.spaces():
            items = journal.items(space)
            assert items, space  # no empty spaces are listed
            assert [key for key, _ in items] == sorted(key for key, _ in items)
            seen.update(((space, key), value) for key, value in items)
        assert seen == _normal(self.model)
        for (space, key), value in self.model.items():
            assert _normal(journal.get(space, key)) == _normal(value)
        assert journal.pending or journal.file_bytes >= journal.live_bytes

    @invariant()
    def stays_compact(self) -> None:
        # After a write the file is at most twice the live state (or small).
        journal = self.journal
        if not journal.pending:
            assert journal.file_bytes <= max(2 * journal.live_bytes, 600)


def _normal(value: object) -> object:
    """``value`` as CBOR gives it back (tuples become lists; nothing else changes)."""
    if isinstance(value, dict):
        return {key: _normal(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_normal(item) for item in value]
    return value


JournalMachine.TestCase.settings = settings(
    max_examples=examples(60), stateful_step_count=40, deadline=None
)
TestJournal = JournalMachine.TestCase
