"""The storage seam holds (``broker/server/storage/_store.py``).

Topics and pattern subscriptions talk to a topic's storage only through
``TopicStore`` and ``StoreReader``: no module of theirs names the local
log's ``TopicLog`` or ``Reader`` (read with ``ast``: nothing is imported).

The conformance tests are written against ``TopicStore`` alone and take the
engine from the ``engine`` fixture: the local topic log, and the replicated
engine (a local cache whose records count once a stream holds them) over an
in-memory stream with JetStream's write rules (``run_streams``) and over a
real JetStream stream (a ``nats-server`` for the module); another storage
engine is checked by adding it to ``ENGINES``.
"""

from __future__ import annotations

import ast
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Protocol

import pytest

from broker.log import LogConfig, LogStore, TopicLog
from broker.nats import JetStream, open_nats
from broker.server.storage._jetstream import JetStreamRuns
from broker.server.storage._replicated import ReplicatedLog
from broker.server.storage._replication import RunStream, restore_log
from broker.server.storage._store import Run, Start, TopicStore

from .run_streams import MemoryStream

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


class Engine(Protocol):
    """A storage engine under test: its store of one topic, how to make what
    was appended written, and how to open it again as after a restart."""

    store: TopicStore

    async def settle(self) -> None:
        """Every record appended is written (and durable) when this returns."""
        ...

    async def reopen(self) -> TopicStore:
        """Close the store and open it again, as a restarted broker would."""
        ...


#: Small terms: reads and purges cross term boundaries.
CONFIG = LogConfig(term_bytes=256)


class LocalEngine:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.store: TopicStore = TopicLog.open(directory, "t", CONFIG, now_ms=0)

    async def settle(self) -> None:
        self.store.write()

    async def reopen(self) -> TopicStore:
        assert isinstance(self.store, TopicLog)
        self.store.close()
        self.store = TopicLog.open(self.directory, "t", CONFIG, now_ms=0)
        return self.store


class ReplicatedEngine:
    """The replicated engine over ``stream``; a restart restores a new cache
    (in a new directory: a front end keeps no data) from it."""

    def __init__(self, directory: Path, stream: RunStream) -> None:
        self.directory = directory
        self.stream = stream
        self.opened = 0
        self.stores: list[LogStore] = []
        self.store: TopicStore = self._empty()

    def _cache(self, first_offset: int) -> TopicLog:
        self.opened += 1
        store = LogStore(self.directory / f"cache-{self.opened}", CONFIG)
        self.stores.append(store)
        return store.topic("t", CONFIG, 0, first_offset=first_offset)

    def _empty(self) -> ReplicatedLog:
        return ReplicatedLog(self._cache(1), writer="w1")

    async def settle(self) -> None:
        replicated = self.store
        assert isinstance(replicated, ReplicatedLog)
        replicated.write()
        while runs := replicated.runs_to_send(4):
            for run in runs:
                replicated.stored(run, await self.stream.publish(run))
        assert replicated.written_offset == replicated.next_offset - 1
        if seq := replicated.take_purge():
            await self.stream.purge_below(seq)

    async def reopen(self) -> TopicStore:
        assert isinstance(self.store, ReplicatedLog)
        self.store.close()
        self.store = await restore_log(self.stream, self._cache, f"w{self.opened + 1}")
        return self.store

    def close(self) -> None:
        if not self.store.closed:
            assert isinstance(self.store, ReplicatedLog)
            self.store.close()
        for store in self.stores:
            store.close()


@asynccontextmanager
async def _local(request: pytest.FixtureRequest, directory: Path) -> AsyncIterator[Engine]:
    engine = LocalEngine(directory)
    try:
        yield engine
    finally:
        assert isinstance(engine.store, TopicLog)
        engine.store.close()


@asynccontextmanager
async def _replicated(request: pytest.FixtureRequest, directory: Path) -> AsyncIterator[Engine]:
    engine = ReplicatedEngine(directory, MemoryStream())
    try:
        yield engine
    finally:
        engine.close()


@asynccontextmanager
async def _jetstream(request: pytest.FixtureRequest, directory: Path) -> AsyncIterator[Engine]:
    """The replicated engine over a real JetStream stream (one
    ``nats-server`` for the module; a topic of its own per test)."""
    url: str = request.getfixturevalue("nats_url")
    async with open_nats(url, name="conformance") as client:
        runs = JetStreamRuns(JetStream(client), replicas=1)
        stream = await runs.open_stream(f"conformance.{request.node.name}")
        engine = ReplicatedEngine(directory, stream)
        try:
            yield engine
        finally:
            engine.close()


#: Each storage engine, as a context that opens an empty store in a directory.
ENGINES: dict[str, Callable[[pytest.FixtureRequest, Path], AbstractAsyncContextManager[Engine]]] = {
    "local": _local,
    "replicated": _replicated,
    "jetstream": _jetstream,
}


@pytest.fixture(params=sorted(ENGINES))
async def engine(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Engine]:
    async with ENGINES[request.param](request, tmp_path / "store") as opened:
        yield opened


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


async def test_an_empty_store_starts_at_one(engine: Engine) -> None:
    store = engine.store
    assert (store.first_offset, store.next_offset) == (1, 1)
    assert (store.written_offset, store.durable_offset) == (0, 0)
    assert not store.closed
    assert store.read(1, 10, 1 << 20).tails == []
    assert store.reader(Start.earliest(), register=False).position == 1
    assert store.reader(Start.latest(), register=False).position == 1


async def test_appended_records_read_back_at_consecutive_offsets(engine: Engine) -> None:
    store = engine.store
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
    await engine.settle()
    assert store.written_offset == 20
    _invariants(store)


async def test_receive_times_never_decrease(engine: Engine) -> None:
    store = engine.store
    store.append_many([b"a", b"b"], 5000)
    store.append_many([b"c"], 4000)  # a clock that stepped back
    store.append_many([b"d"], 6000)
    assert store.times(1, 4) == [5000, 5000, 5000, 6000]
    assert store.times(3, 1) == [5000]


async def test_readers_start_where_asked(engine: Engine) -> None:
    store = engine.store
    store.append_many([b"x%d" % i for i in range(1, 6)], 1000)
    store.append_many([b"y%d" % i for i in range(6, 11)], 3000)
    await engine.settle()

    def position(start: Start) -> int:
        return store.reader(start, register=False).position

    assert position(Start.earliest()) == 1
    assert position(Start.latest()) == 11
    assert position(Start.at(4)) == 4
    assert position(Start.last(3)) == 8
    assert position(Start.last(100)) == 1
    assert position(Start.from_time(2000)) == 6
    assert position(Start.from_time(9000)) == 11


async def test_a_reader_moves_forward_only(engine: Engine) -> None:
    store = engine.store
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


async def test_a_purge_leaves_a_gap_and_offsets_go_on(engine: Engine) -> None:
    store = engine.store
    records = [b"record %d" % i for i in range(1, 16)]
    store.append_many(records, 1000)
    await engine.settle()
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


async def test_a_restart_keeps_every_written_record_and_its_time(engine: Engine) -> None:
    records = [b"record %d" % i for i in range(1, 31)]
    engine.store.append_many(records[:10], 1000)
    engine.store.append_many(records[10:], 2000)
    await engine.settle()
    store = await engine.reopen()
    assert (store.first_offset, store.next_offset) == (1, 31)
    assert store.written_offset == 30
    assert _read_all(store, 1) == (0, 1, records)
    assert store.times(9, 3) == [1000, 1000, 2000]
    assert store.reader(Start.from_time(1500), register=False).position == 11
    # Offsets go on from where they were.
    assert store.append_many([b"after"], 3000) == 1
    assert store.next_offset == 32
    _invariants(store)


async def test_a_purge_holds_across_a_restart(engine: Engine) -> None:
    records = [b"record %d" % i for i in range(1, 41)]
    engine.store.append_many(records, 1000)
    await engine.settle()
    assert engine.store.purge_before(25) == 24
    await engine.settle()
    store = await engine.reopen()
    assert store.first_offset == 25
    assert _read_all(store, 1) == (24, 25, records[24:])
    store.append_many([b"after"], 2000)
    assert store.next_offset == 42


async def test_a_purge_of_everything_holds_across_a_restart(engine: Engine) -> None:
    engine.store.append_many([b"a", b"b", b"c"], 1000)
    await engine.settle()
    assert engine.store.purge_before(4) == 3
    await engine.settle()
    store = await engine.reopen()
    assert (store.first_offset, store.next_offset) == (4, 4)
    assert _read_all(store, 1) == (3, 4, [])
    store.append_many([b"d"], 2000)
    assert _read_all(store, 1) == (3, 4, [b"d"])


async def test_an_empty_store_reopens_empty(engine: Engine) -> None:
    store = await engine.reopen()
    assert (store.first_offset, store.next_offset, store.written_offset) == (1, 1, 0)
