"""The storage seam holds (``broker/server/storage/_store.py``).

Topics and pattern subscriptions talk to a topic's storage only through
``TopicStore`` and ``StoreReader``: no module of theirs names the local
log's ``TopicLog`` or ``Reader`` (read with ``ast``: nothing is imported).

The conformance tests are written against ``TopicStore`` alone and take the
engine from the ``store`` fixture, so that another storage engine is
checked by adding it to ``ENGINES``.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from broker.log import LogConfig, TopicLog
from broker.server.storage._store import Run, Start, TopicStore

ROOT = Path(__file__).resolve().parents[2]
#: The packages above the seam: they may not name the local engine's types.
ABOVE_THE_SEAM = ("broker/server/topics", "broker/server/patterns")
#: The local engine's types.
ENGINE_NAMES = {"TopicLog", "Reader"}


def _engine_names(path: Path) -> list[str]:
    """Where the module at ``path`` names the local log's types: imported
    from anywhere, ``broker.log._log`` imported, or used as attributes."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            found += [
                f"line {node.lineno}: from {module} import {alias.name}"
                for alias in node.names
                if alias.name in ENGINE_NAMES or module.endswith("log._log")
            ]
        elif isinstance(node, ast.Import):
            found += [
                f"line {node.lineno}: import {alias.name}"
                for alias in node.names
                if alias.name.endswith("log._log")
            ]
        elif isinstance(node, ast.Attribute) and node.attr in ENGINE_NAMES:
            found.append(f"line {node.lineno}: .{node.attr}")
    return found


def _modules_above_the_seam() -> list[Path]:
    return sorted(path for package in ABOVE_THE_SEAM for path in (ROOT / package).rglob("*.py"))


def test_topics_and_patterns_name_no_local_log_type() -> None:
    modules = _modules_above_the_seam()
    assert len(modules) >= 8  # (the packages were found)
    crossing = {
        str(path.relative_to(ROOT)): names for path in modules if (names := _engine_names(path))
    }
    assert crossing == {}


def test_the_seam_check_sees_a_crossing(tmp_path: Path) -> None:
    """The check finds each way of naming the engine's types."""
    module = tmp_path / "crossing.py"
    for source in (
        "from broker.log import TopicLog\n",
        "from broker.log import LogError, Reader\n",
        "from broker.log._log import READ_BYTES\n",
        "import broker.log._log\n",
        "import broker.log\nx: broker.log.TopicLog\n",
    ):
        module.write_text(source)
        assert _engine_names(module), source
    module.write_text("from broker.log import LogError, Start\nclass TailReader: ...\n")
    assert _engine_names(module) == []


# ---------------------------------------------------------------- conformance


def _local(directory: Path) -> Iterator[TopicStore]:
    # Small terms: reads and purges cross term boundaries.
    topic_log = TopicLog.open(directory, "t", LogConfig(term_bytes=256), now_ms=0)
    try:
        yield topic_log
    finally:
        topic_log.close()


#: Each storage engine, as a context that opens an empty store in a directory.
ENGINES: dict[str, Callable[[Path], Iterator[TopicStore]]] = {"local": _local}


@pytest.fixture(params=sorted(ENGINES))
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TopicStore]:
    yield from ENGINES[request.param](tmp_path / "store")


def _read_all(store: TopicStore, offset: int) -> tuple[int, int, list[bytes]]:
    """``(gap, first offset, records)`` of everything readable from
    ``offset`` on (a read may stop at any boundary the store has)."""
    gap = 0
    first: int | None = None
    records: list[bytes] = []
    while True:
        run: Run = store.read(offset, 1000, 1 << 20)
        if run.gap:
            assert first is None, "a gap after the first record"
            gap += run.gap
        if not run.tails:
            return gap, first if first is not None else run.first_offset, records
        if first is None:
            first = run.first_offset
        assert run.first_offset == offset + run.gap
        records += [bytes(tail) for tail in run.tails]
        offset = run.first_offset + len(run.tails)


def _invariants(store: TopicStore) -> None:
    assert store.durable_offset <= store.written_offset <= store.next_offset - 1
    assert store.first_offset <= store.next_offset


def test_an_empty_store_starts_at_one(store: TopicStore) -> None:
    assert (store.first_offset, store.next_offset) == (1, 1)
    assert (store.written_offset, store.durable_offset) == (0, 0)
    assert not store.closed
    assert store.read(1, 10, 1 << 20).tails == []
    assert store.reader(Start.earliest(), register=False).position == 1
    assert store.reader(Start.latest(), register=False).position == 1


def test_appended_records_read_back_at_consecutive_offsets(store: TopicStore) -> None:
    records = [b"record %d" % i for i in range(1, 21)]
    assert store.append_many(records[:12], 1000) == 12
    assert store.next_offset == 13
    _invariants(store)
    assert store.append_many(records[12:], 2000) == 8
    assert store.next_offset == 21
    # Readable as soon as appended, written or not.
    assert _read_all(store, 1) == (0, 1, records)
    assert _read_all(store, 7) == (0, 7, records[6:])
    assert _read_all(store, 21) == (0, 21, [])
    run = store.read(5, 2, 1 << 20)
    assert run.first_offset == 5
    assert [bytes(tail) for tail in run.tails] == records[4 : 4 + len(run.tails)]
    assert 1 <= len(run.tails) <= 2
    store.write()
    assert store.written_offset == 20
    _invariants(store)


def test_receive_times_never_decrease(store: TopicStore) -> None:
    store.append_many([b"a", b"b"], 5000)
    store.append_many([b"c"], 4000)  # a clock that stepped back
    store.append_many([b"d"], 6000)
    assert store.times(1, 4) == [5000, 5000, 5000, 6000]
    assert store.times(3, 1) == [5000]


def test_readers_start_where_asked(store: TopicStore) -> None:
    store.append_many([b"x%d" % i for i in range(1, 6)], 1000)
    store.append_many([b"y%d" % i for i in range(6, 11)], 3000)
    store.write()

    def position(start: Start) -> int:
        return store.reader(start, register=False).position

    assert position(Start.earliest()) == 1
    assert position(Start.latest()) == 11
    assert position(Start.at(4)) == 4
    assert position(Start.last(3)) == 8
    assert position(Start.last(100)) == 1
    assert position(Start.from_time(2000)) == 6
    assert position(Start.from_time(9000)) == 11


def test_a_reader_moves_forward_only(store: TopicStore) -> None:
    store.append_many([b"a", b"b", b"c"], 1000)
    reader = store.reader(Start.at(2), register=True)
    assert reader.position == 2
    reader.advance_to(4)  # (the next offset: all read)
    assert reader.position == 4
    with pytest.raises(ValueError):
        reader.advance_to(3)
    with pytest.raises(ValueError):
        reader.advance_to(5)
    reader.close()
    reader.close()


def test_a_purge_leaves_a_gap_and_offsets_go_on(store: TopicStore) -> None:
    records = [b"record %d" % i for i in range(1, 16)]
    store.append_many(records, 1000)
    store.write()
    assert store.purge_before(9) == 8
    assert store.first_offset == 9
    assert _read_all(store, 1) == (8, 9, records[8:])
    assert store.reader(Start.earliest(), register=False).position == 9
    assert store.purge_before(5) == 0  # (below the first offset: nothing)
    # Offsets are never given again.
    assert store.append_many([b"after"], 2000) == 1
    assert store.next_offset == 17
    assert _read_all(store, 16)[2] == [b"after"]
    _invariants(store)
