"""A stateful property test: the log against a plain list of records, through
appends, reads, readers, retention, clean reopens, crashes and torn tails."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from broker.log import HEADER_SIZE, LogConfig, LogFull, Reader, Start, TopicLog
from tests.hypothesis_profiles import examples
from tests.log.helpers import T0

BODIES = st.binary(max_size=60)


class LogMachine(RuleBasedStateMachine):
    """The model: ``records[offset] = (body, time)`` for every retained
    record, ``next`` the next offset; the log may delete oldest records only
    as retention allows, and must serve the rest exactly."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="topic-log-"))
        self.records: dict[int, tuple[bytes, int]] = {}
        self.next = 1
        self.now = T0
        self.readers: list[Reader] = []

    @initialize(
        term_bytes=st.integers(150, 500),
        retain=st.none() | st.integers(300, 1500),
        when_full=st.sampled_from(["block", "drop-oldest"]),
        flush=st.sampled_from(["batch", "always"]),
    )
    def open(self, term_bytes: int, retain: int | None, when_full: str, flush: str) -> None:
        self.config = LogConfig(
            term_bytes=term_bytes,
            retain_bytes=retain,
            retain_seconds=5,
            when_full=when_full,  # type: ignore[arg-type]
            flush=flush,  # type: ignore[arg-type]
            flush_interval_ms=50,
        )
        self.log = TopicLog.open(self.dir, "t", self.config)

    def teardown(self) -> None:
        if hasattr(self, "log"):
            self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # -------------------------------------------------------------- helpers

    def _sync_first(self) -> None:
        """Forget the model's records that retention deleted (checking it may have)."""
        first = self.log.first_offset
        if self.config.when_full == "block":
            positions = [r.position for r in self.readers]
            assert all(p >= first for p in positions) or not any(
                p < first and p in self.records for p in positions
            )
        gone = [o for o in self.records if o < first]
        for offset in gone:
            del self.records[offset]
        if gone:
            event("retention deleted records")

    # -------------------------------------------------------------- rules

    @rule(body=BODIES, dt=st.integers(-20, 200))
    def append(self, body: bytes, dt: int) -> None:
        self.now += dt
        try:
            offset = self.log.append(body, self.now)
        except LogFull:
            assert self.config.when_full == "block" and self.readers
            event("the log was full")
            return
        assert offset == self.next
        last = self.records[self.next - 1][1] if self.next - 1 in self.records else 0
        self.records[offset] = (body, max(self.now, last, self._last_time))
        self._last_time = self.records[offset][1]
        self.next += 1
        self._sync_first()

    _last_time = 0

    @rule(bodies=st.lists(BODIES, max_size=20), dt=st.integers(0, 100))
    def append_many(self, bodies: list[bytes], dt: int) -> None:
        self.now += dt
        try:
            count = self.log.append_many(bodies, self.now)
        except LogFull:
            assert self.config.when_full == "block" and self.readers
            event("the log was full")
            return
        time_ms = max(self.now, self._last_time)
        for body in bodies[:count]:
            self.records[self.next] = (body, time_ms)
            self.next += 1
        if count:
            self._last_time = time_ms
        self._sync_first()

    @rule(
        start=st.sampled_from(["earliest", "latest", "offset", "time"]), value=st.integers(1, 300)
    )
    def add_reader(self, start: str, value: int) -> None:
        if start == "earliest":
            where = Start.earliest()
        elif start == "latest":
            where = Start.latest()
        elif start == "offset":
            where = Start.at(value)
        else:
            where = Start.from_time(T0 + value * 10)
        reader = self.log.reader(where)
        if start == "time":
            later = [o for o, (_, t) in sorted(self.records.items()) if t >= T0 + value * 10]
            assert reader.position == (later[0] if later else self.next)
        self.readers.append(reader)

    @precondition(lambda self: self.readers)
    @rule(data=st.data(), max_records=st.integers(1, 50))
    def read(self, data: st.DataObject, max_records: int) -> None:
        reader = data.draw(st.sampled_from(self.readers))
        position = reader.position
        # The first record there is from its position on (past retention's
        # deletions and records lost to a torn tail: a gap for those).
        first = min((o for o in self.records if o >= position), default=max(position, self.next))
        run = reader.read(max_records)
        assert run.gap == first - position
        if run.gap:
            event("a reader saw a gap")
        assert run.first_offset == first
        assert len(run.tails) <= max_records
        for index, tail in enumerate(run.tails):
            assert bytes(tail) == self.records[run.first_offset + index][0]
        if run.first_offset < self.next:
            assert run.tails  # something to read: a run is never empty
        advance = data.draw(st.integers(0, len(run.tails)))
        if run.tails or run.gap:
            reader.advance_to(run.first_offset + advance)

    @precondition(lambda self: self.readers)
    @rule(data=st.data())
    def close_reader(self, data: st.DataObject) -> None:
        reader = data.draw(st.sampled_from(self.readers))
        reader.close()
        self.readers.remove(reader)

    @rule(dt=st.integers(0, 10_000))
    def expire(self, dt: int) -> None:
        self.now += dt
        self.log.expire(self.now)
        for offset in [o for o in self.records if o < self.log.first_offset]:
            (_, time_ms) = self.records[offset]
            assert time_ms < self.now - 5000
        self._sync_first()

    @rule(dt=st.integers(0, 100))
    def flush_due(self, dt: int) -> None:
        self.now += dt
        self.log.flush_due(self.now)
        assert self.log.written_offset == self.next - 1

    @rule()
    def reopen(self) -> None:
        self.log.close()
        self.readers.clear()
        self.log = TopicLog.open(self.dir, "t", self.config)
        assert self.log.recovery.clean
        assert self.log.next_offset == self.next

    @rule(data=st.data())
    def crash_with_a_torn_tail(self, data: st.DataObject) -> None:
        """The process dies after a write, part of the last term's tail torn off."""
        self.log.write()
        self.log._file.close()  # dies: no flush, no close
        self.readers.clear()
        base = self.log.term_bases()[-1]
        path = self.dir / f"{base:020d}.term"
        size = path.stat().st_size
        cut = data.draw(st.integers(0, size))
        os.truncate(path, size - cut)
        survivors_end = base
        pos = 0
        while survivors_end < self.next:
            pos += HEADER_SIZE + len(self.records[survivors_end][0])
            if pos > size - cut:
                break
            survivors_end += 1
        self.log = TopicLog.open(self.dir, "t", self.config)
        # The log goes on after every offset it can tell was written (those
        # it fsynced, a torn record's): none is used twice, and every record
        # lost is reported, with readers told of them by a gap.
        lost = self.log.next_offset - survivors_end
        assert 0 <= lost <= self.next - survivors_end
        assert self.log.recovery.cut_records == lost
        if lost and survivors_end >= self.log.first_offset:
            assert self.log.recovery.gaps[-1] == (survivors_end, lost)
        if self.log.recovery.cut_bytes:
            event("a torn tail was cut")
        if lost:
            event("records lost at the end were reported")
        for offset in range(survivors_end, self.next):
            del self.records[offset]
        self.next = self.log.next_offset
        self._sync_first()  # (a term sealed before the gap counts for retention)
        if self.records:
            self._last_time = max(time_ms for _, time_ms in self.records.values())

    # -------------------------------------------------------------- invariants

    @invariant()
    def offsets_match(self) -> None:
        if not hasattr(self, "log"):
            return
        assert self.log.next_offset == self.next
        assert self.log.first_offset == min(self.records, default=self.next)
        if self.config.retain_bytes is not None and self.config.when_full == "drop-oldest":
            assert self.log.term_count <= 2 or self.log.size_bytes <= self.config.retain_bytes

    @invariant()
    def every_record_is_served(self) -> None:
        if not hasattr(self, "log"):
            return
        offset = self.log.first_offset
        while offset < self.next:
            run = self.log.read(offset, 10_000, 1 << 30)
            # A gap only where the model lost records (a torn tail's).
            assert run.first_offset == offset + run.gap
            assert not any(o in self.records for o in range(offset, run.first_offset))
            offset = run.first_offset
            if offset == self.next:
                break
            assert run.tails
            for index, tail in enumerate(run.tails):
                assert bytes(tail) == self.records[offset + index][0]
            offset = run.next_offset


LogMachine.TestCase.settings = settings(
    max_examples=examples(100), stateful_step_count=50, deadline=None
)
TestLog = LogMachine.TestCase
