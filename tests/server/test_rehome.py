"""``rehome_cursors``: durable cursors move to the journal of their topic's
owner when the number of workers changes (see ``broker/server/_rehome.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.log import DataDirLocked, DirLock, StateJournal
from broker.protocol import owner_id
from broker.server import rehome_cursors
from broker.server._log_subscription import cursor_key

IDS = ["w0", "w1"]


def topic_of(worker: str) -> str:
    return next(f"t{n}" for n in range(1000) if owner_id(f"t{n}", IDS) == worker)


def cursors(path: Path) -> dict[str, object]:
    with StateJournal(path / "state.journal") as journal:
        return dict(journal.items("cursors"))


def put(path: Path, key: str, position: int) -> None:
    path.mkdir(parents=True, exist_ok=True)
    with StateJournal(path / "state.journal") as journal:
        journal.put("cursors", key, position)


def test_cursors_move_to_their_topics_owners_and_back(tmp_path: Path) -> None:
    at_w0 = cursor_key(None, topic_of("w0"), "c")
    at_w1 = cursor_key("alice", topic_of("w1"), "c")
    put(tmp_path, at_w0, 10)
    put(tmp_path, at_w1, 20)
    with StateJournal(tmp_path / "state.journal") as journal:
        journal.put("sessions", "s", {"kept": True})  # (only cursors move)

    assert rehome_cursors(tmp_path, lambda topic: owner_id(topic, IDS)) == 2
    assert cursors(tmp_path) == {}
    assert cursors(tmp_path / "workers" / "w0") == {at_w0: 10}
    assert cursors(tmp_path / "workers" / "w1") == {at_w1: 20}
    with StateJournal(tmp_path / "state.journal") as journal:
        assert journal.get("sessions", "s") == {"kept": True}
    assert rehome_cursors(tmp_path, lambda topic: owner_id(topic, IDS)) == 0  # (settled)

    # Back to one process, with its journal open already.
    with StateJournal(tmp_path / "state.journal") as journal:
        assert rehome_cursors(tmp_path, lambda _topic: None, (None, journal)) == 2
        assert dict(journal.items("cursors")) == {at_w0: 10, at_w1: 20}
    assert cursors(tmp_path / "workers" / "w0") == {}
    assert cursors(tmp_path / "workers" / "w1") == {}


def test_a_cursor_left_in_two_journals_keeps_the_larger_position(tmp_path: Path) -> None:
    """As after a crash between writing the new owner's journal and
    forgetting the old one's, and the cursor advancing meanwhile."""
    key = cursor_key(None, topic_of("w1"), "c")
    put(tmp_path, key, 3)
    put(tmp_path / "workers" / "w1", key, 7)
    put(tmp_path / "workers" / "w0", key, 5)
    assert rehome_cursors(tmp_path, lambda topic: owner_id(topic, IDS)) == 2
    assert cursors(tmp_path / "workers" / "w1") == {key: 7}
    assert cursors(tmp_path / "workers" / "w0") == {}
    assert cursors(tmp_path) == {}


def test_a_worker_still_running_is_not_touched(tmp_path: Path) -> None:
    key = cursor_key(None, topic_of("w1"), "c")
    put(tmp_path / "workers" / "w1", key, 7)
    lock = DirLock(tmp_path / "workers" / "w1")
    try:
        with pytest.raises(DataDirLocked):
            rehome_cursors(tmp_path, lambda _topic: None)
    finally:
        lock.release()
    assert cursors(tmp_path / "workers" / "w1") == {key: 7}
