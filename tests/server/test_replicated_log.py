"""The replicated engine's own promises (``storage/_replicated.py``,
``storage/_replication.py``, ``broker/log/_runs.py``): runs encoded once and
checked when read back, a run sent again is stored once, a writer that lost
its stream is fenced, and whatever the failures, a restore gives back
exactly the records the stream acknowledged."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from broker.log import LogConfig, LogError, LogStore, RunDamaged, TopicLog, decode_run, encode_run
from broker.server.storage._replicated import RUN_RECORDS, ReplicatedLog, WriterFenced
from broker.server.storage._replication import StreamFenced, StreamUnavailable, restore_log

from ..hypothesis_profiles import examples
from .run_streams import MemoryStream

CONFIG = LogConfig(term_bytes=4096)


def _cache(directory: Path, first_offset: int = 1) -> TopicLog:
    return LogStore(directory, CONFIG).topic("t", CONFIG, 0, first_offset=first_offset)


def test_a_run_reads_back_as_encoded() -> None:
    tails = [b"a", b"", b"ccc" * 100]
    body = encode_run(7, tails, [10, 10, 12])
    run = decode_run(body, 7, 3)
    assert [bytes(t) for t in run.tails] == tails
    assert run.times == [10, 10, 12]
    assert run.next_offset == 10


@pytest.mark.parametrize("flip", [0, 5, 30, -1])
def test_a_damaged_run_is_refused(flip: int) -> None:
    body = bytearray(encode_run(1, [b"hello", b"world"], [1, 2]))
    body[flip] ^= 0x40
    with pytest.raises(RunDamaged):
        decode_run(bytes(body), 1, 2)
    with pytest.raises(RunDamaged):  # (fewer records than the headers say)
        decode_run(encode_run(1, [b"x"], [1]), 1, 2)


def test_runs_hold_at_most_64_records_and_follow_each_other(tmp_path: Path) -> None:
    log = ReplicatedLog(_cache(tmp_path / "c"), writer="w")
    log.append_many([b"r%d" % i for i in range(150)], 1000)
    runs = log.runs_to_send(10)
    assert [(r.first_offset, r.count) for r in runs] == [(1, 64), (65, 64), (129, 22)]
    assert [r.expected_last_seq for r in runs] == [0, 1, 2]
    assert len({r.msg_id for r in runs}) == 3
    assert log.written_offset == 0  # (nothing is written before the stream has it)
    log.stored(runs[0], 1)
    assert log.written_offset == log.durable_offset == 64
    with pytest.raises(ValueError):
        log.stored(runs[2], 3)  # (out of order)
    assert RUN_RECORDS == 64


async def test_a_run_sent_again_is_stored_once(tmp_path: Path) -> None:
    stream = MemoryStream(failures=["after", "before"])
    log = ReplicatedLog(_cache(tmp_path / "c"), writer="w")
    log.append_many([b"a", b"b"], 1000)
    (run,) = log.runs_to_send(1)
    with pytest.raises(StreamUnavailable):
        await stream.publish(run)  # stored, the answer lost
    log.append_many([b"c"], 1000)
    assert log.runs_to_send(1) == []  # (one in flight at a time)
    (again,) = log.resend()
    assert again is run
    with pytest.raises(StreamUnavailable):
        await stream.publish(again)
    log.stored(run, await stream.publish(log.resend()[0]))
    (second,) = log.runs_to_send(1)
    log.stored(second, await stream.publish(second))
    assert [(m.seq, m.first_offset, m.count) for m in stream.messages] == [(1, 1, 2), (2, 3, 1)]
    assert log.written_offset == 3


async def test_a_writer_that_lost_the_stream_is_fenced(tmp_path: Path) -> None:
    stream = MemoryStream()
    log = ReplicatedLog(_cache(tmp_path / "c"), writer="w1")
    log.append_many([b"a"], 1000)
    (run,) = log.runs_to_send(1)
    log.stored(run, await stream.publish(run))
    # Another front end took the topic over and wrote to it.
    stream.append_foreign(2, 1, encode_run(2, [b"theirs"], [2000]))
    log.append_many([b"mine"], 3000)
    (mine,) = log.runs_to_send(1)
    with pytest.raises(StreamFenced):
        await stream.publish(mine)
    log.fence("wrong last sequence")
    with pytest.raises(WriterFenced, match="another front end"):
        log.append_many([b"more"], 4000)
    assert log.runs_to_send(1) == []
    assert log.written_offset == 1  # ("mine" was never stored, never delivered)


async def test_a_damaged_message_stops_the_restore(tmp_path: Path) -> None:
    stream = MemoryStream()
    stream.append_foreign(1, 2, encode_run(1, [b"a", b"b"], [1, 1]))
    body = bytearray(encode_run(3, [b"c"], [2]))
    body[-1] ^= 1
    stream.append_foreign(3, 1, bytes(body))
    opened: list[TopicLog] = []

    def cache(first: int) -> TopicLog:
        opened.append(_cache(tmp_path / "c", first))
        return opened[-1]

    with pytest.raises(RunDamaged, match="offsets 3-3"):
        await restore_log(stream, cache, "w")
    assert opened[0].closed


async def test_a_restore_refuses_a_hole_between_messages(tmp_path: Path) -> None:
    stream = MemoryStream()
    stream.append_foreign(1, 1, encode_run(1, [b"a"], [1]))
    stream.append_foreign(5, 1, encode_run(5, [b"e"], [1]))
    with pytest.raises(LogError, match="offset 5 where 2 was expected"):
        await restore_log(stream, lambda first: _cache(tmp_path / "c", first), "w")


# ---------------------------------------------------------------- a state machine


class Replication(RuleBasedStateMachine):
    """Appends, sends with failures before and after storing, purges and
    restarts in any order: the records a restore gives back are exactly
    those the stream acknowledged (in order, once, with their times), and
    nothing acknowledged is ever missing."""

    def __init__(self) -> None:
        super().__init__()
        self.base = Path(_TMP.mktemp("replication"))
        self.stream = MemoryStream()
        self.opened = 0
        self.stores: list[LogStore] = []
        self.log = ReplicatedLog(self._cache(1), writer="w0")
        self.model: dict[int, tuple[bytes, int]] = {}  # offset -> (record, time), appended
        self.acked = 0  # the last offset acknowledged
        self.first = 1  # the first offset kept
        self.now = 1000

    def _cache(self, first: int) -> TopicLog:
        self.opened += 1
        store = LogStore(self.base / f"c{self.opened}", CONFIG)
        self.stores.append(store)
        return store.topic("t", CONFIG, 0, first_offset=first)

    @rule(count=st.integers(1, 70), step=st.integers(0, 3))
    def append(self, count: int, step: int) -> None:
        self.now += step
        first = self.log.next_offset
        records = [b"%d" % (first + i) for i in range(count)]
        assert self.log.append_many(records, self.now) == count
        for i, record in enumerate(records):
            self.model[first + i] = (record, self.now)

    @rule(failures=st.lists(st.sampled_from(["before", "after"]), max_size=3))
    def send(self, failures: list[str]) -> None:
        self.stream.failures = list(failures)
        runs = self.log.runs_to_send(3)
        while runs:
            try:
                for run in list(runs):
                    self.log.stored(run, self.stream.publish_now(run))
                    runs.remove(run)
            except StreamUnavailable:
                runs = self.log.resend()
                continue
            runs = self.log.runs_to_send(3)
        if seq := self.log.take_purge():
            self.stream.purge_now(seq)
        self.acked = self.log.written_offset

    @precondition(lambda self: self.acked >= self.first)
    @rule(data=st.data())
    def purge(self, data: st.DataObject) -> None:
        target = data.draw(st.integers(self.first, self.acked + 1))
        self.log.purge_before(target)
        self.first = max(self.first, target)

    @rule()
    def restart(self) -> None:
        self.send([])  # (what a restart loses unsent is never acknowledged: not modelled)
        self.log.close()
        self.log = trio.run(restore_log, self.stream, self._cache, f"w{self.opened}")
        for offset in list(self.model):
            if offset > self.acked:
                del self.model[offset]

    @invariant()
    def holds_what_was_acknowledged(self) -> None:
        log = self.log
        assert log.written_offset == self.acked
        assert log.first_offset == self.first
        offset = self.first
        while run := log.read(offset, 10_000, 1 << 30).tails:
            got = [bytes(t) for t in run]
            wanted = range(offset, offset + len(got))
            assert got == [self.model[o][0] for o in wanted]
            assert log.times(offset, len(got)) == [self.model[o][1] for o in wanted]
            offset += len(got)
        assert offset == log.next_offset == max(self.model, default=0) + 1 or not self.model

    def teardown(self) -> None:
        self.log.close()
        for store in self.stores:
            store.close()


_TMP: pytest.TempPathFactory


@pytest.fixture(autouse=True)
def _tmp(tmp_path_factory: pytest.TempPathFactory) -> None:
    global _TMP
    _TMP = tmp_path_factory


Replication.TestCase.settings = settings(
    max_examples=examples(40, 10), stateful_step_count=30, deadline=None
)
TestReplication = Replication.TestCase


async def test_runs_carry_whose_publishes_they_are_and_a_restore_says_so(
    tmp_path: Path,
) -> None:
    stream = MemoryStream()
    log = ReplicatedLog(_cache(tmp_path / "c"), writer="w", run_records=4)
    # Session A's publishes 1-3 then B's 10-12, one batch; then A's 4-6.
    log.note_origins(1, [(b"A", 1, 1, 3), (b"B", 2, 10, 3)])
    log.append_many([b"a1", b"a2", b"a3", b"b10", b"b11", b"b12"], 1000)
    log.note_origins(7, [(b"A", 1, 4, 3), (b"", 0, 1, 0)])
    log.append_many([b"a4", b"a5", b"a6"], 1000)
    runs = log.runs_to_send(10)
    assert [r.origins for r in runs] == [
        [(b"A", 1, 1, 3), (b"B", 2, 10, 1)],
        [(b"B", 2, 11, 2), (b"A", 1, 4, 2)],
        [(b"A", 1, 6, 1)],
    ]
    # The first two are stored; the front end dies before the third is.
    for run in runs[:2]:
        log.stored(run, await stream.publish(run))
    log.close()
    restored = await restore_log(stream, lambda first: _cache(tmp_path / "r", first), "w2")
    assert restored.held == {(b"A", 1): 5, (b"B", 2): 12}
    restored.close()


def test_origins_read_back_from_their_header() -> None:
    from broker.server.storage._jetstream import decode_origins, encode_origins

    origins = [(b"\x01\xff", 3, 1, 64), (b"s", 0, 7, 1)]
    assert decode_origins(encode_origins(origins)) == origins
    # Malformed parts are left out (the session's own count then stands).
    assert decode_origins("zz:1:1:1;01:x:1:1;01:1:0:1;;01:1:1") == []
    assert decode_origins(None) == []
