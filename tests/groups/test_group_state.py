"""A consumer group's bookkeeping (``GroupState``) against a simple model.

The state machine admits records, joins and loses members, takes, untakes,
settles (every outcome, late ones and never-sent ones), lets time pass,
dead-letters, drops records, skips retention gaps and restarts from a
snapshot; after every step the state must agree with the model record by
record, member by member. Unit tests below pin the smaller promises.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from broker.groups import GroupConfig, GroupError, GroupState, Outcome
from tests.hypothesis_profiles import examples

KEYS: list[bytes | None] = [None, b"a", b"b", b"c"]
WINDOW = 20

# Model states of a record.
READY, OUT, DELAYED, DEAD = "ready", "out", "delayed", "dead"
DONE, LETTERED, LOST = "done", "lettered", "lost"
#: Looked at before a restart and not settled: not admitted again yet.
UNADMITTED = "unadmitted"
SETTLED = frozenset({DONE, LETTERED, LOST})
#: With ordering by key, the states that keep a key's later records waiting.
BUSY = frozenset({OUT, DELAYED, DEAD})


@dataclass
class Rec:
    offset: int
    key: bytes | None
    state: str = READY
    deliveries: int = 0
    member: int | None = None
    seq: int = 0
    deadline: int = 0
    until: int = 0
    reason: str = ""
    reported: bool = False


@dataclass
class Mem:
    id: int
    max_outstanding: int
    next_seq: int = 1
    held: dict[int, int] = field(default_factory=dict)
    unresponsive: bool = False

    def free(self) -> int:
        return 0 if self.unresponsive else max(0, self.max_outstanding - len(self.held))


def runs(seqs: list[int]) -> list[tuple[int, int]]:
    """Sorted distinct numbers as ``(first, count)`` ranges."""
    ranges: list[tuple[int, int]] = []
    for seq in seqs:
        if ranges and ranges[-1][0] + ranges[-1][1] == seq:
            ranges[-1] = (ranges[-1][0], ranges[-1][1] + 1)
        else:
            ranges.append((seq, 1))
    return ranges


class GroupMachine(RuleBasedStateMachine):
    BY_KEY = False

    def __init__(self) -> None:
        super().__init__()
        #: The log's keys (offset ``n`` is ``log[n - 1]``).
        self.log: list[bytes | None] = []
        self.recs: dict[int, Rec] = {}
        self.members: dict[int, Mem] = {}
        self.frontier = 1
        #: After a restart: the frontier it had (below it, only the records
        #: unsettled then are looked at again).
        self.restore_end = 1
        self.now = 0
        self.next_id = 1
        self.late = 0
        self.expired = 0
        #: Dropped while due for the dead letters, not reported yet: may be reported.
        self.ghosts: set[int] = set()

    @initialize(
        max_deliveries=st.integers(2, 4),
        ack_wait=st.integers(2, 20),
        members=st.lists(st.integers(1, 5), max_size=3),
    )
    def configure(self, max_deliveries: int, ack_wait: int, members: list[int]) -> None:
        self.config = GroupConfig(ack_wait, max_deliveries, self.BY_KEY, WINDOW)
        self.state = GroupState(self.config, 1)
        for most in members:
            self._join(most)

    # ------------------------------------------------------------ the model

    def floor(self) -> int:
        return min(
            (o for o, r in self.recs.items() if o < self.frontier and r.state not in SETTLED),
            default=self.frontier,
        )

    def room(self) -> int:
        """The window bounds the records looked at and not settled."""
        return WINDOW - sum(
            1 for o, r in self.recs.items() if o < self.frontier and r.state not in SETTLED
        )

    def _jump(self) -> None:
        """After a restart the frontier skips what was settled before it."""
        while self.frontier < self.restore_end:
            rec = self.recs.get(self.frontier)
            if rec is not None and rec.state == UNADMITTED:
                return
            self.frontier += 1

    def _back(self, rec: Rec) -> None:
        rec.member = None
        if rec.deliveries >= self.config.max_deliveries:
            self._dead(rec, "max_deliveries")
        else:
            rec.state = READY

    def _dead(self, rec: Rec, reason: str) -> None:
        rec.state = DEAD
        rec.reason = reason[:200]
        rec.reported = False

    def _join(self, most: int) -> None:
        member_id = self.next_id
        self.next_id += 1
        self.state.join(member_id, most)
        self.members[member_id] = Mem(member_id, most)

    def _take(self, member_id: int, most: int, untake_sent: int | None = None) -> int:
        m = self.members[member_id]
        member = self.state.members[member_id]
        limit = min(most, m.free())
        taken = self.state.take(member, most, self.now)
        offsets = taken.offsets if taken else []
        if not self.BY_KEY:
            ready = sorted(o for o, r in self.recs.items() if r.state == READY)
            assert offsets == ready[:limit], "not the oldest ready records"
        if taken is None:
            return 0
        assert offsets and len(offsets) <= limit
        assert taken.first_seq == m.next_seq
        assert taken.delivered == [self.recs[o].deliveries for o in offsets]
        for index, offset in enumerate(offsets):
            rec = self.recs[offset]
            assert rec.state == READY, f"record {offset} given out while {rec.state}"
            if self.BY_KEY and rec.key is not None:
                for other in self.recs.values():
                    if other.key == rec.key and other is not rec:
                        assert other.state not in BUSY, f"key {rec.key!r}: two records out"
                        if other.offset < offset:
                            assert other.state in SETTLED, f"{offset} before {other.offset}"
            seq = taken.first_seq + index
            rec.state = OUT
            rec.member = member_id
            rec.seq = seq
            rec.deadline = self.now + self.config.ack_wait_ms
            rec.deliveries += 1
            m.held[seq] = offset
        m.next_seq += len(offsets)
        if untake_sent is not None and untake_sent < len(offsets):
            self.state.untake(member, taken, untake_sent)
            for seq in range(taken.first_seq + untake_sent, m.next_seq):
                rec = self.recs[m.held.pop(seq)]
                rec.state = READY
                rec.member = None
                rec.deliveries -= 1
            m.next_seq = taken.first_seq + untake_sent
        return len(offsets)

    def _settle(
        self,
        member_id: int,
        ranges: list[tuple[int, int]],
        outcome: Outcome,
        detail: int | str | None,
    ) -> None:
        m = self.members[member_id]
        found = self.state.settle(self.state.members[member_id], ranges, outcome, detail, self.now)
        expected = 0
        m.unresponsive = False
        for first, count in ranges:
            for seq in range(first, first + count):
                offset = m.held.get(seq)
                if offset is None:
                    self.late += 1
                    continue
                expected += 1
                rec = self.recs[offset]
                if outcome is Outcome.IN_PROGRESS:
                    rec.deadline = self.now + self.config.ack_wait_ms
                    continue
                del m.held[seq]
                rec.member = None
                if outcome is Outcome.DONE:
                    rec.state = DONE
                elif outcome is Outcome.REJECT:
                    self._dead(rec, str(detail or "rejected"))
                elif rec.deliveries >= self.config.max_deliveries:
                    self._dead(rec, "max_deliveries")
                elif type(detail) is int and detail > 0:
                    rec.state = DELAYED
                    rec.until = self.now + detail
                else:
                    rec.state = READY
        assert found == expected

    def _tick(self) -> None:
        expected = 0
        for rec in sorted(self.recs.values(), key=lambda r: r.offset):
            if rec.state == OUT and rec.deadline <= self.now:
                assert rec.member is not None
                m = self.members[rec.member]
                del m.held[rec.seq]
                m.unresponsive = True
                self.expired += 1
                expected += 1
                self._back(rec)
        for rec in self.recs.values():
            if rec.state == DELAYED and rec.until <= self.now:
                rec.state = READY
        assert self.state.tick(self.now) == expected
        due = [r.deadline for r in self.recs.values() if r.state == OUT]
        due += [r.until for r in self.recs.values() if r.state == DELAYED]
        next_deadline = self.state.next_deadline()
        assert next_deadline is None or next_deadline > self.now
        if due:  # (it may wake early, for a record settled since; never late)
            assert next_deadline is not None and next_deadline <= min(due)

    def _dead_letters(self) -> list[int]:
        """What is due for the dead letters (checked); returns the offsets."""
        due = self.state.dead_letters_due()
        got = {d.offset: d for d in due}
        assert len(got) == len(due), "a record due twice"
        expected = {o for o, r in self.recs.items() if r.state == DEAD and not r.reported}
        assert expected <= set(got) <= expected | self.ghosts
        for offset in expected:
            rec = self.recs[offset]
            assert got[offset].deliveries == rec.deliveries
            assert got[offset].reason == rec.reason
            rec.reported = True
        self.ghosts -= set(got)
        return sorted(expected)

    def _lettered(self, offset: int) -> None:
        rec = self.recs[offset]
        assert rec.state == DEAD and rec.reported
        self.state.dead_lettered(offset)
        rec.state = LETTERED

    # ------------------------------------------------------------ the rules

    @rule(data=st.data(), n=st.integers(0, 6))
    def admit(self, data: st.DataObject, n: int) -> None:
        n = min(n, self.room())
        first = self.frontier
        keys: list[bytes | None] = []
        for offset in range(first, first + n):
            if offset > len(self.log):
                self.log.append(data.draw(st.sampled_from(KEYS), label="key"))
            key = self.log[offset - 1]
            keys.append(key)
            rec = self.recs.get(offset)
            if rec is None:
                self.recs[offset] = Rec(offset, key)
            elif rec.state == UNADMITTED:
                rec.state = READY
            else:
                assert rec.state in SETTLED
        self.state.admit(first, keys if self.BY_KEY else n)
        self.frontier += n
        self._jump()

    def _skip_to(self, n: int) -> None:
        """Retention deleted records not looked at yet (within the window)."""
        n = min(n, self.room())
        target = self.frontier + n
        for offset in range(self.frontier, target):
            if offset > len(self.log):
                self.log.append(None)
            rec = self.recs.setdefault(offset, Rec(offset, self.log[offset - 1], LOST))
            if rec.state == UNADMITTED:
                rec.state = LOST
            assert rec.state in SETTLED
        self.state.skip_to(target)
        self.frontier = target
        self._jump()

    def _drop(self, data: st.DataObject) -> None:
        offset = data.draw(st.integers(max(1, self.floor() - 1), self.frontier - 1))
        rec = self.recs[offset]
        if rec.state not in SETTLED:
            if rec.state == OUT:
                assert rec.member is not None
                del self.members[rec.member].held[rec.seq]
            if rec.state == DEAD and not rec.reported:
                self.ghosts.add(offset)
            rec.state = LOST
            rec.member = None
        self.state.drop(offset)

    @precondition(lambda self: len(self.members) < 4)
    @rule(most=st.integers(1, 5))
    def join(self, most: int) -> None:
        self._join(most)

    @precondition(lambda self: self.members)
    @rule(data=st.data())
    def leave(self, data: st.DataObject) -> None:
        member_id = data.draw(st.sampled_from(sorted(self.members)))
        m = self.members.pop(member_id)
        assert self.state.leave(member_id) == len(m.held)
        for offset in m.held.values():
            self._back(self.recs[offset])
        assert self.state.leave(member_id) == 0

    @precondition(lambda self: self.members)
    @rule(data=st.data(), most=st.integers(0, 6), untake=st.sampled_from([False, False, True]))
    def take(self, data: st.DataObject, most: int, untake: bool) -> None:
        member_id = data.draw(st.sampled_from(sorted(self.members)))
        sent = data.draw(st.integers(0, max(0, most - 1)), label="sent") if untake else None
        self._take(member_id, most, sent)

    @precondition(lambda self: any(m.next_seq > 1 for m in self.members.values()))
    @rule(
        data=st.data(),
        outcome=st.sampled_from(Outcome),
        detail=st.sampled_from([None, 0, 1, 7, 40, "bad"]),
        late=st.booleans(),
    )
    def settle(
        self, data: st.DataObject, outcome: Outcome, detail: int | str | None, late: bool
    ) -> None:
        member_id = data.draw(
            st.sampled_from(sorted(i for i, m in self.members.items() if m.next_seq > 1))
        )
        m = self.members[member_id]
        seqs: set[int] = set()
        if m.held:
            held = st.sampled_from(sorted(m.held))
            seqs |= set(data.draw(st.lists(held, min_size=1, unique=True)))
        if late or not seqs:
            first = data.draw(st.integers(1, m.next_seq - 1))
            seqs |= set(range(first, data.draw(st.integers(first, m.next_seq - 1)) + 1))
        ranges = data.draw(st.permutations(runs(sorted(seqs))))
        self._settle(member_id, list(ranges), outcome, detail)

    def _settle_never_sent(self, data: st.DataObject) -> None:
        outcome = data.draw(st.sampled_from(Outcome))
        member_id = data.draw(st.sampled_from(sorted(self.members)))
        m = self.members[member_id]
        member = self.state.members[member_id]
        bad = data.draw(
            st.sampled_from([(0, 1), (1, 0), (2, -1), (m.next_seq, 1), (max(1, m.next_seq - 1), 2)])
        )
        good = runs(sorted(m.held))
        ranges = [*good, bad] if data.draw(st.booleans()) else [bad, *good]
        before = (
            self.state.late_settles,
            member.unresponsive,
            member.held_offsets(),
            member.next_seq,
            self.state.dirty,
        )
        with pytest.raises(GroupError) as error:
            self.state.settle(member, ranges, outcome, None, self.now)
        assert "\n" not in str(error.value)
        after = (
            self.state.late_settles,
            member.unresponsive,
            member.held_offsets(),
            member.next_seq,
            self.state.dirty,
        )
        assert after == before

    @rule(dt=st.sampled_from([0, 1, 2, 5, 10, 25]))
    def tick(self, dt: int) -> None:
        self.now += dt
        self._tick()

    @rule(data=st.data(), stray=st.integers(1, 40))
    def dead_letters(self, data: st.DataObject, stray: int) -> None:
        self._dead_letters()
        pending = sorted(o for o, r in self.recs.items() if r.state == DEAD and r.reported)
        if pending:
            for offset in data.draw(st.lists(st.sampled_from(pending), unique=True)):
                self._lettered(offset)
        rec = self.recs.get(stray)
        if rec is None or rec.state != DEAD:
            self.state.dead_lettered(stray)  # (changes nothing: checked by the invariant)

    def _restart(self) -> None:
        snapshot = self.state.snapshot()
        assert not self.state.dirty
        assert snapshot[1:3] == [self.floor(), max(self.frontier, self.restore_end)]
        kept = json.loads(json.dumps(snapshot))
        self.state = GroupState.restored(self.config, kept)
        self.restore_end = max(self.frontier, self.restore_end)
        self.frontier = self.floor()
        for rec in self.recs.values():
            if rec.state not in SETTLED:
                rec.state = UNADMITTED
                rec.deliveries = max(1, rec.deliveries)
                rec.member = None
        self.members.clear()
        self.ghosts.clear()
        self.late = self.expired = 0
        self._jump()

    def _drain(self) -> None:
        """Settling everything given out, waiting out retries and dead-lettering:
        every record looked at ends settled (nothing stalls, nothing vanishes)."""
        if not self.members:
            self._join(3)
        for _ in range(4 * WINDOW):
            for member_id, m in self.members.items():
                if m.held:
                    self._settle(member_id, runs(sorted(m.held)), Outcome.DONE, None)
                elif m.unresponsive:
                    self._settle(member_id, [(1, m.next_seq - 1)], Outcome.DONE, None)
            delays = [r.until for r in self.recs.values() if r.state == DELAYED]
            if delays:
                self.now = max(self.now, *delays)
                self._tick()
            for offset in self._dead_letters():
                self._lettered(offset)
            for offset, rec in self.recs.items():
                if rec.state == DEAD and rec.reported:
                    self._lettered(offset)
            if all(r.state in SETTLED for o, r in self.recs.items() if o < self.frontier):
                break
            for member in self.state.order():
                self._take(member.id, 5)
        assert self.state.unsettled == 0
        assert self.state.floor == self.frontier

    @rule(
        data=st.data(),
        kind=st.sampled_from(["skip_to", "drop", "never_sent", "restart", "drain"]),
    )
    def rare(self, data: st.DataObject, kind: str) -> None:
        """The rarer steps (one rule, so that they take fewer of a run's steps):
        a retention gap, a record dropped, a settle naming deliveries never
        sent, a restart from a snapshot, everything settled."""
        if kind == "skip_to":
            self._skip_to(data.draw(st.integers(1, 4)))
        elif kind == "drop" and self.frontier > 1:
            self._drop(data)
        elif kind == "never_sent" and self.members:
            self._settle_never_sent(data)
        elif kind == "restart":
            self._restart()
        elif kind == "drain":
            self._drain()

    # ------------------------------------------------------------ invariants

    @invariant()
    def agrees_with_model(self) -> None:
        if not hasattr(self, "state"):
            return
        state = self.state
        assert list(state.check()) == []
        floor = self.floor()
        assert (state.floor, state.frontier) == (floor, self.frontier)
        assert state.unsettled <= WINDOW
        assert state.room_ahead == self.room()
        assert all(r.state in SETTLED for o, r in self.recs.items() if o < floor)
        unsettled = [o for o, r in self.recs.items() if r.state not in SETTLED]
        assert state.unsettled == sum(1 for o in unsettled if o < self.frontier)
        end = len(self.log) + 1
        assert state.lag(end) == len(unsettled) + sum(
            1 for o in range(self.frontier, end) if o not in self.recs
        )
        assert set(state.members) == set(self.members)
        for member_id, m in self.members.items():
            member = state.members[member_id]
            assert member.held_offsets() == [
                (seq, o, self.recs[o].deliveries - 1) for seq, o in sorted(m.held.items())
            ]
            assert len(m.held) <= m.max_outstanding
            assert (member.next_seq, member.unresponsive) == (m.next_seq, m.unresponsive)
        out = [o for m in self.members.values() for o in m.held.values()]
        assert len(out) == len(set(out)) == state.outstanding
        assert sorted(out) == sorted(o for o, r in self.recs.items() if r.state == OUT)
        if self.BY_KEY:
            busy = [r.key for r in self.recs.values() if r.state in BUSY and r.key is not None]
            assert len(busy) == len(set(busy)), "a key with two records out at once"
        assert (state.late_settles, state.expired) == (self.late, self.expired)


class KeyOrderMachine(GroupMachine):
    BY_KEY = True


SETTINGS = settings(
    max_examples=examples(200),
    stateful_step_count=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestPlainGroup = GroupMachine.TestCase
TestPlainGroup.settings = SETTINGS
TestKeyOrderGroup = KeyOrderMachine.TestCase
TestKeyOrderGroup.settings = SETTINGS


# ==================================================================== unit tests


def _group(count: int = 0, **config: int | bool) -> GroupState:
    state = GroupState(GroupConfig(**config), 1)  # type: ignore[arg-type]
    if count:
        state.admit(1, count)
    return state


def test_round_robin_spreads_records_evenly() -> None:
    state = _group(31)
    for member_id in (1, 2, 3):
        state.join(member_id, 100)
    counts = dict.fromkeys((1, 2, 3), 0)
    while True:
        member = state.order()[0]
        taken = state.take(member, 1, 0)
        if taken is None:
            break
        counts[member.id] += len(taken.offsets)
    assert sum(counts.values()) == 31
    assert max(counts.values()) - min(counts.values()) <= 1


def test_settle_after_ack_wait_is_counted_late() -> None:
    state = _group(1, ack_wait_ms=100)
    member = state.join(1, 10)
    assert state.take(member, 10, 0) == (1, [1], [0])
    assert state.tick(99) == 0
    assert state.tick(100) == 1
    assert member.unresponsive and member.free == 0
    assert state.settle(member, [(1, 1)], Outcome.DONE, None, 101) == 0
    assert state.late_settles == 1 and not member.unresponsive
    assert state.unsettled == 1  # (still to be done: it went back)
    taken = state.take(member, 10, 102)
    assert taken is not None and taken.offsets == [1] and taken.delivered == [1]


def test_late_settles_counted_for_a_range_longer_than_what_is_held() -> None:
    state = _group(3)
    member = state.join(1, 10)
    state.take(member, 3, 0)
    state.settle(member, [(1, 2)], Outcome.DONE, None, 0)
    assert state.settle(member, [(1, 3)], Outcome.DONE, None, 0) == 1
    assert state.late_settles == 2


def test_in_progress_puts_off_expiry() -> None:
    state = _group(1, ack_wait_ms=100)
    member = state.join(1, 10)
    state.take(member, 1, 0)
    assert state.settle(member, [(1, 1)], Outcome.IN_PROGRESS, None, 90) == 1
    assert state.tick(100) == 0 and state.tick(189) == 0
    assert member.outstanding == 1 and not member.unresponsive
    assert state.tick(190) == 1
    assert member.outstanding == 0


def test_delayed_retry_is_not_ready_before_its_time() -> None:
    state = _group(1)
    member = state.join(1, 10)
    state.take(member, 1, 0)
    state.settle(member, [(1, 1)], Outcome.RETRY, 50, 10)
    assert state.take(member, 1, 10) is None
    state.tick(59)
    assert state.take(member, 1, 59) is None
    assert state.next_deadline() == 60
    state.tick(60)
    assert state.take(member, 1, 60) == (2, [1], [1])


def test_lag() -> None:
    state = _group(5)
    member = state.join(1, 10)
    assert state.lag(11) == 10
    state.take(member, 3, 0)
    assert state.lag(11) == 10  # (out is not settled)
    state.settle(member, [(1, 1), (3, 1)], Outcome.DONE, None, 0)
    assert state.lag(11) == 8
    restored = GroupState.restored(state.config, state.snapshot())
    assert restored.lag(11) == 8  # (before it admitted anything again)
    restored.admit(2, 4)
    assert restored.lag(11) == 8 and restored.unsettled == 3


def test_snapshot_stays_small_when_settles_are_in_order() -> None:
    state = _group(WINDOW * 50, window=WINDOW * 50)
    member = state.join(1, 1000)
    now = 0
    while (taken := state.take(member, 7, now)) is not None:
        state.settle(member, [(taken.first_seq, len(taken.offsets))], Outcome.DONE, None, now)
        snapshot = state.snapshot()
        assert len(json.dumps(snapshot)) < 40, snapshot
        now += 1
    assert state.snapshot() == [2, 1 + WINDOW * 50, 1 + WINDOW * 50, [], []]


def test_dead_letters_after_max_deliveries_and_reject() -> None:
    state = _group(2, max_deliveries=2)
    member = state.join(1, 10)
    state.take(member, 2, 0)
    state.settle(member, [(1, 1)], Outcome.RETRY, None, 0)
    state.settle(member, [(2, 1)], Outcome.REJECT, "bad payload", 0)
    assert [tuple(d) for d in state.dead_letters_due()] == [(2, 1, "bad payload")]
    assert state.take(member, 10, 0) == (3, [1], [1])
    state.settle(member, [(3, 1)], Outcome.RETRY, None, 0)
    assert [tuple(d) for d in state.dead_letters_due()] == [(1, 2, "max_deliveries")]
    assert state.dead_letters_due() == []
    state.dead_lettered(1)
    state.dead_lettered(2)
    assert state.unsettled == 0 and state.floor == 3


# ==================================================================== bugs it found


def test_a_restart_before_admitting_again_keeps_delivery_counts() -> None:
    """A snapshot taken before the restored records were admitted again kept
    none of their delivery counts: a record could go out more than
    ``max_deliveries`` times across restarts."""
    state = _group(3, max_deliveries=3)
    member = state.join(1, 10)
    for seq in (1, 2):
        state.take(member, 1, 0)
        state.settle(member, [(seq, 1)], Outcome.RETRY, None, 0)
    state.take(member, 1, 0)
    assert [tuple(d) for d in state.dead_letters_due()] == []
    once = GroupState.restored(state.config, state.snapshot())
    twice = GroupState.restored(state.config, once.snapshot())
    twice.admit(1, 3)
    member = twice.join(1, 10)
    assert twice.take(member, 10, 0) == (1, [1, 2, 3], [3, 1, 1])
    twice.settle(member, [(1, 1)], Outcome.RETRY, None, 0)
    assert [tuple(d) for d in twice.dead_letters_due()] == [(1, 4, "max_deliveries")]


@pytest.mark.parametrize("dropped", [2, 3])
def test_dropping_a_waiting_record_with_ordering_by_key(dropped: int) -> None:
    """Dropping a record waiting behind its key's record out neither stalls
    the key (its stale entry stayed first in the key's queue) nor lets the
    key's next record out beside the one out."""
    state = _group(ordering_by_key=True)
    state.admit(1, [b"k", b"k", b"k"])
    member = state.join(1, 10)
    assert state.take(member, 10, 0) == (1, [1], [0])
    state.drop(dropped)
    assert state.take(member, 10, 0) is None  # (1 is still out)
    state.settle(member, [(1, 1)], Outcome.DONE, None, 0)
    left = 5 - dropped
    assert state.take(member, 10, 0) == (2, [left], [0])


def test_a_member_holding_an_old_record_holds_nothing_else_back() -> None:
    """The window bounds the records looked at and not settled, not the span
    from the floor: a stopped member pinning the floor costs the others
    nothing until its ``ack_wait``, and a snapshot stays small."""
    state = GroupState(GroupConfig(30_000, 5, False, window=10), 1)
    stopped = state.join(1, 1)
    other = state.join(2, 5)
    state.admit(1, state.room_ahead)
    assert state.take(stopped, 1, 0) is not None  # offset 1, never settled
    settled = 0
    while settled < 1000:
        state.admit(state.frontier, state.room_ahead)
        taken = state.take(other, 5, 0)
        assert taken is not None
        state.settle(other, [(taken.first_seq, len(taken.offsets))], Outcome.DONE, None, 0)
        settled += len(taken.offsets)
    assert state.floor == 1 and state.frontier > 1000
    assert state.snapshot()[3][:2] == [1, 1]  # (offset 1 unsettled, the rest as few pairs)
    assert len(state.snapshot()[3]) <= 4


def test_a_restore_from_an_old_snapshot_and_the_settles_since() -> None:
    """The journal keeps a snapshot every 50 ms and each Settle's offsets
    at once: restored from an old snapshot and the settles since, nothing
    settled comes again and nothing unsettled is lost."""
    state = _group(50)
    member = state.join(1, 100)
    old = state.snapshot()  # (nothing settled yet)
    taken = state.take(member, 30, 0)
    assert taken is not None
    state.settle(member, [(1, 10), (21, 5)], Outcome.DONE, None, 0)
    since = state.take_settled()
    assert sorted(since) == [*range(1, 11), *range(21, 26)]
    restored = GroupState.restored(state.config, old, since)
    restored.admit(restored.frontier, 50 - restored.frontier + 1)
    again = restored.join(1, 100)
    given = restored.take(again, 100, 0)
    assert given is not None
    assert given.offsets == [*range(11, 21), *range(26, 51)]
    assert restored.floor == 11
