"""The state journal: replay, torn and corrupt tails, compaction and its
crashes, a full disk, and its place in the data directory."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

import cbor2
import pytest

from broker.log import DiskFull, JournalFormatError, LogClosed, LogStore, StateJournal, _journal
from broker.log import _files as files
from broker.log._format import HEADER_SIZE


def reopen(journal: StateJournal, *, crash: bool = False) -> StateJournal:
    """Close ``journal`` (or drop it as a kill -9 would) and open its file again."""
    if crash:
        journal._abandon()
    else:
        journal.close()
    return StateJournal(journal.path, compact_min_bytes=journal.compact_min_bytes)


def snapshot(journal: StateJournal) -> dict[str, list[tuple[str, object]]]:
    return {space: journal.items(space) for space in journal.spaces()}


def test_changes_are_seen_at_once_and_after_a_clean_reopen(tmp_path: Path) -> None:
    journal = StateJournal(tmp_path / "state.journal")
    assert journal.recovered_cut_bytes == 0 and not journal.pending
    journal.put("cursors", "b", 7)
    journal.put("cursors", "a", {"offset": 3, "tag": b"\x00\xff"})
    journal.put("sessions", "s1", ["x", 1, True])
    journal.delete("sessions", "s1")
    journal.delete("sessions", "never")
    assert bool(journal.pending)  # (mypy narrows the property)
    assert journal.get("cursors", "b") == 7
    assert journal.get("cursors", "zz") is None and journal.get("nope", "a") is None
    assert journal.items("cursors") == [("a", {"offset": 3, "tag": b"\x00\xff"}), ("b", 7)]
    assert journal.items("sessions") == []
    again = reopen(journal)
    assert again.recovered_cut_bytes == 0 and again.recovery_detail == ""
    assert snapshot(again) == {"cursors": [("a", {"offset": 3, "tag": b"\x00\xff"}), ("b", 7)]}
    again.close()


def test_a_kill_keeps_what_was_written_and_loses_only_what_was_buffered(tmp_path: Path) -> None:
    journal = StateJournal(tmp_path / "state.journal")
    journal.put("s", "a", 1)
    journal.write()
    assert not journal.pending
    journal.put("s", "b", 2)
    again = reopen(journal, crash=True)
    assert snapshot(again) == {"s": [("a", 1)]}
    assert again.recovered_cut_bytes == 0
    # It goes on from there: appends after the replayed records are read too.
    again.put("s", "c", 3)
    again.flush()
    third = reopen(again, crash=True)
    assert snapshot(third) == {"s": [("a", 1), ("c", 3)]}
    third.close()


def test_flush_syncs_only_what_is_new(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    journal = StateJournal(tmp_path / "state.journal")
    syncs: list[Path] = []
    real = files.TermFile.sync

    def sync(self: files.TermFile) -> None:
        syncs.append(self.path)
        real(self)

    monkeypatch.setattr(files.TermFile, "sync", sync)
    journal.flush()
    assert syncs == []
    journal.put("s", "a", 1)
    journal.flush()
    journal.flush()
    assert len(syncs) == 1
    journal.put("s", "a", 2)
    journal.write()
    journal.close()
    assert len(syncs) == 2


def test_values_it_cannot_store_are_refused_and_change_nothing(tmp_path: Path) -> None:
    with StateJournal(tmp_path / "j") as journal:
        with pytest.raises(TypeError):
            journal.put("s", "k", None)
        with pytest.raises(TypeError):
            journal.put("s", "k", object())
        with pytest.raises(TypeError):
            journal.put("s", 3, 1)  # type: ignore[arg-type]
        assert not journal.pending and journal.spaces() == []
    with pytest.raises(LogClosed):
        journal.put("s", "k", 1)


def _written(tmp_path: Path, count: int) -> tuple[Path, bytes, list[int]]:
    """A journal file holding keys k0.. and where each record starts."""
    path = tmp_path / "state.journal"
    starts = []
    with StateJournal(path) as journal:
        for i in range(count):
            starts.append(journal.file_bytes)
            journal.put("s", f"k{i}", {"n": i, "pad": b"x" * (i + 3)})
            journal.write()
        starts.append(journal.file_bytes)
    return path, path.read_bytes(), starts


def test_a_torn_last_record_is_cut_at_every_byte(tmp_path: Path) -> None:
    path, data, starts = _written(tmp_path, 4)
    last = starts[-2]
    assert len(data) == starts[-1]
    for size in range(last, len(data)):
        path.write_bytes(data[:size])
        journal = StateJournal(path)
        assert journal.recovered_cut_bytes == size - last, size
        assert [key for key, _ in journal.items("s")] == ["k0", "k1", "k2"]
        assert path.stat().st_size == last
        # The journal goes on after the cut, and the next open agrees.
        journal.put("s", "after", 1)
        again = reopen(journal)
        assert again.recovered_cut_bytes == 0
        assert [key for key, _ in again.items("s")] == ["after", "k0", "k1", "k2"]
        again.close()


def test_a_corrupt_byte_in_the_middle_cuts_from_its_record(tmp_path: Path) -> None:
    path, data, starts = _written(tmp_path, 5)
    for where in (starts[2], starts[2] + 3, starts[2] + HEADER_SIZE + 2, starts[3] - 1):
        damaged = bytearray(data)
        damaged[where] ^= 0x40
        path.write_bytes(bytes(damaged))
        journal = StateJournal(path)
        assert journal.recovered_cut_bytes == len(data) - starts[2], where
        assert "torn or corrupt" in journal.recovery_detail
        assert [key for key, _ in journal.items("s")] == ["k0", "k1"]
        assert path.stat().st_size == starts[2]
        journal.close()


def test_a_torn_header_or_a_foreign_file_starts_afresh(tmp_path: Path) -> None:
    path = tmp_path / "state.journal"
    for junk in (b"\x01\x02", b"\x00" * 100, b"not a journal at all, no sir" * 3):
        path.write_bytes(junk)
        journal = StateJournal(path)
        assert journal.recovered_cut_bytes == len(junk)
        assert journal.spaces() == []
        journal.put("s", "k", 1)
        assert snapshot(reopen(journal)) == {"s": [("k", 1)]}


def test_a_newer_format_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "state.journal"
    header = cbor2.dumps({"format": 99, "kind": "broker state journal"})
    path.write_bytes(_journal._encode(1, header))
    with pytest.raises(JournalFormatError, match="format 99"):
        StateJournal(path)


# ---------------------------------------------------------------- compaction


def _churn(journal: StateJournal, rounds: int) -> dict[str, object]:
    """Overwrite a few keys many times; the live state it leaves."""
    model: dict[str, object] = {}
    for i in range(rounds):
        key = f"k{i % 5}"
        if i % 7 == 6:
            journal.delete("s", key)
            model.pop(key, None)
        else:
            journal.put("s", key, [i, b"v" * 40])
            model[key] = [i, b"v" * 40]
        journal.write()
    return model


def test_compaction_keeps_the_state_and_bounds_the_file(tmp_path: Path) -> None:
    journal = StateJournal(tmp_path / "state.journal", compact_min_bytes=2000)
    model = _churn(journal, 400)
    assert journal.compactions > 0
    assert journal.file_bytes <= max(2 * journal.live_bytes, 2000) + 200
    assert dict(journal.items("s")) == model
    again = reopen(journal, crash=True)
    assert again.recovered_cut_bytes == 0 and dict(again.items("s")) == model
    assert not (tmp_path / "state.journal.compact").exists()
    again.close()


def test_a_large_state_is_compacted_in_pieces(tmp_path: Path) -> None:
    journal = StateJournal(tmp_path / "state.journal", compact_min_bytes=10**9)
    model = {f"k{i}": bytes([i]) * 300_000 for i in range(10)}  # 3 MB: several pieces
    for key, value in model.items():
        journal.put("big", key, value)
        journal.put("big", key, value)
    journal.compact()
    assert journal.file_bytes == journal.live_bytes < 3_100_000
    again = reopen(journal, crash=True)
    assert dict(again.items("big")) == model
    assert again.live_bytes == again.file_bytes
    again.close()


def test_no_compaction_below_the_minimum(tmp_path: Path) -> None:
    journal = StateJournal(tmp_path / "state.journal")
    _churn(journal, 200)
    assert journal.compactions == 0
    journal.close()


class Killed(BaseException):
    """Stands for the process dying at that point."""


def _kill_at(monkeypatch: pytest.MonkeyPatch, target: object, name: str) -> None:
    def die(*args: object) -> None:
        raise Killed

    monkeypatch.setattr(target, name, die)


@pytest.mark.parametrize("step", ["write", "sync", "rename", "dirsync"])
def test_a_crash_at_any_step_of_a_compaction_leaves_a_whole_journal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    path = tmp_path / "state.journal"
    journal = StateJournal(path, compact_min_bytes=10**9)
    model = _churn(journal, 100)
    journal.put("s", "buffered", 1)  # a compaction writes what is buffered too
    model["buffered"] = 1
    if step == "write":
        _kill_at(monkeypatch, files, "pwrite")
    elif step == "sync":
        _kill_at(monkeypatch, files.TermFile, "sync")
    elif step == "rename":
        _kill_at(monkeypatch, _journal, "_replace")
    else:
        _kill_at(monkeypatch, _journal, "fsync_dir")
    # A dead process cleans nothing up.
    monkeypatch.setattr(Path, "unlink", lambda self, missing_ok=False: None)
    with pytest.raises(Killed):
        journal.compact()
    monkeypatch.undo()
    if step in ("write", "sync", "rename"):
        assert (tmp_path / "state.journal.compact").exists()
    again = reopen(journal, crash=True)
    expected = dict(model)
    if step != "dirsync":
        del expected["buffered"]  # never written: the old file is the journal still
    assert dict(again.items("s")) == expected
    assert again.recovered_cut_bytes == 0
    assert not (tmp_path / "state.journal.compact").exists()
    again.close()


# ---------------------------------------------------------------- a full disk


def _full_disk(monkeypatch: pytest.MonkeyPatch, after_bytes: int = 0) -> Callable[[], None]:
    """Make writes fail with ENOSPC after ``after_bytes`` more bytes; returns
    a function that makes room again."""
    real = files.pwrite
    room = [after_bytes]
    full = [True]

    def pwrite(fd: int, data: memoryview, offset: int) -> int:
        if full[0]:
            if room[0] <= 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            data = data[: room[0]]
            room[0] -= len(data)
        return real(fd, data, offset)

    monkeypatch.setattr(files, "pwrite", pwrite)
    return lambda: full.__setitem__(0, False)


@pytest.mark.parametrize("after_bytes", [0, 30])
def test_a_full_disk_raises_disk_full_and_the_journal_stays_usable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, after_bytes: int
) -> None:
    path = tmp_path / "state.journal"
    journal = StateJournal(path)
    journal.put("s", "a", 1)
    journal.write()
    size = path.stat().st_size
    room = _full_disk(monkeypatch, after_bytes)
    journal.put("s", "b", b"y" * 100)
    with pytest.raises(DiskFull) as caught:
        journal.write()
    assert caught.value.errno == errno.ENOSPC and "state.journal" in str(caught.value)
    assert path.stat().st_size == size  # a partial write is cut back
    assert bool(journal.pending) and journal.get("s", "b") == b"y" * 100
    with pytest.raises(DiskFull):
        journal.flush()
    room()
    journal.put("s", "c", 3)
    journal.write()
    assert not bool(journal.pending)
    again = reopen(journal, crash=True)
    assert again.items("s") == [("a", 1), ("b", b"y" * 100), ("c", 3)]
    again.close()


def test_a_compaction_the_disk_has_no_room_for_is_put_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "state.journal"
    journal = StateJournal(path, compact_min_bytes=2000)
    model = _churn(journal, 10)
    assert journal.compactions == 0
    room = _full_disk(monkeypatch, after_bytes=10**9)
    real_sync = files.TermFile.sync

    def sync(self: files.TermFile) -> None:
        if self.path.name.endswith(".compact"):
            raise files.write_error(OSError(errno.ENOSPC, "full"), f"syncing {self.path}")
        real_sync(self)

    monkeypatch.setattr(files.TermFile, "sync", sync)
    model.update(_churn(journal, 100))  # no error: the writes themselves worked
    assert journal.compactions == 0
    assert not (tmp_path / "state.journal.compact").exists()
    room()
    monkeypatch.setattr(files.TermFile, "sync", real_sync)
    model.update(_churn(journal, 300))
    assert journal.compactions > 0
    again = reopen(journal, crash=True)
    assert dict(again.items("s")) == dict(journal.items("s"))
    again.close()


# ---------------------------------------------------------------- the store


def test_the_store_opens_the_journal_beside_the_topics_and_closes_it(tmp_path: Path) -> None:
    store = LogStore(tmp_path)
    journal = store.journal
    assert store.journal is journal
    assert journal.path == tmp_path / "state.journal"
    # A topic of the same name is a directory under topics/, not a clash.
    store.topic("state.journal")
    assert (tmp_path / "topics" / "state%2Ejournal").is_dir()
    journal.put("cursors", "c", 5)
    store.close()
    with pytest.raises(LogClosed):
        store.journal  # noqa: B018
    with LogStore(tmp_path) as again:
        assert again.journal.get("cursors", "c") == 5
        assert again.stored_topics() == ["state.journal"]
