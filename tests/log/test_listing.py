"""Listing the stored topics without opening their logs: what recovery would
find after a clean close, read only, beside a writer, and for many topics."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import trio

from broker.log import LogConfig, LogStore, StoredTopic, list_stored_topics
from broker.log import _listing as listing
from broker.log._files import topic_dir_name
from tests.log.helpers import T0, body

CONFIG = LogConfig(term_bytes=512)
#: The files a topic's ``bytes`` counts.
COUNTED = (".term", ".index", "checkpoint", "gaps.json", "start")


def _on_disk(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.iterdir() if p.name.endswith(COUNTED))


def _expected(store: LogStore, name: str) -> StoredTopic:
    """What opening the log finds (the store was closed cleanly before)."""
    log = store.topic(name)
    directory = log.directory
    terms = sorted(directory.glob("*.term"))
    newest = terms[-1].stat().st_mtime_ns // 1_000_000 if terms else None
    found = StoredTopic(
        name, log.first_offset, log.next_offset, _on_disk(directory), len(terms), newest
    )
    assert log.recovery.clean
    return found


def test_the_listing_is_what_opening_finds_after_a_clean_close(tmp_path: Path) -> None:
    counts = {"orders": 100, "a/b": 3, "é": 1, "x" * 255: 40, "empty": 0, "purged": 60}
    with LogStore(tmp_path, CONFIG) as store:
        for name, count in counts.items():
            log = store.topic(name)
            for i in range(1, count + 1):
                log.append(body(i, 30), T0 + i)
        store.topic("purged").purge_before(37)
    with LogStore(tmp_path, CONFIG) as store:
        listed = store.list_topics()
        assert listed == list_stored_topics(tmp_path)
        assert [topic.name for topic in listed] == sorted(counts)
        assert listed == [_expected(store, name) for name in sorted(counts)]
    by_name = {topic.name: topic for topic in listed}
    assert (by_name["orders"].first, by_name["orders"].end) == (1, 101)
    assert by_name["orders"].terms > 3 and by_name["orders"].last_append_ms is not None
    assert (by_name["empty"].first, by_name["empty"].end, by_name["empty"].terms) == (1, 1, 1)
    assert (by_name["purged"].first, by_name["purged"].end) == (37, 61)


def test_match_is_asked_before_a_topic_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = ["keep.1", "keep.2", "skip.1", "skip.2", "k" * 255]
    with LogStore(tmp_path, CONFIG) as store:
        for name in names:
            store.topic(name).append(b"x", T0)
    read: list[str] = []
    real = listing._read_topic

    def counting(path: str, *args: object) -> StoredTopic | None:
        read.append(Path(path).name)
        return real(path, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(listing, "_read_topic", counting)
    found = list_stored_topics(tmp_path, lambda name: name.startswith("k"))
    assert [topic.name for topic in found] == ["keep.1", "keep.2", "k" * 255]
    # Only the shortened name had to be read (its meta.json) to be matched.
    long_dir = topic_dir_name("k" * 255)
    assert "~" in long_dir
    assert sorted(read) == sorted([long_dir, topic_dir_name("keep.1"), topic_dir_name("keep.2")])
    assert list_stored_topics(tmp_path, lambda name: False) == []


def test_what_is_not_a_topic_is_left_out(tmp_path: Path) -> None:
    names = ["orders", "a/b", "x" * 255]
    with LogStore(tmp_path, CONFIG) as store:
        for name in names:
            store.topic(name).append(b"x", T0)
    topics = tmp_path / "topics"
    (topics / topic_dir_name("a/b") / "meta.json").unlink()  # kept: its name and terms
    (topics / topic_dir_name("x" * 255) / "meta.json").unlink()  # shortened: no name left
    (topics / "empty").mkdir()  # no metadata, no term
    (topics / ".hidden").mkdir()
    (topics / ".hidden" / "meta.json").write_text(json.dumps({"format": 1, "topic": "h"}))
    (topics / "file").write_bytes(b"")
    (topics / "not%2.valid").mkdir()
    (topics / "not%2.valid" / f"{1:020d}.term").write_bytes(b"")
    assert [topic.name for topic in list_stored_topics(tmp_path)] == ["a/b", "orders"]
    assert list_stored_topics(tmp_path / "nowhere") == []


def test_a_topic_without_a_term_file_ends_at_its_checkpoint(tmp_path: Path) -> None:
    with LogStore(tmp_path, CONFIG) as store:
        log = store.topic("t")
        for i in range(1, 8):
            log.append(body(i), T0)
    directory = tmp_path / "topics" / "t"
    for term in directory.glob("*.term"):
        term.unlink()
    (found,) = list_stored_topics(tmp_path)
    assert (found.first, found.end, found.terms, found.last_append_ms) == (8, 8, 0, None)
    with LogStore(tmp_path, CONFIG) as store:
        assert (store.topic("t").first_offset, store.topic("t").next_offset) == (8, 8)


def test_listing_beside_a_writer_never_fails(tmp_path: Path) -> None:
    """Appends, rotation, retention, purges and a delete while another
    thread lists: every listing is consistent as of some moment."""
    config = LogConfig(term_bytes=512, retain_bytes=2048, flush="always")
    errors: list[BaseException] = []
    seen: list[list[StoredTopic]] = []
    done = threading.Event()

    def lister() -> None:
        try:
            while not done.is_set():
                seen.append(list_stored_topics(tmp_path))
        except BaseException as exc:
            errors.append(exc)

    with LogStore(tmp_path, config) as store:
        store.topic("gone").append(b"x", T0)
        thread = threading.Thread(target=lister)
        thread.start()
        try:
            for i in range(1, 600):
                store.topic(f"t{i % 3}").append(body(i, 40), T0 + i)
                if i % 97 == 0:
                    log = store.topic("t0")
                    log.purge_before(log.next_offset - 5)
                if i == 300:
                    store.delete_topic("gone")
        finally:
            done.set()
            thread.join(timeout=60)
        assert not thread.is_alive()
        final = {topic.name: topic for topic in list_stored_topics(tmp_path)}
        for name in ("t0", "t1", "t2"):
            log = store.topic(name)
            assert (final[name].first, final[name].end) == (log.first_offset, log.next_offset)
    assert errors == []
    assert seen
    for listed in seen:
        assert all(topic.first <= topic.end for topic in listed)
    assert "gone" not in final


def _make_topics(data_dir: Path, count: int) -> None:
    """``count`` topics of 5 records in one term each, made by copying one
    real log's files (opening thousands of logs would take long)."""
    with LogStore(data_dir, LogConfig(term_bytes=4096)) as store:
        log = store.topic("template")
        for i in range(1, 6):
            log.append(body(i, 50), T0 + i)
    template = data_dir / "topics" / "template"
    files = {p.name: p.read_bytes() for p in template.iterdir() if p.name != "meta.json"}
    for number in range(count):
        name = f"topic.{number:05d}"
        directory = data_dir / "topics" / topic_dir_name(name)
        directory.mkdir()
        meta = {"format": 1, "topic": name, "created_ms": T0}
        (directory / "meta.json").write_text(json.dumps(meta))
        for file_name, data in files.items():
            (directory / file_name).write_bytes(data)
    for path in template.iterdir():
        path.unlink()
    template.rmdir()


def test_two_thousand_topics_are_listed_right(tmp_path: Path) -> None:
    """The shape of the benchmark (10,000 topics of one small term each: see
    docs/topic-log.md); here its results are checked, not its speed."""
    _make_topics(tmp_path, 2000)
    listed = list_stored_topics(tmp_path)
    assert [topic.name for topic in listed] == [f"topic.{n:05d}" for n in range(2000)]
    sizes = {topic.bytes for topic in listed}
    assert len(sizes) == 1 and sizes.pop() > 5 * (24 + 50)
    assert {(topic.first, topic.end, topic.terms) for topic in listed} == {(1, 6, 1)}
    assert all(topic.last_append_ms is not None for topic in listed)
    with LogStore(tmp_path, LogConfig(term_bytes=4096)) as store:
        for topic in listed[::400]:
            assert _expected(store, topic.name) == topic
    assert len(list_stored_topics(tmp_path, lambda name: name.endswith("7"))) == 200


async def test_a_listing_runs_in_a_worker_thread(tmp_path: Path) -> None:
    with LogStore(tmp_path, CONFIG) as store:
        store.topic("a").append(b"x", T0)
        store.topic("b").flush()
        listed = await trio.to_thread.run_sync(store.list_topics)
        assert [(t.name, t.first, t.end) for t in listed] == [("a", 1, 1), ("b", 1, 1)]
        store.topic("a").flush()
        listed = await trio.to_thread.run_sync(store.list_topics, lambda name: name == "a")
        assert [(t.name, t.first, t.end) for t in listed] == [("a", 1, 2)]
