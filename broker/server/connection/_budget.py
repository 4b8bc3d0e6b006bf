"""One connection's receive buffers: who gets the connection budget, and when.

A new publish channel asks for ``publish_capacity`` bytes; when the
connection's (or the broker's, or the principal's) budget is short, it gets
one frame (``max_frame + 64``). When not even that is left, idle channels
(nothing buffered; quiet ones first) are halved, down to one frame, pleading
with their sender to give the rest back. A channel that still gets nothing
starts with none: it is *starved*, and funded, in the order the channels
were opened, as soon as room frees up (a shrink completes, a handle is
freed). The client is told (``Throttled``) at once, unless the shrinks under
way will fund it (then only if that takes ``throttle_notice_after``): it is
up to the client to free a handle. A busy channel below ``publish_capacity``
takes room back from channels quiet for ``IDLE_AFTER`` seconds.

A new channel is funded while the protocol handles the read that bound it
(the protocol asks its policy): :meth:`ConnectionBudget.quote` is then a
pure computation over a snapshot (the ledger's numbers, and the grants of
the read so far, :attr:`ConnectionBudget.pending`): it reads no clock,
writes nothing and calls nothing of the protocol. The connection books the
grants (:meth:`ConnectionBudget.book`: the ledger, the starved queue and
its times) once ``receive_data`` has returned, before it acts on the
read's events. Whatever acts on other channels (shrinking idle ones,
topping up a channel that got less than it asked for, funding starved
ones) waits for :meth:`settle`, which the connection calls after that.

The subscription bind channel ``[1, 0]`` grows as subscriptions are made
(every live subscription keeps its Subscribe frame's bytes charged there),
but never offers room for more Subscribe frames than the connection may
still make under ``max_subscriptions``: the broker keeps that many bound at
most, and says ``Throttled`` on ``[1, 0]`` when the limit is what holds the
room back. Those bytes are bounded by ``max_subscriptions``, not by
``connection_budget``: only the first ``bind_capacity`` of each bind channel
counts against the budgets (bind frames are counted, never stored).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol

import trio

from broker.config import BrokerConfig
from broker.protocol import (
    SUBSCRIPTION_BINDS,
    Channel,
    ChannelKind,
    Connection,
    DeliveryMode,
    LocalProtocolError,
    Subscribe,
)
from broker.protocol.connection import HandleState
from broker.protocol.frames import encode
from broker.protocol.guarantees import ChannelReceiver

#: A publish channel with nothing buffered and no publish for this long is
#: quiet: a busy channel may take its room.
IDLE_AFTER = 1.0
#: A busy channel below ``publish_capacity`` asks for more at most this often.
GROW_EVERY = 0.25
#: The smallest Subscribe frame there can be: room for ``n`` more
#: subscriptions is at most ``n`` times this many bytes.
SMALLEST_SUBSCRIBE = min(len(encode(Subscribe(0, mode, {}))) for mode in DeliveryMode.ALL)


class Ledger(Protocol):
    """Where a connection's reserved capacity is booked (the connection, the
    broker and the principal's usage)."""

    buffer_reserved: int

    def reserve(self, amount: int) -> None:
        """Book ``amount`` more bytes (negative: fewer) as reserved."""
        ...

    def spare_budget(self) -> int:
        """What the broker's and the principal's budgets still allow."""
        ...

    def broker_spare(self) -> int:
        """What the broker's budget alone still allows."""
        ...


class Pool(Protocol):
    """The broker's pool of connection budgets (``_budget_pool.BudgetPool``)."""

    def short(self, member: ConnectionBudget, needed: int) -> None: ...

    def reclaim_for(self, member: ConnectionBudget, needed: int) -> None: ...

    def freed(self) -> None: ...


class Wakeable(Protocol):
    """The connection's writer wake-up."""

    def set(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Grant:
    """The capacity the policy gave a new receiving channel, to be booked
    (:meth:`ConnectionBudget.book`) once the protocol call that opened it
    has returned."""

    channel: Channel
    capacity: int
    #: A publish channel's ask (``publish_capacity``); 0: not a publish channel.
    wanted: int = 0
    #: A publish channel queued behind channels already starved (it gets
    #: nothing, and the ledger is not looked at).
    behind: bool = False


class ConnectionBudget:
    """The receive-buffer decisions of one connection (see the module).

    Set :attr:`protocol` once the connection's protocol exists; call
    :meth:`book` after each call of the protocol that may open receiving
    channels (``receive_data``, ``welcome``), :meth:`settle` after each read
    and whenever capacity may have freed up, and wake the writer when it
    returns True. :meth:`quote` (what the policy calls while the protocol
    handles a read) only computes: it never reads the clock, writes the
    ledger or calls the protocol.
    """

    def __init__(self, config: BrokerConfig, ledger: Ledger) -> None:
        self.config = config
        self.ledger = ledger
        self.protocol: Connection
        #: Publish channels opened without capacity, oldest first, and since when.
        self.starved: OrderedDict[Channel, float] = OrderedDict()
        #: Those the client was told about (Throttled).
        self._advised: set[Channel] = set()
        #: When each publish channel last received a publish.
        self._active: dict[int, float] = {}
        self._next_growth: dict[int, float] = {}
        #: A busy channel's last look found no room to grow into: until then
        #: (``GROW_EVERY`` later, or a handle freed) no busy channel looks,
        #: so that many channels short of room cost one survey a period, not
        #: one each.
        self._no_room_until = 0.0
        #: The subscription bind channel needs sizing (subscriptions changed).
        self._binds_dirty = False
        #: The client was told that the subscription limit holds back [1, 0].
        self.subscription_limit_advised = False
        #: The ledger as :meth:`quote` sees it: the capacity in use (as of the
        #: last survey, plus what was opened since). It only ever
        #: overestimates what is in use.
        self._in_use = 0
        #: The ledger may overestimate (handles went, shrinks are under way):
        #: the next settle surveys again.
        self._stale = False
        #: Publish channels opened with less than they asked for (how much):
        #: the next settle shrinks idle channels for them and tops them up.
        self._short: dict[Channel, int] = {}
        #: The broker's pool (None: on its own) and this connection's writer
        #: wake-up, for what the pool has it do (see ``_budget_pool``).
        self.pool: Pool | None = None
        self.wake: Wakeable | None = None
        #: When starved channels last asked the pool for room.
        self._asked_pool = -float("inf")
        #: What the policy granted since the last :meth:`book`, in order
        #: (the policy appends; :meth:`book` books and empties).
        self.pending: list[Grant] = []

    # ---------------------------------------------------------------- accounting

    def capacity_in_use(self) -> int:
        """Capacity counted against the budgets: every publish channel's, and
        each bind channel's up to ``bind_capacity``."""
        return self._survey()[0]

    def _counted(self, grant: Grant) -> int:
        """What ``grant`` adds to the capacity counted against the budgets."""
        kind = grant.channel.kind
        if kind == ChannelKind.PUBLISH:
            return grant.capacity
        if kind == ChannelKind.DELIVER:
            return 0
        return min(grant.capacity, self.config.bind_capacity)

    def _survey(self) -> tuple[int, bool, int]:
        """:meth:`capacity_in_use`; whether an idle publish channel is above
        one frame (so that shrinking could free something); and how much
        shrinks under way will free (once the senders absolve). Grants not
        booked yet are booked first (the protocol has their channels)."""
        if self.pending:
            self.book()
        protocol = self.protocol
        bind_capacity = self.config.bind_capacity
        floor = self.config.min_publish_capacity
        total = pending = 0
        shrinkable = False
        for channel in protocol.receiving_channels:
            receiver = protocol.receiver(channel)
            capacity = receiver.capacity
            if channel.kind == ChannelKind.PUBLISH:
                total += capacity
                shrinkable = shrinkable or (capacity > floor and not receiver.buffered)
                target = receiver.target_capacity
                if target is not None:
                    pending += capacity - target
            elif channel.kind != ChannelKind.DELIVER:
                total += min(capacity, bind_capacity)
        self._in_use = total
        # (A shrink completes when the sender absolves: survey again until then.)
        self._stale = pending > 0
        return total, shrinkable, pending

    def available(self) -> int:
        """Capacity a channel may be given now (negative when over budget);
        books the capacity in use first."""
        return self._available()[0]

    def _available(self) -> tuple[int, bool, int]:
        """:meth:`available`, and the rest of :meth:`_survey`."""
        in_use, shrinkable, pending = self._survey()
        self._sync_ledger(in_use)
        ledger = self.ledger
        spare = min(self.config.connection_budget - in_use, ledger.spare_budget())
        return spare, shrinkable, pending

    # ---------------------------------------------------------------- publish channels

    def quote(self, channel: Channel) -> Grant:
        """Capacity for a new publish channel (0: starved, funded later),
        computed from a snapshot: the ledger's numbers as they are, and the
        grants not booked yet (:attr:`pending`). Reads no clock and writes
        nothing: the caller appends the grant to :attr:`pending`, and
        :meth:`book` books it. A channel that gets less than
        ``publish_capacity`` is noted when booked, and the next
        :meth:`settle` shrinks idle channels for it and tops it up (or
        funds it, if starved)."""
        config = self.config
        want = config.publish_capacity
        pending = self.pending
        starved = bool(self.starved) or any(
            g.wanted and not g.capacity for g in pending
        )  # (those opened before it come first)
        if starved:
            return Grant(channel, 0, want, behind=True)
        ledger = self.ledger
        in_use = self._in_use + sum(self._counted(g) for g in pending)
        # (As if the ledger were booked up to ``in_use`` first: the broker's
        # and the principal's spare shrink by as much as it grows.)
        spare = ledger.spare_budget() - (in_use - ledger.buffer_reserved)
        available = min(config.connection_budget - in_use, spare)
        return Grant(channel, self._grant(available), want)

    def book(self) -> None:
        """Book what the policy granted (:attr:`pending`) since the last
        call, in order: reserve it in the ledger, note channels that got
        less than they asked for, queue starved ones (since now). Called
        once the protocol call that opened the channels has returned."""
        pending = self.pending
        if not pending:
            return
        self.pending = []
        now = trio.current_time()
        ledger = self.ledger
        for grant in pending:
            channel = grant.channel
            if not grant.wanted:
                self._in_use += self._counted(grant)
                continue
            if grant.behind:
                self.starved[channel] = now
                continue
            self._sync_ledger(self._in_use)
            if grant.capacity < grant.wanted:
                self._short[channel] = grant.wanted
            if not grant.capacity:
                self.starved[channel] = now
                continue
            self._in_use += grant.capacity
            ledger.reserve(grant.capacity)

    def _top_up_short(self) -> bool:
        """For each channel opened with less than it asked for: shrink idle
        channels as far as needed, and grant it the rest if room allows (all
        of it: see :meth:`_grant`). A starved one is left to the starved
        queue. True if something was queued."""
        short, self._short = self._short, {}
        queued = False
        for channel, want in short.items():
            if not self._has(channel):
                continue  # freed meanwhile
            receiver = self.protocol.receiver(channel)
            missing = want - receiver.capacity
            if missing <= 0:
                continue
            available, shrinkable, _ = self._available()
            if available < missing and shrinkable:
                self._shrink_idle(missing - available, exclude=channel.index, quiet_only=False)
                available = self.available()
            if channel in self.starved or available < missing or not self._may_advise(channel):
                continue
            self.ledger.reserve(missing)
            self._in_use += missing
            self.protocol.grow(channel, missing)
            queued = True
        return queued

    def _grant(self, available: int) -> int:
        """What a new channel gets out of ``available`` bytes: all it asks
        for, or (the budget being short) one frame; 0 if not even that. (A
        share of what is left would only be pleaded back for the next one.)"""
        config = self.config
        if available >= config.publish_capacity:
            return config.publish_capacity
        return config.min_publish_capacity if available >= config.min_publish_capacity else 0

    def note_busy(self, channel: Channel, now: float) -> None:
        """Publishes arrived on ``channel``: it is active, and if it was
        shrunk it takes room back (from quiet channels, if need be)."""
        index = channel.index
        self._active[index] = now
        due = self._next_growth.get(index)
        if due is None:  # (a channel is busy if still so a while later)
            self._next_growth[index] = now + GROW_EVERY
        if due is None or now < due or self.starved or now < self._no_room_until:
            return
        want = self.config.publish_capacity
        try:
            receiver = self.protocol.receiver(channel)
        except LocalProtocolError:
            return  # freed
        self._next_growth[index] = now + GROW_EVERY
        if receiver.capacity >= want or receiver.target_capacity is not None:
            return
        missing = want - receiver.capacity
        available, shrinkable, _ = self._available()
        if available < missing and shrinkable:
            self._shrink_idle(missing - available, exclude=index, quiet_only=True)
            available = self.available()
        pool = self.pool
        if available < missing and pool is not None and self.ledger.broker_spare() < missing:
            # (The broker's budget is short: quiet channels elsewhere give back.)
            pool.reclaim_for(self, missing - max(available, 0))
        grant = min(missing, available)
        if grant <= 0:
            self._no_room_until = now + GROW_EVERY
        elif self._may_advise(channel):
            self.ledger.reserve(grant)
            self._in_use += grant
            self.protocol.grow(channel, grant)

    def forget(self, channel: Channel) -> None:
        """``channel``'s handle is gone."""
        self._stale = True  # its capacity went with it
        self._no_room_until = 0.0
        self._short.pop(channel, None)
        self.starved.pop(channel, None)
        self._advised.discard(channel)
        self._active.pop(channel.index, None)
        self._next_growth.pop(channel.index, None)

    def _shrink_idle(self, needed: int, *, exclude: int, quiet_only: bool) -> int:
        """Halve idle publish channels (biggest first, quiet ones before the
        others), down to one frame, until ``needed`` bytes are on their way
        back; returns how many are. Only channels the protocol still has are
        looked at: handles freed in the read being handled are gone from it
        already."""
        protocol = self.protocol
        floor = self.config.min_publish_capacity
        now = trio.current_time()
        candidates: list[tuple[bool, int, ChannelReceiver]] = []
        for channel in protocol.receiving_channels:
            if channel.kind != ChannelKind.PUBLISH or channel.index == exclude:
                continue
            receiver = protocol.receiver(channel)
            if receiver.buffered or receiver.capacity <= floor:
                continue
            last = self._active.get(channel.index)
            recent = last is not None and now - last < IDLE_AFTER
            if recent and quiet_only:
                continue
            candidates.append((recent, -receiver.capacity, receiver))
        candidates.sort(key=lambda entry: entry[:2])
        pleaded = 0
        for _, _, receiver in candidates:
            if pleaded >= needed:
                break
            before = receiver.capacity
            target = max(floor, before // 2)
            protocol.set_capacity(receiver.channel, target)
            self._stale = True
            pleaded += before - target  # reclaimed now, or once the sender absolves
        return pleaded

    def _prune_starved(self) -> None:
        """Drop starved channels whose handle was freed."""
        for channel in [c for c in self.starved if not self._has(c)]:
            del self.starved[channel]
            self._advised.discard(channel)

    def _has(self, channel: Channel) -> bool:
        try:
            self.protocol.receiver(channel)
        except LocalProtocolError:
            return False
        return True

    def _may_advise(self, channel: Channel) -> bool:
        """The broker may still send about ``channel`` (its handle is neither
        freed nor being freed)."""
        binding = self.protocol.topics.get(channel.index)
        return binding is not None and binding.state is HandleState.BOUND and self._has(channel)

    # ---------------------------------------------------------------- settling

    def settle(self) -> bool:
        """Fund starved channels that room now allows (oldest first), tell
        the client about the ones still starved, and size the subscription
        bind channel; True if something was queued to send."""
        self.book()  # (the connection did already after the read)
        protocol = self.protocol
        if protocol.closed or not (self.starved or self._binds_dirty or self._short):
            if self._stale and not protocol.closed:
                self._book()
            return False
        queued = False
        if self._short:
            queued = self._top_up_short()
        if self.starved:
            self._prune_starved()
            while self.starved:
                channel = next(iter(self.starved))
                grant = self._grant(self.available())
                if not grant:
                    break
                del self.starved[channel]
                self.ledger.reserve(grant)
                self._in_use += grant
                protocol.grow(channel, grant)
                if channel in self._advised:
                    self._advised.discard(channel)
                    if self._may_advise(channel):
                        protocol.throttled(channel, False)
                queued = True
            if self.starved:
                self._ask_pool()
                queued = self._advise_starved() or queued
        if self._binds_dirty:
            queued = self._size_subscription_binds() or queued
        if self._stale:
            self._book()
        return queued

    def _book(self) -> None:
        """Survey, and book what is in use in the ledger."""
        self._sync_ledger(self._survey()[0])

    def _sync_ledger(self, in_use: int) -> None:
        """Book ``in_use`` as this connection's reservation: room that shrinks
        and freed handles gave back is the broker's again (the pool hears)."""
        ledger = self.ledger
        change = in_use - ledger.buffer_reserved
        if change:
            ledger.reserve(change)
            if change < 0 and self.pool is not None:
                self.pool.freed()

    def _ask_pool(self) -> None:
        """Starved for want of the broker's budget (not this connection's or
        its principal's): have other connections' quiet channels give room
        back, at most once per ``IDLE_AFTER``; the pool funds these channels
        once room is freed."""
        pool = self.pool
        floor = self.config.min_publish_capacity
        if pool is None or self.ledger.broker_spare() >= floor:
            return
        now = trio.current_time()
        if now - self._asked_pool < IDLE_AFTER:
            return
        self._asked_pool = now
        pool.short(self, floor * len(self.starved))

    # ---------------------------------------------------------------- the pool's calls

    def reclaim_quiet(self, needed: int) -> int:
        """Shrink this connection's quiet publish channels for ``needed``
        bytes of another's; returns the bytes pleaded back."""
        if self.protocol.closed:
            return 0
        pleaded = self._shrink_idle(needed, exclude=-1, quiet_only=True)
        if pleaded and self.wake is not None:
            self.wake.set()
        return pleaded

    def fund_starved(self) -> bool:
        """Fund the starved channels room allows now; whether some still starve."""
        if self.protocol.closed:
            return False
        if self.settle() and self.wake is not None:
            self.wake.set()
        return bool(self.starved)

    def _advise_starved(self) -> bool:
        """Tell the client (Throttled) about the starved channels that no
        shrink under way will fund, and about those starved for longer than
        ``throttle_notice_after``: then it is up to the client to free a
        handle. True if something was queued."""
        advised = self._advised
        if len(advised) == len(self.starved):
            return False
        available, _, pending = self._available()
        fundable = max(available + pending, 0) // self.config.min_publish_capacity
        patience = trio.current_time() - self.config.throttle_notice_after
        queued = False
        for position, (channel, since) in enumerate(self.starved.items()):
            if channel in advised or (position < fundable and since > patience):
                continue
            if self._may_advise(channel):
                self.protocol.throttled(channel, True)
                advised.add(channel)
                queued = True
        return queued

    # ---------------------------------------------------------------- subscriptions

    def subscriptions_changed(self) -> None:
        """Subscriptions were made or freed: size ``[1, 0]`` at the next settle."""
        self._binds_dirty = True

    def subscription_room(self) -> int:
        """Free room ``[1, 0]`` may have: ``bind_capacity``, but never room for
        more Subscribe frames than the connection may still make."""
        left = max(self.config.max_subscriptions - len(self.protocol.subscriptions), 0)
        return min(self.config.bind_capacity, left * SMALLEST_SUBSCRIBE)

    def subscription_issue_cap(self, receiver: ChannelReceiver) -> int:
        """The most that may be issued on ``[1, 0]`` now: the client never
        holds guarantees beyond :meth:`subscription_room` (a negative balance,
        optimistic frames accepted, is always confirmed)."""
        return max(self.subscription_room() - receiver.sender_balance, 0)

    def _size_subscription_binds(self) -> bool:
        self._binds_dirty = False
        self._stale = True  # (the bind channel may change size)
        protocol = self.protocol
        try:
            receiver = protocol.receiver(SUBSCRIPTION_BINDS)
        except LocalProtocolError:
            return False  # before the Welcome
        queued = False
        room = self.subscription_room()
        free = receiver.capacity - receiver.buffered
        near_limit = room < self.config.bind_capacity
        if free > room:
            # Unpromised (the issue cap saw to it): reclaimed at once.
            protocol.set_capacity(
                SUBSCRIPTION_BINDS, receiver.capacity - (free - room), plead=False
            )
        elif free < room and (near_limit or 2 * free < room):
            issued = receiver.issued_total
            protocol.grow(SUBSCRIPTION_BINDS, room - free)
            queued = receiver.issued_total != issued
        if near_limit != self.subscription_limit_advised:
            self.subscription_limit_advised = near_limit
            protocol.throttled(SUBSCRIPTION_BINDS, near_limit)
            queued = True
        return queued
