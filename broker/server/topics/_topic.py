"""Topic actors and the subscription queues they fan out into."""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from accounts import Account, LoanedItem
from actors import Actor, Turn
from broker.groups import Outcome
from broker.protocol import OriginRun, slice_origins

from ..storage._store import LogError, LogFull, TopicStore

#: Bytes a Deliver adds to the shared tail (head: prefix, type, handle, seq).
DELIVER_HEAD_ESTIMATE = 24
#: Queued deliveries a dropping subscription offers its connection at a time.
PUMP_BATCH = 128
#: Publishes forwarded to a topic as one actor message (and one loan).
FORWARD_BATCH = 64


class RouteOrigin(Protocol):
    """Where publishes came from: told when a topic has routed a batch of them."""

    def routed(self, routed: Routed) -> None: ...


class Subscriber(Protocol):
    """What a subscription sends through: its subscriber's connection (the
    deliveries side of it). Every method is synchronous and only queues."""

    @property
    def open(self) -> bool:
        """Whether the connection may still send (False once it closed)."""
        ...

    @property
    def subscriptions(self) -> Mapping[int, Subscription]:
        """The subscriptions it serves now, by handle."""
        ...

    def send_deliveries(self, subscription: Subscription, tails: list[bytes]) -> int | None:
        """Queue Delivers of ``tails`` from ``subscription.next_seq`` on as far
        as the subscriber's guarantees allow; how many were taken, or None
        if the subscription can take nothing more (it is being freed)."""
        ...

    def deliver(self, subscription: Subscription, loans: list[LoanedItem[bytes]]) -> int:
        """:meth:`send_deliveries` of loans repaid once written (see ``Deliveries``)."""
        ...

    def has_room(self, subscription: Subscription, size: int) -> bool:
        """Whether the subscriber's guarantees cover a frame of ``size`` bytes now."""
        ...

    def gap(self, subscription: Subscription, first_seq: int, count: int) -> bool:
        """Say that ``count`` deliveries from ``first_seq`` were dropped."""
        ...

    def subscription_stalled(self, subscription: Subscription) -> None:
        """``subscription`` waits for what only this subscriber's reading clears."""
        ...


class GroupMember(Protocol):
    """A subscription that is a consumer group's member, here or at another
    worker: the client settles its deliveries."""

    def settle(
        self, ranges: list[tuple[int, int]], outcome: Outcome, detail: int | str | None
    ) -> None:
        """Settle deliveries (raises :class:`~broker.groups.GroupError` for
        one never sent)."""
        ...


@dataclass(slots=True)
class Routed:
    """Publishes on their way through a topic: their encoded Deliver tails, in
    order, and the publish channel they came from."""

    tails: list[bytes]
    origin: RouteOrigin
    handle: int
    #: What the origin estimated routing them will charge (see ``Publishing.drain``).
    fan_out: int
    #: The publishes' keys, in the same order (``latest`` subscriptions keep one per key).
    keys: list[bytes | None]
    #: Whose publishes they are (client session, topic handle, indices): what
    #: a worker forwarding them tells their owner (see ``_seen``), and what a
    #: topic with a log marks before appending them (see ``_publish_marks``).
    origins: list[OriginRun] | None = None
    #: Publishes of the batch left out as taken before (routed all the same).
    skipped: int = 0
    #: Called with the log's next offset before the first of ``tails`` is
    #: appended to it (a commit records where its publishes go: ``_commit``);
    #: may raise :class:`~broker.log.LogError`, and the batch then waits.
    before_append: Callable[[int], None] | None = None


def _charge(account: Account, tails: list[bytes]) -> int:
    """What a loan per delivery of ``tails`` would charge in all: each its
    bytes, its head and the per-event constant."""
    return sum(map(len, tails)) + (DELIVER_HEAD_ESTIMATE + account.event_cost) * len(tails)


def charge_of(account: Account, tails: list[bytes]) -> int:
    """What a loan per delivery (or per publish) of ``tails`` would charge
    in all, less one per-event constant: the cost of one loan for them."""
    return _charge(account, tails) - account.event_cost


def delivery_loan(account: Account, tails: list[bytes]) -> LoanedItem[list[bytes]]:
    """One loan for the deliveries of ``tails``, charging what a loan per
    delivery would in all."""
    return LoanedItem(account, _charge(account, tails) - account.event_cost, tails)


def _split_off(loan: LoanedItem[list[bytes]], count: int) -> LoanedItem[list[bytes]]:
    """The first ``count`` deliveries of ``loan`` as a loan of their own
    (the account's debt unchanged); ``loan`` keeps the rest."""
    tails = loan.item
    first = tails[:count]
    part = loan.split(_charge(loan.account, first), first)
    loan.item = tails[count:]
    return part


class Subscription:
    """A reliable subscription queue of one subscriber's session.

    Every queued delivery is charged to the account of the channel whose
    publish caused it, one loan per batch the topic routed (a loan per
    delivery would charge the same). Once their Deliver frames are sent
    (within the subscriber's guarantees: nothing waits in the connection
    beyond them) the loan stays with the subscription, unacknowledged, until
    the subscriber's cumulative ``Ack`` covers the batch's last delivery; if
    the connection breaks, the unacknowledged deliveries are sent again on
    the resumed connection.
    """

    __slots__ = (
        "_queue",
        "_queued",
        "acked",
        "connection",
        "delivered",
        "handle",
        "mode",
        "next_seq",
        "topic",
        "unacked",
    )

    #: Its queued deliveries are charged to the publishers' channels (the
    #: fan-out rule); lossy and latest subscriptions pay for their own.
    charges_publishers = True
    #: A consumer group's member, which takes ``Settle`` (see :class:`GroupMember`).
    group_member = False
    #: It reads its topic's log instead of being offered each batch.
    reads_log = False
    #: Its session's record keeps it (and its position) across a restart:
    #: it is numbered by log offsets, which a restarted broker can go on from.
    restorable = False

    def recorded_options(self, given: Mapping[str, object]) -> Mapping[str, object]:
        """The options its session's record restores it with: its Subscribe's."""
        return given

    def __init__(self, connection: Subscriber, handle: int, topic: Topic, mode: str) -> None:
        #: The connection it sends through (a resume attaches another).
        self.connection = connection
        self.handle = handle
        self.topic = topic
        self.mode = mode
        self.next_seq = 1
        self.delivered = 0
        #: Sent batches not wholly acknowledged yet, oldest first: the
        #: sequence number of each one's last delivery, and its loan.
        self.unacked: deque[tuple[int, LoanedItem[list[bytes]]]] = deque()
        self.acked = 0
        #: Batches waiting for the subscriber's guarantees, oldest first.
        self._queue: deque[LoanedItem[list[bytes]]] = deque()
        self._queued = 0

    @property
    def queued(self) -> int:
        """Deliveries waiting for the subscriber's guarantees."""
        return self._queued

    @property
    def unacked_deliveries(self) -> int:
        """Deliveries sent and not acknowledged yet."""
        return self.next_seq - 1 - self.acked

    def offer(self, account: Account, tails: list[bytes], keys: list[bytes | None]) -> None:
        """Queue deliveries of ``tails``, charged to ``account``; send what
        fits in the subscriber's guarantees at once. (``keys`` matter to
        ``latest`` subscriptions only.)"""
        self._queue.append(delivery_loan(account, tails))
        self._queued += len(tails)
        if len(self._queue) == 1:
            self.pump()

    def pump(self) -> None:
        """Send queued deliveries while the subscriber's guarantees allow."""
        queue = self._queue
        connection = self.connection
        sent_any = False
        while queue:
            loan = queue[0]
            tails = loan.item
            taken = connection.send_deliveries(self, tails)
            if taken is None:
                # The client is freeing the subscription (the event saying so
                # may still be on its way to us): nothing more is delivered on it.
                queue.popleft().repay()
                self._queued -= len(tails)
                continue
            if not taken:
                break
            sent_any = True
            self._queued -= taken
            if taken == len(tails):
                queue.popleft()
                self.unacked.append((self.next_seq - 1, loan))
                continue
            # Part of the batch went out: it is held on a loan of its own.
            self.unacked.append((self.next_seq - 1, _split_off(loan, taken)))
            break
        if sent_any or queue:
            # Held until acknowledged, or waiting for guarantees: both are
            # cleared by what this client sends, so its reader must go on.
            connection.subscription_stalled(self)

    def ack(self, seq: int) -> None:
        """The subscriber processed every delivery up to ``seq``: repay the
        loans of the batches that covers wholly.

        An Ack beyond what was sent covers what was sent.
        """
        count = min(seq, self.next_seq - 1) - self.acked
        if count <= 0:
            return
        acked = self.acked = self.acked + count
        unacked = self.unacked
        while unacked and unacked[0][0] <= acked:
            unacked.popleft()[1].repay()

    def attach(self, connection: Subscriber, processed: int) -> int:
        """A resumed connection takes over; the subscriber processed up to
        ``processed``. What it did not process is sent again, first, with its
        sequence numbers; returns how many deliveries that is."""
        self.connection = connection
        self.ack(processed)
        first = self.acked + 1
        resend: list[LoanedItem[list[bytes]]] = []
        count = 0
        for last, loan in self.unacked:
            start = last - len(loan.item) + 1
            if start < first:
                _split_off(loan, first - start).repay()  # those were processed
            resend.append(loan)
            count += len(loan.item)
        if resend:
            self.unacked = deque()
            self._queue.extendleft(reversed(resend))
            self._queued += count
        self.next_seq = first
        self.pump()
        return count

    def close(self) -> None:
        """Leave the topic and repay every queued and unacknowledged delivery."""
        self.topic.unsubscribe(self)
        while self._queue:
            self._queue.popleft().repay()
        while self.unacked:
            self.unacked.popleft()[1].repay()
        self._queued = 0


class TopicLogHost(Protocol):
    """What a topic with a log needs of the broker."""

    def now_ms(self) -> int:
        """The wall-clock time records are stamped with (ms since the epoch)."""
        ...

    def log_written(self, log: TopicStore, appended: int) -> None:
        """``appended`` records went into ``log`` and it was written to its
        file (not fsynced: the broker flushes it in time)."""
        ...

    def mark(self, topic: str, runs: list[OriginRun], offset: int) -> None:
        """Note where the publishes of ``runs`` go in ``topic``'s log (from
        ``offset`` on) and write that down before the log is written (see
        ``_publish_marks``); raises :class:`~broker.log.LogError` if it cannot
        (the batch then waits, as for a log that cannot take it)."""
        ...

    def log_failed(self, topic: Topic, error: LogError) -> None:
        """Appending to ``topic``'s log failed (full, or the disk): its
        publishes wait; the broker retries (:meth:`Topic.retry_held`)."""
        ...

    @property
    def gathering(self) -> bool:
        """Batches are gathered now (a connection's read is being applied):
        a topic hands its batch over (:meth:`gathered`) rather than append it."""
        ...

    def gathered(self, topic: Topic) -> None:
        """``topic`` holds gathered batches: the host marks the first of each
        such topic's, writes the journal once for all of them, then has each
        topic append it (:meth:`Topic.mark_gathered`, :meth:`Topic.append_gathered`)."""
        ...

    def note(self, topic: str, runs: list[OriginRun], offset: int) -> None:
        """:meth:`mark` without writing the journal (the caller writes it,
        before the log)."""
        ...

    def sync_soon(self, topic: Topic) -> None:
        """``topic``'s log (``flush="always"``) holds written records that
        wait for an fsync: the host syncs it off the event loop, then calls
        :meth:`Topic.synced`."""
        ...


class TailReader(Protocol):
    """A subscription that reads the topic's log, waiting at its end."""

    def pump(self) -> None:
        """Send from the log as far as it may."""
        ...

    def take_live(self, tails: list[bytes], first: int) -> None:
        """Records ``first``, ``first + 1``, ... were just appended with
        these ``tails``: send them as they are (they are what the log holds),
        or :meth:`pump` if it is not at ``first``."""
        ...


class _Held:
    """A batch of publishes on its way into the log: how many of its records
    are appended, and (while it waits for room) the loan that keeps its
    publisher charged."""

    __slots__ = ("appended", "loan", "routed")

    def __init__(self, routed: Routed) -> None:
        self.routed = routed
        self.loan: LoanedItem[None] | None = None
        self.appended = 0


class Topic(Actor):
    """One topic: routes each publish to every subscription, in order.

    A turn runs under the publishing channel's account, so each queued
    delivery is charged to that channel (the fan-out rule) before the
    publish's own loan is repaid.

    With a log (a broker with a data directory), a batch of publishes is
    appended to the log and written to its file before it counts as routed
    (and is confirmed); the publisher is charged until then, not until its
    subscribers acknowledge. Reliable subscriptions then read from the log
    (``LogSubscription``); lossy and latest ones are offered the batch as
    before. A batch the log cannot take (full with ``when_full="block"``,
    or the disk failing) waits here, still charged to its publisher, until
    :meth:`retry_held` gets it in: publishers are throttled, nothing is lost.

    Its turns only compute and queue, so a batch sent to an idle topic is
    routed at once in the sender's task (``inline_turns``): no task switch
    on the common path, the same order and accounts as through the mailbox.
    """

    inline_turns = True
    #: A stand-in forwarding to the worker that owns the topic (see ``_forward``).
    forwarded = False

    def __init__(
        self,
        name: str,
        registry: dict[str, Topic],
        log: TopicStore | None = None,
        host: TopicLogHost | None = None,
    ) -> None:
        self.topic_name = name
        self.subscriptions: list[Subscription] = []
        #: Subscriptions whose deliveries are charged to the publishers.
        self.charging = 0
        #: Publish channels bound to it (they keep it alive).
        self.publishers = 0
        #: Those of them that have published on their connection (a client
        #: binds a topic to subscribe too): what ``broker stat`` calls its
        #: publishers.
        self.publishing = 0
        self.messages_in = 0
        self._registry = registry
        #: The topic's log, through the storage seam (None: a memory-only broker).
        self.log = log
        self._host = host
        #: Log subscriptions that sent everything written: pumped after the next append.
        self._at_tail: dict[TailReader, None] = {}
        #: Batches waiting for room in the log, oldest first.
        self.held: deque[_Held] = deque()
        #: The last error appending met (None once a retry got through).
        self.log_error: LogError | None = None
        #: Batches handed to the host while it gathers (see
        #: :meth:`TopicLogHost.gathered`), oldest first, with the account of
        #: their turn (a batch that has to wait is charged to it then, as a
        #: held one; until then it is on its way within one read).
        self._gathered: deque[tuple[_Held, Account]] = deque()
        #: It is in the host's list of topics with gathered batches.
        self._listed = False
        #: With ``flush="always"``: batches appended and written, each with
        #: the log's next offset after it, waiting for the fsync that covers
        #: them before they are routed (charged to their publishers until then).
        self._unsynced: deque[tuple[int, _Held]] = deque()

    def handle(self, turn: Turn, message: Any) -> None:
        routed: Routed = message
        account = turn.account
        if self.log is not None:
            held = _Held(routed)
            if not self.held:
                host = self._host
                assert host is not None
                if self._gathered or host.gathering:
                    # Appended once the host has written the marks of every
                    # batch gathered with it (one journal write for them all).
                    self._gathered.append((held, account))
                    if not self._listed:
                        self._listed = True
                        host.gathered(self)
                    return
                if self._append(held):
                    self._appended(held, account)
                    return
            # It waits for room, still charged to its publisher.
            held.loan = LoanedItem(account, _charge(account, routed.tails), None)
            self.held.append(held)
            return
        self._routed(routed, account)

    def _appended(self, held: _Held, account: Account) -> None:
        """``held`` is in the log and written: route it now, or, with
        ``flush="always"``, once the fsync that covers it is done (still
        charged to its publisher meanwhile: see :meth:`synced`)."""
        log = self.log
        if log is not None and log.sync_later:
            if held.loan is None:
                held.loan = LoanedItem(account, _charge(account, held.routed.tails), None)
            self._unsynced.append((log.next_offset, held))
            assert self._host is not None
            self._host.sync_soon(self)
            return
        self._routed(held.routed, account)
        if held.loan is not None:
            held.loan.repay()

    def synced(self) -> None:
        """The host fsynced the log: route the batches now durable, in
        order, and wake the readers waiting at its end."""
        log = self.log
        if log is None:
            return
        routed = self._route_unsynced(log.durable_offset + 1)
        if not routed:
            self._wake_at_tail(None, 0)
        for first, tails in routed:
            # (Readers at the end take each batch's bytes as they are, as
            # after an append that needs no fsync; any other reads the log.)
            self._wake_at_tail(tails, first)
        if self._unsynced and self._host is not None:
            self._host.sync_soon(self)  # (appended while the fsync ran)
        self.release_if_unused()

    @property
    def unsynced(self) -> int:
        """Batches appended with ``flush="always"`` that wait for their fsync."""
        return len(self._unsynced)

    def route_unsynced(self) -> None:
        """The log goes away (the topic is deleted): the batches waiting for
        its fsync are routed now, as if it had come just before."""
        self._route_unsynced(None)

    def _route_unsynced(self, durable_next: int | None) -> list[tuple[int, list[bytes]]]:
        """Route, in order, the waiting batches whose records all lie before
        ``durable_next`` (None: all of them), each loan repaid; returns each
        one's first offset and records."""
        unsynced = self._unsynced
        routed: list[tuple[int, list[bytes]]] = []
        while unsynced and (durable_next is None or unsynced[0][0] <= durable_next):
            next_offset, held = unsynced.popleft()
            assert held.loan is not None
            self._routed(held.routed, held.loan.account)
            held.loan.repay()
            tails = held.routed.tails
            if tails:
                routed.append((next_offset - len(tails), tails))
        return routed

    def _routed(self, routed: Routed, account: Account) -> None:
        """A batch is routed (with a log: it is in the log): offer it to the
        subscriptions that keep their own queues (every one, without a log)
        and confirm it."""
        for subscription in self.subscriptions:
            if not subscription.reads_log and routed.tails:
                subscription.offer(account, routed.tails, routed.keys)
        self.messages_in += len(routed.tails)
        routed.origin.routed(routed)

    def retry_held(self) -> None:
        """Append the waiting batches the log has room for now, in order;
        each one wholly appended and written is routed, its loan repaid."""
        held = self.held
        if not held:
            return
        while held:
            first = held[0]
            if not self._append(first):
                return
            held.popleft()
            assert first.loan is not None
            self._appended(first, first.loan.account)
        self.release_if_unused()

    def mark_gathered(self) -> None:
        """Note the marks of the first gathered batch where it will go (the
        host writes the journal next, then calls :meth:`append_gathered`)."""
        held = self._gathered[0][0]
        runs = held.routed.origins
        if runs is not None and held.routed.tails:
            assert self.log is not None and self._host is not None
            self._host.note(self.topic_name, runs, self.log.next_offset)

    def append_gathered(self) -> None:
        """The marks of the first gathered batch are written: append it and
        route it; a batch the log cannot take waits, and every gathered
        batch behind it, as held ones (:meth:`retry_held`). More gathered
        batches: handed to the host again (each is marked before it goes in)."""
        self._listed = False
        held, account = self._gathered.popleft()
        if not self._append(held, marked=True):
            self._gathered.appendleft((held, account))
            self._hold_gathered()
            return
        self._appended(held, account)
        if self._gathered and not self._listed:
            assert self._host is not None
            self._listed = True
            self._host.gathered(self)

    def gathered_failed(self, error: LogError) -> None:
        """The journal could not be written: every gathered batch waits, as
        held ones, and is marked again when retried."""
        self._listed = False
        self._hold_gathered()
        if self.log_error is None:
            assert self._host is not None
            self._host.log_failed(self, error)
        self.log_error = error

    def _hold_gathered(self) -> None:
        """The gathered batches wait for room, in order, each charged to its
        publisher until it is routed."""
        for held, account in self._gathered:
            held.loan = LoanedItem(account, _charge(account, held.routed.tails), None)
            self.held.append(held)
        self._gathered.clear()

    def _append(self, held: _Held, *, marked: bool = False) -> bool:
        """Append what is left of ``held`` and write it to the file; whether
        all of it is. (``marked``: its marks are written already.)"""
        log = self.log
        host = self._host
        assert log is not None and host is not None
        tails = held.routed.tails
        if not tails:
            return True  # (all of them taken before: see ``_seen``)
        appended = 0
        try:
            runs = held.routed.origins
            if runs is not None and not marked:
                if held.appended:
                    runs = slice_origins(runs, held.appended, len(tails))
                host.mark(self.topic_name, runs, log.next_offset)
            if not held.appended and held.routed.before_append is not None:
                held.routed.before_append(log.next_offset)
            while held.appended < len(tails):
                # (A call that fills the log part way appends what fits; the
                # next one raises why the rest does not.)
                rest = tails[held.appended :] if held.appended else tails
                count = log.append_many(rest, host.now_ms())
                appended += count
                held.appended += count
            log.write()
        except LogError as error:
            if self.log_error is None:
                host.log_failed(self, error)
            self.log_error = error
            if appended and isinstance(error, LogFull):
                # What fitted is written: its readers get it (and may then
                # move on, which is what makes room).
                with contextlib.suppress(LogError):
                    log.write()
                    self._wake_at_tail(None, 0)
            if appended:
                host.log_written(log, appended)  # counted once, when appended
            return False
        host.log_written(log, appended)
        self.log_error = None
        if not log.sync_later:  # (else its readers see it once it is durable)
            first = log.next_offset - appended
            self._wake_at_tail(tails if appended == len(tails) else None, first)
        return True

    def _wake_at_tail(self, tails: list[bytes] | None, first: int) -> None:
        """Wake the log subscriptions waiting at the end: with ``tails`` (the
        records just appended from offset ``first``, all of them) they take
        those bytes as they are, without reading them back from the log."""
        if self._at_tail:
            waiting = self._at_tail
            self._at_tail = {}
            if tails is not None:
                for reader in waiting:
                    reader.take_live(tails, first)
            else:
                for reader in waiting:
                    reader.pump()

    def wait_for_records(self, reader: TailReader) -> None:
        """``reader`` sent everything written: wake it after the next append."""
        self._at_tail[reader] = None

    def reader_moved(self) -> None:
        """A subscription acknowledged records or left: batches waiting for
        ``when_full="block"`` room may fit now."""
        if self.held and isinstance(self.log_error, LogFull):
            self.retry_held()

    def subscribe(self, subscription: Subscription) -> None:
        self.subscriptions.append(subscription)
        self.charging += subscription.charges_publishers

    def unsubscribe(self, subscription: Subscription) -> None:
        if subscription in self.subscriptions:
            self.subscriptions.remove(subscription)
            self.charging -= subscription.charges_publishers
            self._at_tail.pop(subscription, None)  # type: ignore[call-overload]
            self.release_if_unused()

    def release_if_unused(self) -> None:
        """Stop and forget the topic once nobody publishes to or subscribes to it
        (and no batch waits for room in its log)."""
        if (
            not self.publishers
            and not self.subscriptions
            and not self.held
            and not self._gathered
            and not self._unsynced
        ):
            if self._registry.get(self.topic_name) is self:
                del self._registry[self.topic_name]
            self.stop()
