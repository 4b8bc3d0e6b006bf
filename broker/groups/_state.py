"""A consumer group's bookkeeping, sans-IO: which record is out with which
member, what is settled, what goes out again, what is dead-lettered.

:class:`GroupState` knows offsets, members and times (milliseconds, passed
in); the server reads the records' bytes from the topic's log and sends
them. It promises:

- **One member at a time.** A record is out with at most one member; it is
  given out again only once it came back (settled *retry*, its ``ack_wait``
  passed, its member left).
- **Bounded.** It keeps state only for the records between :attr:`floor`
  (everything below is settled) and :attr:`frontier` (nothing at or above it
  was looked at yet), at most ``window`` of them, and each member holds at
  most its ``max_outstanding``.
- **Order per key** (``ordering_by_key``): a key's record is given out only
  once every earlier record of that key is settled; keys go to members by
  rendezvous hashing, so a join or a leave moves only the keys it must.
- **Nothing stalls on one record.** A record delivered ``max_deliveries``
  times and not done, or rejected, is due for the dead letters
  (:meth:`dead_letters_due`), settled once they hold it
  (:meth:`dead_lettered`).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import NamedTuple

__all__ = [
    "DeadLetter",
    "GroupConfig",
    "GroupError",
    "GroupState",
    "Member",
    "Outcome",
    "Taken",
    "key_hash",
]


class Outcome(IntEnum):
    """How a member settles a delivery (the values of the protocol's ``Settle``)."""

    DONE = 0
    RETRY = 1
    REJECT = 2
    IN_PROGRESS = 3


class GroupError(Exception):
    """A member named a delivery it was never sent (its text is one line)."""


@dataclass(frozen=True, slots=True)
class GroupConfig:
    """What a group does with its records (the same for all its members)."""

    #: How long a member may hold a record unsettled before it goes back.
    ack_wait_ms: int = 30_000
    #: Deliveries after which a record not done goes to the dead letters.
    max_deliveries: int = 5
    #: Records of one key go to one member at a time, in offset order.
    ordering_by_key: bool = False
    #: The most records between the floor and the frontier.
    window: int = 16_384


class DeadLetter(NamedTuple):
    """A record due for the dead letters."""

    offset: int
    #: Times it was delivered.
    deliveries: int
    #: Why: ``"max_deliveries"`` or the member's reason to reject it.
    reason: str


class Taken(NamedTuple):
    """Records given to a member: consecutive delivery numbers from ``first_seq``."""

    first_seq: int
    offsets: list[int]
    #: Times each was delivered before.
    delivered: list[int]


_READY, _OUT, _DELAYED, _DEAD = range(4)


class _Record:
    __slots__ = ("deadline", "deliveries", "key", "member", "offset", "seq", "state")

    def __init__(self, offset: int, key: int, deliveries: int) -> None:
        self.offset = offset
        self.key = key
        self.deliveries = deliveries
        self.state = _READY
        self.member: Member | None = None
        self.seq = 0
        self.deadline = 0


class Member:
    """One member: what it holds, by delivery number, and when each is due back."""

    __slots__ = ("expiries", "held", "id", "max_outstanding", "next_seq", "unresponsive", "waiting")

    def __init__(self, member_id: int, max_outstanding: int, next_seq: int = 1) -> None:
        self.id = member_id
        self.max_outstanding = max_outstanding
        #: Records it holds, by delivery number.
        self.held: dict[int, _Record] = {}
        #: The number its next delivery gets.
        self.next_seq = next_seq
        #: ``(deadline, first seq, last seq)`` in the order set (deadlines
        #: never decrease): the deliveries that may be due back then.
        self.expiries: deque[tuple[int, int, int]] = deque()
        #: A record of it went back after ``ack_wait``: it gets nothing new
        #: until it settles something.
        self.unresponsive = False
        #: With ordering by key: offsets of the records eligible for it (a heap).
        self.waiting: list[int] = []

    @property
    def outstanding(self) -> int:
        return len(self.held)

    @property
    def free(self) -> int:
        """How many more records it may hold now."""
        return 0 if self.unresponsive else max(0, self.max_outstanding - len(self.held))

    def held_offsets(self) -> list[tuple[int, int, int]]:
        """``(seq, offset, deliveries before)`` of what it holds, by delivery number."""
        return sorted((seq, r.offset, r.deliveries - 1) for seq, r in self.held.items())


def key_hash(key: bytes | None, offset: int) -> int:
    """The ordering key of a record: its key's hash; a record without a key
    is a key of its own (it waits for no other)."""
    if key is None:
        return -offset
    return int.from_bytes(key[:8].ljust(8, b"\0"), "little") ^ hash(key)


def _weight(key: int, member: int) -> int:
    # (Rendezvous hashing: the member of highest weight owns the key. Ints
    # hash the same in every process.)
    return hash((key, member))


class GroupState:
    """One group's records and members (see the module)."""

    def __init__(
        self,
        config: GroupConfig,
        floor: int,
        *,
        unsettled_ahead: Iterable[int] = (),
        restore_end: int = 0,
        deliveries_ahead: Mapping[int, int] | None = None,
    ) -> None:
        self.config = config
        #: Every offset below it is settled.
        self.floor = floor
        #: The next offset to look at (records below it are known here: the
        #: unsettled ones in ``_records``, the others settled).
        self.frontier = floor
        #: Restored: below ``_restore_end`` only the offsets of
        #: ``_unsettled_ahead`` (ascending; those from ``_ahead_at`` on are
        #: not looked at again yet) are unsettled; and the deliveries of
        #: records not looked at again yet.
        self._restore_end = max(restore_end, floor)
        self._unsettled_ahead = sorted(o for o in set(unsettled_ahead) if o >= floor)
        self._ahead_at = 0
        self._deliveries_ahead = dict(deliveries_ahead or {})
        self.members: dict[int, Member] = {}
        self._records: dict[int, _Record] = {}
        #: Plain ordering: offsets given back and ready to go again (a heap,
        #: oldest first), and records never given out, in offset order (all
        #: younger than those given back).
        self._ready: list[int] = []
        self._fresh: deque[_Record] = deque()
        #: ``(time, offset)`` of records retried with a delay (a heap).
        self._delayed: list[tuple[int, int]] = []
        #: Ordering by key: per key, its ready records in offset order; the
        #: keys one of whose records is out (or delayed, or dead-lettering).
        self._queues: dict[int, deque[_Record]] = {}
        self._busy: set[int] = set()
        self._owners: dict[int, Member] = {}
        self._dead: list[DeadLetter] = []
        #: Round-robin start for :meth:`order`.
        self._turn = 0
        #: Changed since :meth:`snapshot` last ran.
        self.dirty = False
        #: Offsets settled since :meth:`take_settled` or :meth:`snapshot`.
        self._settled_since: list[int] = []
        # Counters (monotonic).
        self.settled = 0
        self.redelivered = 0
        self.dead_lettered_count = 0
        self.expired = 0
        self.late_settles = 0
        self.lost = 0
        self._jump()
        self._advance_floor()

    # ---------------------------------------------------------------- members

    def join(self, member_id: int, max_outstanding: int) -> Member:
        """A new member (holding nothing yet)."""
        member = self.members[member_id] = Member(member_id, max_outstanding)
        self._membership_changed()
        return member

    def leave(self, member_id: int) -> int:
        """A member left: what it held goes back to the group (each counted
        as delivered). Returns how many records that was."""
        member = self.members.pop(member_id, None)
        if member is None:
            return 0
        self._owners.clear()
        held = sorted(member.held.values(), key=lambda r: r.offset)
        member.held.clear()
        member.expiries.clear()
        for record in held:
            self._back(record)
        self._membership_changed()
        return len(held)

    def order(self) -> list[Member]:
        """The members, starting with the one after the last given records
        (round robin)."""
        members = list(self.members.values())
        if not members:
            return members
        turn = self._turn % len(members)
        return members[turn:] + members[:turn]

    # ---------------------------------------------------------------- records in

    @property
    def room_ahead(self) -> int:
        """How many more records the window takes in now: it bounds the
        records looked at and not settled (not the span from the floor:
        a member holding old records holds nothing else back)."""
        return self.config.window - len(self._records)

    def admit(self, first: int, keys: Sequence[bytes | None] | int) -> None:
        """Records from offset ``first`` (== :attr:`frontier`) exist: their
        keys (with ordering by key), or just how many there are."""
        if first != self.frontier:
            raise ValueError(f"records admitted from {first}, not at the frontier {self.frontier}")
        count = keys if isinstance(keys, int) else len(keys)
        by_key = self.config.ordering_by_key
        restore_end = self._restore_end
        ahead = self._deliveries_ahead
        records = self._records
        fresh = self._fresh
        for index in range(count):
            offset = first + index
            if offset < restore_end and not self._unsettled_at(offset):
                continue  # (settled before the restart)
            deliveries = ahead.pop(offset, 0) if ahead else 0
            if by_key:
                assert not isinstance(keys, int)
                record = _Record(offset, key_hash(keys[index], offset), deliveries)
                records[offset] = record
                self._enqueue_key(record, front=False)
            else:
                record = records[offset] = _Record(offset, 0, deliveries)
                fresh.append(record)
        self.frontier = first + count
        self._jump()
        self._advance_floor()

    def _unsettled_at(self, offset: int) -> bool:
        """Whether ``offset`` (below the restore's end, looked at in
        ascending order) was unsettled at the restart."""
        ahead = self._unsettled_ahead
        at = self._ahead_at
        while at < len(ahead) and ahead[at] < offset:
            at += 1
        found = at < len(ahead) and ahead[at] == offset
        self._ahead_at = at + 1 if found else at
        return found

    def _jump(self) -> None:
        """Restored: move the frontier over the offsets settled before the
        restart (to the next one that was not, or the restore's end)."""
        if self.frontier < self._restore_end:
            ahead = self._unsettled_ahead
            at = self._ahead_at
            while at < len(ahead) and ahead[at] < self.frontier:
                at += 1
            self._ahead_at = at
            self.frontier = ahead[at] if at < len(ahead) else self._restore_end

    def skip_to(self, offset: int) -> None:
        """Retention deleted every record before ``offset`` that was not
        looked at yet: the frontier (and the floor) move past them."""
        if offset > self.frontier:
            self.lost += offset - self.frontier
            self.frontier = offset
            ahead = self._unsettled_ahead
            while self._ahead_at < len(ahead) and ahead[self._ahead_at] < offset:
                self._ahead_at += 1  # (restored ones it deleted too)
            self._jump()
            self._advance_floor()

    def drop(self, offset: int) -> None:
        """Record ``offset`` cannot be read any more (retention or damage):
        it is settled, counted as lost."""
        record = self._records.get(offset)
        if record is not None:
            self._take_back(record)
            self.lost += 1
            if record.state == _READY and self.config.ordering_by_key:
                queue = self._queues[record.key]
                queue.remove(record)
                if not queue:
                    del self._queues[record.key]
            self._settled(record)

    # ---------------------------------------------------------------- records out

    def take(self, member: Member, most: int, now: int) -> Taken | None:
        """Give ``member`` up to ``most`` ready records (within its free
        room), oldest first: they are out with it from ``now``. None: none
        is ready for it."""
        most = min(most, member.free)
        if most <= 0:
            return None
        if self.config.ordering_by_key:
            chosen = self._take_by_key(member, most)
        else:
            # (Records given back come first: they are older than any fresh one.)
            ready = self._ready
            records = self._records
            chosen = []
            while ready and len(chosen) < most:
                record = records.get(heapq.heappop(ready))
                if record is not None and record.state == _READY:
                    chosen.append(record)
            fresh = self._fresh
            while fresh and len(chosen) < most:
                record = fresh.popleft()
                if record.state == _READY and records.get(record.offset) is record:
                    chosen.append(record)
        if not chosen:
            return None
        first_seq = member.next_seq
        seq = first_seq
        deadline = now + self.config.ack_wait_ms
        held = member.held
        offsets = []
        delivered = []
        for record in chosen:
            record.state = _OUT
            record.member = member
            record.seq = seq
            record.deadline = deadline
            offsets.append(record.offset)
            delivered.append(record.deliveries)
            if record.deliveries:
                self.redelivered += 1
            record.deliveries += 1
            held[seq] = record
            seq += 1
        member.next_seq = seq
        member.expiries.append((deadline, first_seq, seq - 1))
        self._turn = list(self.members).index(member.id) + 1
        return Taken(first_seq, offsets, delivered)

    def untake(self, member: Member, taken: Taken, sent: int) -> None:
        """Only the first ``sent`` records of ``taken`` (the last given to
        ``member``) went out: the rest are ready again, as if never taken,
        and their delivery numbers are given again."""
        if sent >= len(taken.offsets):
            return
        first_unsent = taken.first_seq + sent
        for seq in range(taken.first_seq + len(taken.offsets) - 1, first_unsent - 1, -1):
            record = member.held.pop(seq)
            record.deliveries -= 1
            if record.deliveries:
                self.redelivered -= 1
            self._requeue(record)
        member.next_seq = first_unsent
        if member.expiries and member.expiries[-1][1] == taken.first_seq:
            deadline, first, _ = member.expiries.pop()
            if sent:
                member.expiries.append((deadline, first, first_unsent - 1))

    def _take_by_key(self, member: Member, most: int) -> list[_Record]:
        chosen: list[_Record] = []
        waiting = member.waiting
        records = self._records
        while waiting and len(chosen) < most:
            record = records.get(heapq.heappop(waiting))
            if record is None or record.state != _READY or record.key in self._busy:
                continue
            queue = self._queues.get(record.key)
            if not queue or queue[0] is not record or self._owner(record.key) is not member:
                continue
            queue.popleft()
            if not queue:
                del self._queues[record.key]
            self._busy.add(record.key)
            chosen.append(record)
        return chosen

    # ---------------------------------------------------------------- settling

    def settle(
        self,
        member: Member,
        ranges: Iterable[tuple[int, int]],
        outcome: Outcome,
        detail: int | str | None,
        now: int,
    ) -> int:
        """``member`` settles the deliveries in ``ranges`` (``(first seq,
        count)`` pairs). Deliveries it no longer holds (they went back, or
        were settled) are counted in :attr:`late_settles` and changed by
        nothing; a delivery never sent raises :class:`GroupError`, and then
        nothing is changed. Returns how many it held."""
        spans = list(ranges)
        for first, count in spans:
            if first < 1 or count < 1 or first + count - 1 >= member.next_seq:
                raise GroupError(
                    f"Settle names deliveries {first} to {first + count - 1}: "
                    f"only 1 to {member.next_seq - 1} were sent on this subscription"
                )
        if member.unresponsive:
            member.unresponsive = False
            self._membership_changed()
        held = member.held
        if outcome is Outcome.DONE and not self.config.ordering_by_key:
            return self._done(held, spans)
        found = 0
        for first, count in spans:
            for seq in self._named(held, first, count):
                record = held.get(seq)
                if record is None:
                    self.late_settles += 1
                    continue
                found += 1
                if outcome is Outcome.IN_PROGRESS:
                    record.deadline = now + self.config.ack_wait_ms
                    member.expiries.append((record.deadline, seq, seq))
                    continue
                del held[seq]
                record.member = None
                if outcome is Outcome.DONE:
                    self.settled += 1
                    self._settled(record)
                elif outcome is Outcome.REJECT:
                    self._dead_letter(record, str(detail or "rejected"))
                elif record.deliveries >= self.config.max_deliveries:
                    self._dead_letter(record, "max_deliveries")
                elif type(detail) is int and detail > 0:
                    record.state = _DELAYED
                    heapq.heappush(self._delayed, (now + detail, record.offset))
                else:
                    self._requeue(record)
        if found:
            self.dirty = True
        return found

    def _named(self, held: dict[int, _Record], first: int, count: int) -> Iterable[int]:
        """The delivery numbers a settle's range names, to look up in
        ``held``: all of them, or (a wide range over few held) those held,
        the others counted as late at once."""
        if count <= len(held):
            return range(first, first + count)
        seqs = sorted(s for s in held if first <= s < first + count)
        self.late_settles += count - len(seqs)
        return seqs

    def _done(self, held: dict[int, _Record], spans: list[tuple[int, int]]) -> int:
        """:meth:`settle` done, in plain order: the common case, in one pass."""
        records = self._records
        since = self._settled_since
        found = 0
        for first, count in spans:
            for seq in self._named(held, first, count):
                record = held.pop(seq, None)
                if record is None:
                    self.late_settles += 1
                    continue
                found += 1
                record.member = None
                offset = record.offset
                del records[offset]
                since.append(offset)
        if found:
            self.settled += found
            self.dirty = True
            self._advance_floor()
        return found

    def tick(self, now: int) -> int:
        """Take back what stayed out past its ``ack_wait``, and make delayed
        retries ready, as of ``now``. Returns how many records went back."""
        back = 0
        for member in list(self.members.values()):
            expiries = member.expiries
            held = member.held
            while expiries and expiries[0][0] <= now:
                _, first, last = expiries.popleft()
                for seq in range(first, last + 1):
                    record = held.get(seq)
                    if record is None or record.deadline > now:
                        continue  # settled, or its deadline was put off
                    del held[seq]
                    record.member = None
                    member.unresponsive = True
                    self.expired += 1
                    back += 1
                    self._back(record)
        delayed = self._delayed
        while delayed and delayed[0][0] <= now:
            _, offset = heapq.heappop(delayed)
            record = self._records.get(offset)
            if record is not None and record.state == _DELAYED:
                self._requeue(record)
        if back:
            self.dirty = True
            self._membership_changed()
        return back

    def next_deadline(self) -> int | None:
        """When :meth:`tick` next has something to do (None: nothing waits)."""
        times = [m.expiries[0][0] for m in self.members.values() if m.expiries]
        if self._delayed:
            times.append(self._delayed[0][0])
        return min(times) if times else None

    def dead_letters_due(self) -> list[DeadLetter]:
        """The records to put in the dead letters now (each once)."""
        due, self._dead = self._dead, []
        return due

    def dead_lettered(self, offset: int) -> None:
        """The dead letters hold record ``offset``: it is settled."""
        record = self._records.get(offset)
        if record is not None and record.state == _DEAD:
            self.dead_lettered_count += 1
            self._settled(record)
            self.dirty = True

    # ---------------------------------------------------------------- state

    @property
    def unsettled(self) -> int:
        """Records looked at and not settled."""
        return len(self._records)

    @property
    def outstanding(self) -> int:
        return sum(len(m.held) for m in self.members.values())

    def lag(self, end: int) -> int:
        """Records not settled, of a log whose next offset is ``end``."""
        not_again = len(self._unsettled_ahead) - self._ahead_at  # (restored, not looked at)
        return max(0, end - max(self.frontier, self._restore_end)) + len(self._records) + not_again

    #: The layout of :meth:`snapshot` (the first element).
    SNAPSHOT_VERSION = 2

    def snapshot(self) -> list[object]:
        """What the state journal keeps: ``[2, floor, end, unsettled,
        deliveries]``: every offset from ``floor`` to ``end`` (excluded) is
        settled but those of ``unsettled`` (``first, count`` pairs), and
        ``deliveries`` (``offset, count`` pairs) are the counts of records
        delivered more than once, and of those a restore gave counts to
        that were not looked at again yet. Its size follows the records not
        settled, not the span from the floor. Clears :attr:`dirty`."""
        self.dirty = False
        self._settled_since = []
        unsettled: list[int] = []
        records = self._records
        # (Records were added in offset order: the dict's order is the offsets'.)
        for offset in (*records, *self._unsettled_ahead[self._ahead_at :]):
            if unsettled and unsettled[-2] + unsettled[-1] == offset:
                unsettled[-1] += 1
            else:
                unsettled += (offset, 1)
        counts: list[int] = []
        for record in records.values():
            if record.deliveries > 1:
                counts += (record.offset, record.deliveries)
        # (Restored and not looked at again yet: their counts are kept as given.)
        for offset, count in sorted(self._deliveries_ahead.items()):
            if offset >= self.frontier:
                counts += (offset, count)
        end = max(self.frontier, self._restore_end)
        return [self.SNAPSHOT_VERSION, self.floor, end, unsettled, counts]

    def take_settled(self) -> list[int]:
        """The offsets settled (done, dead-lettered or dropped) since the
        last call or :meth:`snapshot`: what the journal adds to the last
        snapshot, so that a settle is kept at once."""
        settled, self._settled_since = self._settled_since, []
        return settled

    @classmethod
    def restored(
        cls, config: GroupConfig, snapshot: object, settled_since: Iterable[int] = ()
    ) -> GroupState:
        """The state a :meth:`snapshot` kept, with the offsets settled since
        (:meth:`take_settled`). Records that were looked at and not settled
        count one delivery at least (they may have been out). Raises
        ValueError for a value that is not a snapshot."""
        if not (
            isinstance(snapshot, list)
            and len(snapshot) == 5
            and snapshot[0] == cls.SNAPSHOT_VERSION
            and all(type(v) is int and v >= 1 for v in snapshot[1:3])
            and snapshot[1] <= snapshot[2]
            and all(isinstance(v, list) and all(type(x) is int for x in v) for v in snapshot[3:])
            and len(snapshot[3]) % 2 == 0
            and len(snapshot[4]) % 2 == 0
        ):
            raise ValueError("not a consumer group's state")
        _, floor, end, unsettled_pairs, counts = snapshot
        unsettled = set(_expand(unsettled_pairs))
        since = set(settled_since)
        if since and max(since) >= end:
            # Settled after the snapshot beyond its end: the records between
            # were looked at since, and those not settled are not.
            unsettled.update(range(end, max(since) + 1))
            end = max(since) + 1
        unsettled.difference_update(since)
        deliveries = {o: 1 for o in unsettled}
        deliveries.update(
            (o, n)
            for o, n in zip(counts[::2], counts[1::2], strict=True)
            if o in unsettled or o >= end
        )
        return cls(
            config, floor, unsettled_ahead=unsettled, restore_end=end, deliveries_ahead=deliveries
        )

    # ---------------------------------------------------------------- inside

    def _settled(self, record: _Record) -> None:
        self._settled_since.append(record.offset)
        del self._records[record.offset]
        if self.config.ordering_by_key:
            if record.state != _READY:  # (a ready one (dropped) kept its key free)
                self._busy.discard(record.key)
            self._eligible(record.key)
        if record.offset == self.floor:
            self._advance_floor()

    def _advance_floor(self) -> None:
        """The floor is the oldest record not settled: the first of
        ``_records`` (added in offset order), else the frontier (which a
        restore moved to its next unsettled record)."""
        records = self._records
        floor = next(iter(records)) if records else self.frontier
        if floor > self.floor:
            self.floor = floor

    def _back(self, record: _Record) -> None:
        """A record out (or held by a member that left) comes back."""
        record.member = None
        if record.deliveries >= self.config.max_deliveries:
            self._dead_letter(record, "max_deliveries")
        else:
            self._requeue(record)

    def _take_back(self, record: _Record) -> None:
        member = record.member
        if member is not None and member.held.get(record.seq) is record:
            del member.held[record.seq]
        record.member = None

    def _requeue(self, record: _Record) -> None:
        record.state = _READY
        if self.config.ordering_by_key:
            self._busy.discard(record.key)
            self._enqueue_key(record, front=True)
        else:
            heapq.heappush(self._ready, record.offset)

    def _dead_letter(self, record: _Record, reason: str) -> None:
        record.state = _DEAD
        self._dead.append(DeadLetter(record.offset, record.deliveries, reason[:200]))
        self.dirty = True

    def _enqueue_key(self, record: _Record, *, front: bool) -> None:
        queue = self._queues.get(record.key)
        if queue is None:
            queue = self._queues[record.key] = deque()
        if front:
            queue.appendleft(record)
        else:
            queue.append(record)
        if queue[0] is record:
            self._eligible(record.key)

    def _eligible(self, key: int) -> None:
        """Key ``key``'s first ready record may go out now (unless the key is busy)."""
        if key in self._busy:
            return
        queue = self._queues.get(key)
        if not queue:
            return
        owner = self._owner(key)
        if owner is not None:
            heapq.heappush(owner.waiting, queue[0].offset)

    def _owner(self, key: int) -> Member | None:
        owner = self._owners.get(key)
        if owner is None:
            members = [m for m in self.members.values() if not m.unresponsive] or list(
                self.members.values()
            )
            if not members:
                return None
            owner = self._owners[key] = max(members, key=lambda m: _weight(key, m.id))
        return owner

    def _membership_changed(self) -> None:
        """Keys move to their new owners (ordering by key)."""
        if not self.config.ordering_by_key:
            return
        self._owners.clear()
        for member in self.members.values():
            member.waiting.clear()
        for key in list(self._queues):
            self._eligible(key)

    def check(self) -> Iterator[str]:
        """What is wrong with the state's invariants (for tests)."""
        out = [r for m in self.members.values() for r in m.held.values()]
        if len({r.offset for r in out}) != len(out):
            yield "a record is out with two members at once"
        for member in self.members.values():
            if len(member.held) > member.max_outstanding:
                yield f"member {member.id} holds more than its max_outstanding"
        if len(self._records) > self.config.window:
            yield "the window is exceeded"
        if self._records and min(self._records) < self.floor:
            yield "a record below the floor is not settled"


def _expand(pairs: list[int]) -> Iterator[int]:
    for first, count in zip(pairs[::2], pairs[1::2], strict=True):
        yield from range(first, first + count)
