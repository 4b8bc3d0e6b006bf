"""Pattern subscriptions: one subscription to every topic a pattern matches.

A ``Subscribe`` whose topic is a pattern (``orders.*``, ``orders.>``; see
:class:`~broker.protocol.TopicPattern`) makes a :class:`PatternSubscription`:
one subscription handle, one delivery channel and one guarantee window for
all the topics it matches, those that exist when it subscribes (open or
only on disk) and those made later (``_pattern_registry`` tells it).

Each matched topic gets a *member*: an ordinary subscription of the mode
asked for (a log reader, a reliable queue, a lossy or latest queue, or a
forwarded one on a worker that does not own the topic: whatever
``make_subscription`` makes), whose connection is the pattern's
:class:`Outlet`. The outlet turns a member's deliveries into
``DeliverMatched`` frames on the pattern's handle, numbered by the
pattern (what the client's ``Ack`` names), each naming its topic (a match
index bound by a ``Matched`` first) and its number there (its log offset,
with topic logs). The members share the pattern's guarantees: a member
that finds no room waits in the pattern's queue of stalled members, and
each grant of guarantees wakes them in turn, so no topic starves the
others and nothing is read from a log beyond what the window lets go: a
pattern over ten thousand topics holds one window, not ten thousand.

An ``Ack`` of the pattern's numbers acknowledges each member up to the
record it covers (a durable cursor keeps one position per topic, stored
together after each Ack). A resumed session's members go on from what
each had acknowledged. A topic the principal may not subscribe to is
never matched (and never named to it). A deleted topic's member ends with
a ``Matched`` that unbinds its index; if the topic is made again it is
matched again, under a new index.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, Protocol, cast

import trio
import trio.lowlevel

from accounts import Account
from broker.errors import BrokerError
from broker.log import LogError
from broker.protocol import DeliveryMode, TopicPattern

from ..topics._lossy import OptionError
from ..topics._topic import Subscriber, Subscription, Topic
from ._outlet import Outlet, PatternConnection

log = logging.getLogger("broker.server")

#: Members opened per pass of the background opener (a log each), before it
#: lets the other tasks run.
OPEN_BATCH = 8
#: How often a worker of several looks for topics the others made (seconds).
RESCAN_INTERVAL = 1.0
#: Deleted topics a pattern keeps saying the end of until its client has it.
MAX_GONE = 1024
#: Options a pattern subscription does not take (they name one topic).
REFUSED_OPTIONS = {
    "group": "a consumer group shares one topic: subscribe to a topic name",
    "until": "a bounded read (until) names one topic's offset: subscribe to a topic name",
    "timestamps": "a pattern subscription's deliveries carry no timestamps",
}


class MemberFactory(Protocol):
    """Makes a pattern's member for one topic (``make_subscription``, bound
    to the broker's cursors, groups and the principal)."""

    def __call__(
        self, outlet: Outlet, match: int, topic: Topic, mode: str, options: Mapping[str, object]
    ) -> Subscription: ...


class PatternBook(Protocol):
    """The broker's live pattern subscriptions (``_pattern_registry``)."""

    def add(self, subscription: PatternSubscription) -> None: ...

    def discard(self, subscription: PatternSubscription) -> None: ...

    def topic_made(self, name: str) -> None:
        """Topic ``name`` has an actor now: every pattern that matches it takes it."""
        ...

    def topic_deleted(self, name: str) -> None:
        """Topic ``name`` was deleted: every pattern that had it lets it go."""
        ...


class PatternHost(Protocol):
    """What a pattern subscription needs of the broker."""

    @property
    def patterns(self) -> PatternBook:
        """The live pattern subscriptions (told of topics made and deleted)."""
        ...

    def topic(self, name: str) -> Topic:
        """The topic actor of ``name`` (made, its log opened, if need be)."""
        ...

    def open_topics(self) -> list[str]:
        """The topics that have an actor now (their logs open, if any)."""
        ...

    def is_open(self, name: str) -> bool:
        """Whether topic ``name`` has an actor now (its log open, if any)."""
        ...

    def not_owned(self, topic: str) -> str | None:
        """Why another worker serves ``topic`` (None: this one does)."""
        ...

    async def stored_topics(self, match: Callable[[str], bool]) -> list[str]:
        """The topics kept on disk whose names ``match`` (opened or not; none
        on a memory-only broker), listed in a thread."""
        ...

    def store_cursors(self) -> None:
        """Write the durable cursors' positions stored since the last call."""
        ...

    def start_soon(self, job: Callable[[], Any]) -> None:
        """Run ``job`` (an async function) in the broker's nursery."""
        ...


class PatternName:
    """What a pattern subscription has for a topic: the pattern's text (for
    statistics and logs)."""

    __slots__ = ("topic_name",)

    def __init__(self, pattern: str) -> None:
        self.topic_name = pattern

    def unsubscribe(self, subscription: Subscription) -> None:
        """(A pattern is no topic: nothing to leave.)"""


class PatternSubscription(Subscription):
    """One subscription to every topic ``pattern`` matches (see the module)."""

    __slots__ = (
        "_adding",
        "_announced",
        "_closed",
        "_factory",
        "_gone",
        "_host",
        "_may_read",
        "_next_match",
        "_pending",
        "_processed",
        "_runs",
        "_stalled",
        "_waiting",
        "cursor",
        "existing",
        "matched_topics",
        "members",
        "options",
        "outlet",
        "pattern",
        "restorable",
    )

    charges_publishers = False

    def __init__(
        self,
        connection: PatternConnection,
        handle: int,
        pattern: TopicPattern,
        mode: str,
        options: Mapping[str, object],
        *,
        host: PatternHost,
        factory: MemberFactory,
        may_read: Callable[[str], bool],
        durable: bool,
    ) -> None:
        super().__init__(connection, handle, cast(Topic, PatternName(pattern.text)), mode)
        self.connection: PatternConnection = connection
        self.pattern = pattern
        self.options = dict(options)
        #: Its durable cursor's name (None: none).
        cursor = options.get("cursor")
        self.cursor = cursor if isinstance(cursor, str) else None
        self._host = host
        self._factory = factory
        self._may_read = may_read
        #: Its members, by match index (each member's handle is its index).
        self.members: dict[int, Subscription] = {}
        #: The match index of each matched topic.
        self.matched_topics: dict[str, int] = {}
        self._next_match = 0
        #: Match indices said (in a Matched) on the current connection.
        self._announced: set[int] = set()
        #: Sent deliveries not acknowledged yet, oldest first: runs of
        #: ``[first number, match, first record, count]``.
        self._runs: deque[list[int]] = deque()
        #: Per member: the last of its records the client processed (what
        #: a lossy member, which keeps no acknowledgements, resumes after).
        self._processed: dict[int, int] = {}
        #: Members waiting for guarantees, in turn (and as a set).
        self._stalled: deque[int] = deque()
        self._waiting: set[int] = set()
        #: Topics matched on disk and not opened yet (opened in the
        #: background, a few at a time: each is a log to recover).
        self._pending: deque[str] = deque()
        self._adding: set[str] = set()
        #: Matched topics deleted whose end the client may not have had:
        #: ``[match, topic, number]``, the number being the next delivery
        #: number when it was said (0: not said on this connection).
        self._gone: list[list[Any]] = []
        #: The matching topics on disk when it subscribed that it did not
        #: take (None until they are listed): not new to it.
        self.existing: set[str] | None = None
        self._closed = False
        #: Whether its session's record keeps it across a broker restart
        #: (with a durable cursor: each topic's position is the cursor's).
        self.restorable = durable
        self.outlet = Outlet(self)

    # ---------------------------------------------------------------- matching

    def start(self) -> None:
        """Match the topics there are now: the open ones at once; those only
        on disk (listed in a thread) in the background, :data:`OPEN_BATCH`
        at a time, unless nothing is to be read from them now (a live
        subscription from the end, without a cursor or a time): those are
        matched when something opens them (on a worker of several, they
        are noted, so that the topics the other workers make later are
        told from them: see ``PatternRegistry.watch``)."""
        self._host.patterns.add(self)
        for name in self._host.open_topics():
            if self.matches(name):
                self.add(name)
        self._host.start_soon(self._open_stored)

    def _starts_at_end(self) -> bool:
        """Whether a topic not open has nothing for it (a start at the end,
        or a live mode): it is matched when something opens it."""
        start = self.options.get("from", "latest")
        return self.cursor is None and "from_time" not in self.options and start == "latest"

    async def _open_stored(self) -> None:
        """Match the topics on disk, a few per turn of the event loop (or,
        from the end, note them: see :meth:`start`; but take at once those
        another worker serves, whose publishes never open them here)."""
        host = self._host
        while True:
            try:
                names = await host.stored_topics(self.matches)
                break
            except (OSError, LogError) as error:  # (no descriptor left, the disk)
                log.warning(
                    "pattern %r: the data directory cannot be listed now (%s); "
                    "trying again in %.0f s",
                    self.pattern.text,
                    error,
                    RESCAN_INTERVAL,
                )
                await trio.sleep(RESCAN_INTERVAL)
                if self._closed:
                    return
        if self._starts_at_end():
            elsewhere = [name for name in names if host.not_owned(name) is not None]
            self.existing = set(names).difference(elsewhere)
            self._pending.extend(elsewhere)
        else:
            self.existing = set()
            self._pending.extend(name for name in names if name not in self.matched_topics)
        while self._pending and not self._closed:
            for _ in range(min(OPEN_BATCH, len(self._pending))):
                name = self._pending.popleft()
                try:
                    self.add(name)
                except (BrokerError, ValueError) as error:  # (its log cannot be opened now)
                    log.warning(
                        "pattern %r: topic %r left out: %s", self.pattern.text, name[:64], error
                    )
            await trio.lowlevel.checkpoint()

    def add(self, name: str, *, from_start: bool = False) -> None:
        """Match topic ``name`` (it matches the pattern and the principal
        may read it): make its member, and send what it has. ``from_start``:
        the topic was made after the subscription, somewhere this broker
        learns of late (another worker): a member that would start at the
        end starts at its first record instead."""
        if self._closed or name in self.matched_topics or name in self._adding:
            return
        self._adding.add(name)
        try:
            topic = self._host.topic(name)
            match = self._next_match
            options = self.options
            from_end = "from_time" not in options and options.get("from", "latest") == "latest"
            if from_start and self.mode == DeliveryMode.RELIABLE and from_end:
                options = {**options, "from": "earliest"}  # (a lossy one reads live only)
            try:
                member = self._factory(self.outlet, match, topic, self.mode, options)
            except OptionError:
                topic.release_if_unused()
                raise
            self._next_match += 1
            self.members[match] = member
            self.matched_topics[name] = match
            topic.subscribe(member)
            member.pump()
        finally:
            self._adding.discard(name)

    def matches(self, name: str) -> bool:
        """Whether a topic made now is one for this subscription."""
        return self.pattern.matches(name) and self._may_read(name)

    def remove(self, name: str) -> None:
        """Topic ``name`` was deleted: its member ends, and the client is
        told its index is over."""
        match = self.matched_topics.pop(name, None)
        if match is None:
            return
        member = self.members.pop(match)
        self._processed.pop(match, None)
        self._waiting.discard(match)
        member.close()
        self._announced.discard(match)
        self._gone.append([match, name, 0])
        del self._gone[:-MAX_GONE]  # (the oldest first)
        self._say_gone()

    def _say_gone(self) -> None:
        """Tell the client of every matched topic deleted that it has not
        been told of for sure: a ``Matched`` that binds the index (again:
        the client may not have it on this connection) and one that ends
        it, so that it forgets the topic's offsets (made again, the topic
        starts at 1). Said again on every resume until the client has
        acknowledged a delivery sent after it (frames are handled in
        order: it had them then)."""
        for gone in self._gone:
            match, name, said = gone
            if said:
                continue
            connection = self.connection
            if not (
                connection.matched(self, match, name) and connection.matched(self, match, None)
            ):
                return
            gone[2] = self.next_seq  # (told for sure once this number is acknowledged)

    # ---------------------------------------------------------------- sending

    def send(self, member: Subscription, tails: list[bytes]) -> int | None:
        """A member's deliveries, from its ``next_seq``: as DeliverMatched
        frames numbered from the pattern's (see :class:`Outlet`)."""
        match = member.handle
        if self.members.get(match) is not member:
            return None  # (a member let go: it takes nothing more)
        connection = self.connection
        if match not in self._announced:
            if not connection.matched(self, match, member.topic.topic_name):
                return 0
            self._announced.add(match)
        first_seq = self.next_seq
        first = member.next_seq
        count = connection.send_matched(self, tails, match, first)
        if count:
            member.next_seq = first + count
            member.delivered += count
            runs = self._runs
            last = runs[-1] if runs else None
            if last is not None and last[1] == match and last[2] + last[3] == first:
                last[3] += count
            else:
                runs.append([first_seq, match, first, count])
        return count

    def gap(self, member: Subscription, first: int, count: int) -> bool:
        """A member's records from ``first`` were dropped or deleted."""
        match = member.handle
        if self.members.get(match) is not member:
            return False
        connection = self.connection
        if match not in self._announced:
            if not connection.matched(self, match, member.topic.topic_name):
                return False
            self._announced.add(match)
        return connection.matched_gap(self, match, first, count)

    def stalled(self, member: Subscription) -> None:
        """A member waits for the pattern's guarantees: it is woken in turn."""
        match = member.handle
        if match not in self._waiting and self.members.get(match) is member:
            self._waiting.add(match)
            self._stalled.append(match)
        self.connection.subscription_stalled(self)

    @property
    def queued(self) -> int:
        """Members waiting for the subscriber's guarantees."""
        return len(self._waiting)

    def offer(self, account: Account, tails: list[bytes], keys: list[bytes | None]) -> None:
        """(Records reach the members, not the pattern.)"""

    def pump(self) -> None:
        """Guarantees came: the waiting members send in turn while there is room."""
        connection = self.connection
        stalled = self._stalled
        for _ in range(len(stalled)):
            if connection.room(self) <= 0:
                return
            match = stalled.popleft()
            self._waiting.discard(match)
            member = self.members.get(match)
            if member is not None:
                member.pump()

    # ---------------------------------------------------------------- acknowledging

    def ack(self, seq: int) -> None:
        """The subscriber processed every delivery up to number ``seq``: each
        member is acknowledged up to its last record that covers (a durable
        cursor's positions are written together, once)."""
        acked = min(seq, self.next_seq - 1)
        if acked <= self.acked:
            return
        self.acked = acked
        runs = self._runs
        upto: dict[int, int] = {}
        while runs and runs[0][0] <= acked:
            run = runs[0]
            first_seq, match, first, count = run
            done = min(count, acked - first_seq + 1)
            upto[match] = first + done - 1
            if done < count:
                run[0], run[2], run[3] = first_seq + done, first + done, count - done
                break
            runs.popleft()
        if self._gone:
            self._gone = [gone for gone in self._gone if not 0 < gone[2] <= acked]
        members = self.members
        processed = self._processed
        for match, last in upto.items():
            member = members.get(match)
            if member is not None:
                member.ack(last)
                processed[match] = last
        if self.cursor is not None and upto:
            self._host.store_cursors()

    def attach(self, connection: Subscriber, processed: int) -> int:
        """A resumed connection takes over: every member goes on after what
        it had acknowledged (what was sent after ``processed`` is sent
        again, numbered on from it); returns how many that is."""
        self.connection = cast(PatternConnection, connection)
        if processed >= self.next_seq:
            self.next_seq = processed + 1  # (restored after a restart: numbered on)
        self.ack(processed)
        resend = self.next_seq - 1 - self.acked
        self._runs.clear()
        self._announced.clear()
        self._stalled.clear()
        self._waiting.clear()
        self.next_seq = self.acked + 1
        for gone in self._gone:
            gone[2] = 0  # (said on the old connection, maybe lost with it)
        self._say_gone()
        for match, member in list(self.members.items()):
            member.attach(self.outlet, self._processed.get(match, member.acked))
        return resend

    def close(self) -> None:
        """Every member leaves its topic."""
        self._closed = True
        self._host.patterns.discard(self)
        self._pending.clear()
        for member in self.members.values():
            member.close()
        self.members.clear()
        self.matched_topics.clear()
        self._waiting.clear()
        self._stalled.clear()

    def recorded_options(self, given: Mapping[str, object]) -> Mapping[str, object]:
        return given


def pattern_options(options: Mapping[str, object]) -> dict[str, object]:
    """The options a pattern subscription passes to its members (raises
    :class:`OptionError` for one that names a single topic)."""
    for name, why in REFUSED_OPTIONS.items():
        if name in options and not (name == "timestamps" and options[name] is False):
            raise OptionError(f'"{name}": {why}')
    return dict(options)
