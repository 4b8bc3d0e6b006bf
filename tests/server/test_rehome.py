"""``rehome_state``: durable cursors move to the journal of their topic's
owner when the number of workers changes (see ``broker/server/cluster/_rehome.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.log import DataDirLocked, DirLock, StateJournal
from broker.protocol import owner_id
from broker.server import rehome_state
from broker.server.topics._log_subscription import cursor_key

IDS = ["w0", "w1"]


def by_topic(topic: str) -> str:
    return owner_id(topic, IDS)


def by_session(session: bytes) -> str:
    return IDS[session[0] % len(IDS)]


def single(_key: object) -> None:
    return None


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
        journal.put("staging.staged", "1", ["kept"])  # (staged batches do not move)

    assert rehome_state(tmp_path, by_topic, by_session) == 2
    assert cursors(tmp_path) == {}
    assert cursors(tmp_path / "workers" / "w0") == {at_w0: 10}
    assert cursors(tmp_path / "workers" / "w1") == {at_w1: 20}
    with StateJournal(tmp_path / "state.journal") as journal:
        assert journal.get("staging.staged", "1") == ["kept"]
    assert rehome_state(tmp_path, by_topic, by_session) == 0  # (settled)

    # Back to one process, with its journal open already.
    with StateJournal(tmp_path / "state.journal") as journal:
        assert rehome_state(tmp_path, single, single, (None, journal)) == 2
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
    assert rehome_state(tmp_path, by_topic, by_session) == 2
    assert cursors(tmp_path / "workers" / "w1") == {key: 7}
    assert cursors(tmp_path / "workers" / "w0") == {}
    assert cursors(tmp_path) == {}


def test_a_worker_still_running_is_not_touched(tmp_path: Path) -> None:
    key = cursor_key(None, topic_of("w1"), "c")
    put(tmp_path / "workers" / "w1", key, 7)
    lock = DirLock(tmp_path / "workers" / "w1")
    try:
        with pytest.raises(DataDirLocked):
            rehome_state(tmp_path, single, single)
    finally:
        lock.release()
    assert cursors(tmp_path / "workers" / "w1") == {key: 7}


def test_sessions_and_their_counts_move_to_their_home_workers_and_back(tmp_path: Path) -> None:
    """A session's home is the first byte of its id modulo the number of
    workers (as ``home_of`` finds it); its record and counts go together."""
    homes = {"w0": bytes([2]) + bytes(15), "w1": bytes([7]) + bytes(15)}
    with StateJournal(tmp_path / "state.journal") as journal:
        for sid in homes.values():
            journal.put("sessions", sid.hex(), {"record": sid.hex()})
            journal.put("session.counts", f"{sid.hex()}/p/1", 5)
        journal.put("sessions", "not a session id", {"left": True})
    assert rehome_state(tmp_path, by_topic, by_session) == 4
    for worker, sid in homes.items():
        with StateJournal(tmp_path / "workers" / worker / "state.journal") as journal:
            assert dict(journal.items("sessions")) == {sid.hex(): {"record": sid.hex()}}
            assert dict(journal.items("session.counts")) == {f"{sid.hex()}/p/1": 5}
    with StateJournal(tmp_path / "state.journal") as journal:
        assert dict(journal.items("sessions")) == {"not a session id": {"left": True}}
        assert rehome_state(tmp_path, single, single, (None, journal)) == 4
        assert len(journal.items("sessions")) == 3
        assert len(journal.items("session.counts")) == 2
