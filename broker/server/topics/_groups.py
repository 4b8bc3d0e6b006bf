"""Consumer groups on the broker: a group per principal, topic and name,
sharing the topic's records among its members (see ``docs/broker.md``,
"Consumer groups").

A :class:`Group` owns the sans-IO :class:`~broker.groups.GroupState` and
does its I/O: it reads the records the state gives a member from the
topic's log and sends them within the member's guarantees (``DeliverGroup``
frames), publishes dead letters, keeps its state in the state journal and
holds retention at its floor while it has members. A member is a
:class:`GroupSubscription` of a connection; :class:`Groups` keeps the
broker's groups and runs their clock (``ack_wait``, delayed retries, the
journal writes).

What survives a ``kill -9``: every settle applied. The offsets a Settle
frame settles are written to the journal (space :data:`SETTLED`) before
the connection reads its next frame, and the group's whole state every
:data:`FLUSH_SECONDS` while it changes (the settled records since are then
deleted). A record settled *done* is never delivered again after a
restart (unless the journal could not be written: the disk full, logged);
a record never settled is always delivered again. In cluster mode the
"journal" is the cluster's (``storage/_cluster_groups.py``, a
:class:`GroupJournal`): the group's whole state is written there late, and
what it settled since is kept in memory only.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from typing import Any, Protocol

import trio

from accounts import Account, LoanedItem, unlimited
from broker.groups import (
    DeadLetter,
    GroupConfig,
    GroupRequest,
    GroupState,
    Member,
    Outcome,
    Taken,
    dead_letters_default,
)
from broker.protocol.frames import decode_deliver_tail, encode_deliver_tail

from ..storage._store import LogError, Start, StoreReader, TopicStore
from ._lossy import OptionError
from ._topic import DELIVER_HEAD_ESTIMATE, Routed, Subscriber, Subscription, Topic

log = logging.getLogger("broker.groups")

__all__ = ["FLUSH_SECONDS", "GROUPS", "Group", "GroupSubscription", "Groups"]

#: The state journal's space of consumer groups (keys as durable cursors').
GROUPS = "groups"
#: The state journal's space of what groups settled since their last state
#: (keys: a group's key, NUL, a serial; values: ``first, count`` pairs).
SETTLED = "groups.settled"
#: How often a group's changed state is written to the journal whole (and
#: its clock looked at); what it settles in between is written at once.
FLUSH_SECONDS = 0.05
#: Records a member is given at a time (round robin among those with room).
TAKE_BATCH = 64
#: Records read from the log at a time to learn their keys.
ADMIT_BATCH = 1024
#: The headers a dead letter carries besides its record's own.
DEAD_LETTER_HEADERS = ("dead-letter.topic", "dead-letter.offset", "dead-letter.group",
                       "dead-letter.deliveries", "dead-letter.reason")  # fmt: skip


def _now_ms() -> int:
    return math.floor(trio.current_time() * 1000)


class GroupMemberConnection(Subscriber, Protocol):
    """What a member needs of its connection (the server's ``Deliveries``)."""

    @property
    def name(self) -> str: ...

    @property
    def root_account(self) -> Account: ...

    def written_later(self, loan: LoanedItem[Any]) -> None: ...

    def room(self, subscription: Subscription) -> int: ...

    def send_group(
        self, subscription: Subscription, first_seq: int, tails: list[bytes],
        offsets: list[int], delivered: list[int],
    ) -> int | None:  # fmt: skip
        """Queue DeliverGroup frames within the guarantees; how many went
        (None: the subscription is being freed)."""
        ...


class GroupJournal(Protocol):
    """Where groups keep their state: the state journal (its spaces
    :data:`GROUPS` and :data:`SETTLED`), or in cluster mode the cluster's
    bucket (``storage/_cluster_groups.py``)."""

    def get(self, space: str, key: str) -> object | None: ...

    def items(self, space: str) -> list[tuple[str, object]]: ...

    def put(self, space: str, key: str, value: object) -> None: ...

    def delete(self, space: str, key: str) -> None: ...

    def write(self) -> None: ...


class GroupsHost(Protocol):
    """What groups need of the broker."""

    def topic(self, name: str) -> Topic: ...

    @property
    def account(self) -> Account: ...


class GroupSubscription(Subscription):
    """One member of a group: a reliable subscription with ``"group"``.

    Its deliveries are numbered per member from 1 (what a ``Settle``
    names); each carries its record's offset and how many times it was
    delivered before. An ``Ack`` says what the client processed, for a
    resume: what it holds above that is sent again, with the same numbers;
    a number it held and lost meanwhile (``ack_wait``) is told with a Gap.
    """

    __slots__ = ("account", "group", "member", "resend")

    group_member = True

    charges_publishers = False
    reads_log = True
    #: Its session's record keeps it: after a restart it is back in its
    #: group (holding nothing), numbering on after what its client processed.
    restorable = True

    def __init__(
        self, connection: GroupMemberConnection, handle: int, group: Group, member: Member
    ) -> None:
        super().__init__(connection, handle, group.topic, "reliable")
        self.connection: GroupMemberConnection = connection
        self.group = group
        self.member = member
        #: Delivery numbers to send again after a resume, in order.
        self.resend: deque[int] = deque()
        self.account: Account = unlimited(
            f"{connection.name}/group/{handle}", parent=connection.root_account, kind="log"
        )

    #: (What the log figures read of a subscription that reads the log.)
    cursor_key: str | None = None
    gaps_sent = 0

    @property
    def lag(self) -> int:
        """Records of the topic its group has not settled."""
        return self.group.state.lag(self.group.log.written_offset + 1)

    @property
    def queued(self) -> int:
        """Deliveries it could be sent now if it had guarantees (0 or more)."""
        return len(self.resend) + (1 if self.group.has_ready else 0)

    @property
    def unacked_deliveries(self) -> int:
        return self.member.outstanding

    def offer(self, account: Account, tails: list[bytes], keys: list[bytes | None]) -> None:
        self.group.pump()

    def pump(self) -> None:
        self.group.pump()

    def ack(self, seq: int) -> None:
        self.acked = max(self.acked, min(seq, self.member.next_seq - 1))

    def settle(
        self, ranges: list[tuple[int, int]], outcome: Outcome, detail: int | str | None
    ) -> None:
        """Settle deliveries (raises :class:`GroupError` for one never sent)."""
        self.group.settle(self, ranges, outcome, detail)

    def restored(self, processed: int) -> None:
        """Restored after a restart: its client processed deliveries up to
        ``processed`` (the next are numbered after them)."""
        self.member.next_seq = max(self.member.next_seq, processed + 1)
        self.acked = processed

    def attach(self, connection: Subscriber, processed: int) -> int:
        """A resumed connection takes over: what the member holds above
        ``processed`` is sent again (same numbers); returns how many. (A
        member restored after a restart numbers on after ``processed``.)"""
        self.connection = connection  # type: ignore[assignment]  # the same connection type
        if processed >= self.member.next_seq:
            self.member.next_seq = processed + 1
        self.ack(processed)
        self.resend = deque(
            seq for seq in range(self.acked + 1, self.member.next_seq) if seq in self.member.held
        )
        gaps = [s for s in range(self.acked + 1, self.member.next_seq) if s not in self.member.held]
        for first, count in _runs(gaps):
            connection.gap(self, first, count)
        self.group.pump()
        return len(self.resend)

    def close(self) -> None:
        """Leave the group: what it holds goes back to the others."""
        self.topic.unsubscribe(self)
        self.group.leave(self)
        self.account.close()


def _runs(seqs: list[int]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for seq in seqs:
        if runs and runs[-1][0] + runs[-1][1] == seq:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((seq, 1))
    return runs


class _DeadLetters:
    """A batch of dead letters on its way into the dead-letter topic (a
    ``RouteOrigin``): once routed, their records are settled."""

    __slots__ = ("group", "offsets")

    def __init__(self, group: Group, offsets: list[int]) -> None:
        self.group = group
        self.offsets = offsets

    def routed(self, routed: Routed) -> None:
        self.group.dead_letters_routed(self)


class Group:
    """One consumer group (see the module)."""

    def __init__(
        self,
        groups: Groups,
        key: str,
        name: str,
        topic: Topic,
        log: TopicStore,
        state: GroupState,
        dead_letters: str,
    ) -> None:
        self.groups = groups
        self.key = key
        self.name = name
        self.topic = topic
        self.log = log
        self.state = state
        self.dead_letters = dead_letters
        self.members: dict[int, GroupSubscription] = {}
        #: Holds retention at the floor while there are members.
        self.holder: StoreReader | None = None
        self.account: Account = unlimited(f"group/{name}", parent=groups.host.account, kind="log")
        #: Dead-letter batches routed but not yet in the log.
        self.dead_in_flight = 0
        #: Keys of its settled records written since its last whole state.
        self.settled_keys: list[str] = []
        self._pumping = False
        self._again = False
        #: While the records just appended are given out: their first
        #: offset and tails (see :meth:`take_live`).
        self._live: tuple[int, list[bytes]] | None = None

    @property
    def config(self) -> GroupConfig:
        return self.state.config

    @property
    def has_ready(self) -> bool:
        return self.state.unsettled > self.state.outstanding or (
            self.state.frontier <= self.log.written_offset and self.state.room_ahead > 0
        )

    # ---------------------------------------------------------------- members

    def join(
        self, connection: GroupMemberConnection, handle: int, max_outstanding: int
    ) -> GroupSubscription:
        member = self.state.join(self.groups.next_member_id(), max_outstanding)
        subscription = GroupSubscription(connection, handle, self, member)
        self.members[member.id] = subscription
        if self.holder is None:
            self.holder = self.log.reader(Start.at(self.state.floor), register=True)
        return subscription

    def leave(self, subscription: GroupSubscription) -> None:
        if self.members.pop(subscription.member.id, None) is None:
            return
        self.state.leave(subscription.member.id)
        self._after_change()
        if not self.members:
            self.groups.write(self)
            if self.holder is not None:
                self.holder.close()
                self.holder = None
                self.topic.reader_moved()
            self.groups.idle(self)
        else:
            self.pump()

    # ---------------------------------------------------------------- settling

    def settle(
        self,
        subscription: GroupSubscription,
        ranges: list[tuple[int, int]],
        outcome: Outcome,
        detail: int | str | None,
    ) -> None:
        self.state.settle(subscription.member, ranges, outcome, detail, _now_ms())
        self.groups.write_settled(self)
        self._after_change()
        self.pump()

    def tick(self, now: int) -> None:
        """The group's clock: ``ack_wait`` and delayed retries, as of ``now``."""
        deadline = self.state.next_deadline()
        if deadline is not None and deadline <= now:
            self.state.tick(now)
            self._after_change()
            self.pump()

    def _after_change(self) -> None:
        """Dead letters due go out; retention follows the floor."""
        due = self.state.dead_letters_due()
        if due:
            self._send_dead_letters(due)
        holder = self.holder
        if holder is not None and self.state.floor > holder.position:
            holder.advance_to(self.state.floor)
            self.topic.reader_moved()

    def _send_dead_letters(self, due: list[DeadLetter]) -> None:
        tails: list[bytes] = []
        keys: list[bytes | None] = []
        offsets: list[int] = []
        for letter in due:
            tail = self._read_one(letter.offset)
            if tail is None:
                self.state.drop(letter.offset)  # (gone from the log: nothing to keep)
                continue
            payload, key, headers = decode_deliver_tail(tail)
            extra = [
                (DEAD_LETTER_HEADERS[0], self.topic.topic_name.encode()),
                (DEAD_LETTER_HEADERS[1], str(letter.offset).encode()),
                (DEAD_LETTER_HEADERS[2], self.name.encode()),
                (DEAD_LETTER_HEADERS[3], str(letter.deliveries).encode()),
                (DEAD_LETTER_HEADERS[4], letter.reason.encode()),
            ]
            tails.append(encode_deliver_tail(payload, key, list(headers or []) + extra))
            keys.append(key)
            offsets.append(letter.offset)
        if not tails:
            return
        target = self.groups.host.topic(self.dead_letters)
        target.publishers += 1  # kept alive until routed
        batch = _DeadLetters(self, offsets)
        self.dead_in_flight += 1
        target.send_nowait(
            Routed(tails, batch, 0, 0, keys), account=self.account, cost=sum(map(len, tails))
        )

    def dead_letters_routed(self, batch: _DeadLetters) -> None:
        """A batch of dead letters is in the dead-letter topic's log."""
        self.dead_in_flight -= 1
        target = self.groups.host.topic(self.dead_letters)
        target.publishers -= 1
        for offset in batch.offsets:
            self.state.dead_lettered(offset)
        self.groups.write_settled(self)
        self._after_change()
        self.pump()
        if not self.members:
            self.groups.write(self)
            self.groups.idle(self)

    # ---------------------------------------------------------------- sending

    def take_live(self, tails: list[bytes], first: int) -> None:
        """Records were appended from offset ``first``, these ``tails``:
        give them out (those given now are sent as they are, without
        reading them back from the log)."""
        self._live = (first, tails)
        try:
            self.pump()
        finally:
            self._live = None

    def pump(self) -> None:
        """Take in what the log has written (within the window) and give
        ready records to members with room, round robin, until none can
        take more; then wait for the next append if the log is done."""
        if self._pumping:
            self._again = True
            return
        self._pumping = True
        try:
            self._again = True
            while self._again:
                self._again = False
                self._pump_once()
        finally:
            self._pumping = False

    def _pump_once(self) -> None:
        if self.log.closed or not self.members:
            return
        state = self.state
        self._admit()
        now = _now_ms()
        progress = True
        while progress:
            progress = False
            for member in state.order():
                subscription = self.members.get(member.id)
                if subscription is None:
                    continue
                connection = subscription.connection
                room = connection.room(subscription)
                if room <= 0:
                    connection.subscription_stalled(subscription)
                    continue
                if subscription.resend:
                    if self._resend(subscription):
                        progress = True
                    continue
                taken = state.take(member, TAKE_BATCH, now)
                if taken is None:
                    continue
                sent = self._send(subscription, taken)
                state.untake(member, taken, sent)
                if sent:
                    progress = True
                if sent < len(taken.offsets):
                    connection.subscription_stalled(subscription)
            if progress:
                self._admit()
        if state.frontier > self.log.written_offset:
            self.topic.wait_for_records(self)

    def _admit(self) -> None:
        """Records the log has written come into the window."""
        state = self.state
        log = self.log
        while state.room_ahead > 0 and state.frontier <= log.written_offset:
            count = min(state.room_ahead, log.written_offset + 1 - state.frontier)
            if not state.config.ordering_by_key:
                if state.frontier < log.first_offset:
                    state.skip_to(log.first_offset)
                    continue
                state.admit(state.frontier, count)
                continue
            try:
                run = log.read(state.frontier, min(count, ADMIT_BATCH), 1 << 20)
            except LogError:
                return
            if run.gap:
                state.skip_to(run.first_offset)
            if not run.tails:
                return
            keys = [decode_deliver_tail(bytes(tail))[1] for tail in run.tails]
            state.admit(run.first_offset, keys)

    def _read(self, offsets: list[int]) -> list[bytes] | None:
        """The tails of records ``offsets`` (None: one is gone, and dropped)."""
        live = self._live
        if live is not None:
            first = offsets[0]
            start = first - live[0]
            consecutive = offsets[-1] - first == len(offsets) - 1
            if consecutive and start >= 0 and start + len(offsets) <= len(live[1]):
                return live[1][start : start + len(offsets)]
        tails: list[Any] = []  # (bytes, or views of the log's)
        index = 0
        log = self.log
        while index < len(offsets):
            first = offsets[index]
            count = 1
            while index + count < len(offsets) and offsets[index + count] == first + count:
                count += 1
            got = 0
            while got < count:
                try:
                    run = log.read(first + got, count - got, 1 << 20)
                except LogError:
                    return None
                if run.gap or not run.tails:
                    self.state.drop(first + got)
                    return None
                tails.extend(run.tails[: count - got])
                got += min(len(run.tails), count - got)
            index += count
        return tails

    def _read_one(self, offset: int) -> bytes | None:
        try:
            run = self.log.read(offset, 1, 1 << 20)
        except LogError:
            return None
        if run.gap or not run.tails or run.first_offset != offset:
            return None
        return bytes(run.tails[0])

    def _send(self, subscription: GroupSubscription, taken: Taken) -> int:
        """Send what ``taken`` gave the member, as far as its guarantees
        allow; how many went."""
        tails = self._read(taken.offsets)
        if tails is None:
            return 0
        connection = subscription.connection
        sent = connection.send_group(
            subscription, taken.first_seq, tails, taken.offsets, taken.delivered
        )
        if not sent:
            return 0
        cost = sum(map(len, tails[:sent])) + DELIVER_HEAD_ESTIMATE * sent
        connection.written_later(LoanedItem(subscription.account, cost, None))
        subscription.delivered += sent
        return sent

    def _resend(self, subscription: GroupSubscription) -> bool:
        """Send again what the member held when its connection was replaced."""
        held = subscription.member.held
        resend = subscription.resend
        while resend and resend[0] not in held:
            resend.popleft()
        if not resend:
            return False
        seqs = [resend[0]]
        while (
            len(seqs) < TAKE_BATCH and len(resend) > len(seqs) and resend[len(seqs)] == seqs[-1] + 1
        ):
            if resend[len(seqs)] not in held:
                break
            seqs.append(resend[len(seqs)])
        records = [held[s] for s in seqs]
        offsets = [r.offset for r in records]
        tails = self._read(offsets)
        if tails is None:
            return True
        connection = subscription.connection
        sent = connection.send_group(
            subscription, seqs[0], tails, offsets, [r.deliveries - 1 for r in records]
        )
        for _ in range(sent or 0):
            resend.popleft()
        if sent:
            cost = sum(map(len, tails[:sent])) + DELIVER_HEAD_ESTIMATE * sent
            connection.written_later(LoanedItem(subscription.account, cost, None))
        return bool(sent)

    # ---------------------------------------------------------------- figures

    def statistics(self) -> dict[str, int]:
        """The group's figures, as ``broker stat`` and the metrics show them."""
        state = self.state
        return {
            "members": len(self.members),
            "outstanding": state.outstanding,
            "lag": state.lag(self.log.written_offset + 1),
            "floor": state.floor,
            "settled": state.settled,
            "redelivered": state.redelivered,
            "dead_lettered": state.dead_lettered_count,
            "expired": state.expired,
            "late_settles": state.late_settles,
        }


class Groups:
    """The broker's consumer groups (a broker with topic logs has them)."""

    def __init__(self, host: GroupsHost, journal: GroupJournal) -> None:
        self.host = host
        self.journal = journal
        self.groups: dict[str, Group] = {}
        self._members = 0
        #: Numbers the journal keys of settled records (see :data:`SETTLED`).
        self._serial = 0
        #: What groups settled after their last whole state, per group key,
        #: as the journal had it at the start (taken by the group's load).
        self._settled_at_start: dict[str, list[str]] = {}
        for key, _ in journal.items(SETTLED):
            group, _, serial = key.rpartition("\x00")
            self._settled_at_start.setdefault(group, []).append(key)
            if serial.isdigit():
                self._serial = max(self._serial, int(serial) + 1)

    def next_member_id(self) -> int:
        self._members += 1
        return self._members

    def join(
        self,
        connection: GroupMemberConnection,
        handle: int,
        topic: Topic,
        request: GroupRequest,
        start: Start,
        principal: str | None,
        *,
        lenient: bool = False,
    ) -> GroupSubscription:
        """``connection``'s subscription ``handle`` joins the group
        ``request`` names (made, or read from the journal, on first use;
        raises :class:`OptionError` for options the group does not have,
        unless ``lenient``: then it joins with the group's)."""
        log = topic.log
        if log is None:
            raise OptionError('"group" needs a broker with a data directory (topic logs)')
        key = "\x00".join((principal or "", topic.topic_name, request.name))
        group = self.groups.get(key)
        dead_letters = request.dead_letters or dead_letters_default(topic.topic_name)
        if dead_letters == topic.topic_name:
            raise OptionError('"dead_letters" must name another topic than the group\'s own')
        if group is not None and group.members:
            config = request.config(group.config)
            if not lenient and (
                config != group.config
                or (request.dead_letters is not None and dead_letters != group.dead_letters)
            ):
                raise OptionError(
                    f"group {request.name!r} has members with other options "
                    f"(ack_wait {group.config.ack_wait_ms} ms, max_deliveries "
                    f"{group.config.max_deliveries}, ordering "
                    f"{'key' if group.config.ordering_by_key else 'none'}, dead_letters "
                    f"{group.dead_letters!r}): give the same, or none"
                )
        elif group is not None:
            # No members: it takes the options given (its position stays).
            config = request.config(group.config)
            if config != group.config:
                group.state = GroupState.restored(config, group.state.snapshot())
            if request.dead_letters is not None:
                group.dead_letters = dead_letters
        else:
            group = self._load(key, request, topic, log, start, dead_letters)
            self.groups[key] = group
            self.write(group)
        return group.join(connection, handle, request.max_outstanding)

    def _load(
        self,
        key: str,
        request: GroupRequest,
        topic: Topic,
        topic_log: TopicStore,
        start: Start,
        dead_letters: str,
    ) -> Group:
        """A group from its journal entry, or new at ``start``."""
        stored = self.journal.get(GROUPS, key)
        settled_keys = self._settled_at_start.pop(key, [])
        settled: list[int] = []
        for settled_key in settled_keys:
            pairs = self.journal.get(SETTLED, settled_key)
            if isinstance(pairs, list) and all(type(v) is int for v in pairs):
                for first, count in zip(pairs[::2], pairs[1::2], strict=False):
                    settled.extend(range(first, first + count))
        if isinstance(stored, dict):
            previous = _config(stored.get("config"))
            if request.dead_letters is None and type(stored.get("dead_letters")) is str:
                dead_letters = stored["dead_letters"]
            try:
                state = GroupState.restored(request.config(previous), stored.get("state"), settled)
            except ValueError:
                log.error(
                    "group %r of %r: its stored state is damaged; it starts again at %s",
                    request.name,
                    topic.topic_name,
                    start.kind,
                )
            else:
                group = Group(self, key, request.name, topic, topic_log, state, dead_letters)
                group.settled_keys = settled_keys
                return group
        floor = topic_log.reader(start, register=False).position
        state = GroupState(request.config(), floor)
        return Group(self, key, request.name, topic, topic_log, state, dead_letters)

    def write_settled(self, group: Group) -> None:
        """Keep what ``group`` settled since its last write in the journal
        now (a few pairs: cheaper than its whole state)."""
        settled = group.state.take_settled()
        if not settled:
            return
        key = f"{group.key}\x00{self._serial}"
        self._serial += 1
        self.journal.put(SETTLED, key, _ranges(sorted(settled)))
        group.settled_keys.append(key)
        self._write()

    def write(self, group: Group) -> None:
        """Keep ``group``'s whole state in the journal now (and forget what
        it settled since the last: the state has it)."""
        config = group.config
        self.journal.put(
            GROUPS,
            group.key,
            {
                "state": group.state.snapshot(),
                "config": [config.ack_wait_ms, config.max_deliveries, config.ordering_by_key],
                "dead_letters": group.dead_letters,
            },
        )
        for key in group.settled_keys:
            self.journal.delete(SETTLED, key)
        group.settled_keys = []
        self._write()

    def _write(self) -> None:
        try:
            self.journal.write()
        except LogError as error:
            log.error("writing the state journal failed: %s", error)

    def forget_topic(self, topic: str) -> int:
        """Forget every group of ``topic`` (it was deleted; its members are
        gone): their state in the journal too. Returns how many there were."""
        forgotten = 0
        for key, _ in list(self.journal.items(GROUPS)):
            parts = key.split("\x00")
            if len(parts) != 3 or parts[1] != topic:
                continue
            self._drop(key)
            forgotten += 1
        if forgotten:
            self._write()
        return forgotten

    def stored(self) -> list[tuple[str, str, str, int | None]]:
        """Every group the journal keeps, as ``(principal, topic, name,
        floor)`` (floor: the first offset not settled; None if unreadable)."""
        found: list[tuple[str, str, str, int | None]] = []
        for key, value in self.journal.items(GROUPS):
            parts = key.split("\x00")
            if len(parts) != 3:
                continue
            state = value.get("state") if isinstance(value, dict) else None
            floor = state[1] if isinstance(state, list) and len(state) > 1 else None
            found.append((parts[0], parts[1], parts[2], floor if type(floor) is int else None))
        return found

    def forget(self, principal: str, topic: str, name: str) -> int | None:
        """Forget group ``name`` of ``principal`` on ``topic`` (its state in
        the journal too); returns how many members it has if it has any
        (then nothing is forgotten), else None. Raises :class:`KeyError`
        if there is no such group."""
        key = "\x00".join((principal, topic, name))
        group = self.groups.get(key)
        if group is not None and group.members:
            return len(group.members)
        if group is None and self.journal.get(GROUPS, key) is None:
            raise KeyError(key)
        self._drop(key)
        self._write()
        return None

    def _drop(self, key: str) -> None:
        """Forget group ``key`` here and in the journal (written with the next write)."""
        group = self.groups.pop(key, None)
        if group is not None:
            group.account.close()
        self.journal.delete(GROUPS, key)
        self._settled_at_start.pop(key, None)
        for settled, _ in list(self.journal.items(SETTLED)):
            if settled.startswith(key + "\x00"):
                self.journal.delete(SETTLED, settled)

    def count_by_topic(self) -> dict[str, int]:
        """How many groups each topic has (kept in the journal)."""
        counts: dict[str, int] = {}
        for key, _ in self.journal.items(GROUPS):
            parts = key.split("\x00")
            if len(parts) == 3:
                counts[parts[1]] = counts.get(parts[1], 0) + 1
        return counts

    def idle(self, group: Group) -> None:
        """Forget a group without members once nothing of it is under way
        (its state is in the journal)."""
        if not group.members and not group.dead_in_flight and self.groups.get(group.key) is group:
            del self.groups[group.key]
            group.account.close()

    def tick(self) -> None:
        """Run every group's clock and write the changed ones."""
        now = _now_ms()
        for group in list(self.groups.values()):
            group.tick(now)
            if group.state.dirty:
                self.write(group)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The groups' clock, every :data:`FLUSH_SECONDS` (until cancelled)."""
        task_status.started()
        while True:
            await trio.sleep(FLUSH_SECONDS)
            if self.groups:
                self.tick()

    def close(self) -> None:
        """Write every group's state (the broker is stopping)."""
        for group in list(self.groups.values()):
            self.write(group)


def _ranges(offsets: list[int]) -> list[int]:
    """Sorted ``offsets`` as flat ``first, count`` pairs."""
    pairs: list[int] = []
    for offset in offsets:
        if pairs and pairs[-2] + pairs[-1] == offset:
            pairs[-1] += 1
        elif not pairs or pairs[-2] + pairs[-1] <= offset:
            pairs += (offset, 1)
    return pairs


def _config(value: object) -> GroupConfig | None:
    if (
        isinstance(value, list)
        and len(value) == 3
        and type(value[0]) is int
        and type(value[1]) is int
        and type(value[2]) is bool
    ):
        return GroupConfig(value[0], value[1], value[2])
    return None
