"""Reliable subscriptions of a broker with topic logs: a cursor in the log.

A reliable subscription on a broker with a data directory keeps no queue of
its own: it is a position in its topic's log (:class:`LogSubscription`),
and it sends from the log as fast as its subscriber's guarantees allow. Its
deliveries are numbered by their records' offsets (``Deliver.seq`` is the
offset), so that an ``Ack`` and a resume name log positions, and a
subscriber can continue from ``offset + 1`` on any later connection.

What a publisher is charged ends once its publishes are written to the log
(see ``Topic``); what a subscription reads from the log into its
connection's output is charged to the subscription's own account until the
connection has written it, and is bounded by the subscriber's guarantees.
A thousand lagging subscribers therefore hold a thousand guarantee windows,
never the log. The lag itself is on disk, bounded by retention.

Where a subscription starts comes from its ``Subscribe`` options
(:func:`start_request`): ``"from"``, ``"from_time"`` and a durable
``"cursor"`` whose acknowledged position survives restarts (a
:class:`CursorBook` keeps it). With ``"until"`` it is a *bounded read*
(Kafka's consumer fetch of a range): it sends the records before that
offset and then nothing more, and it never holds retention back (what
retention deletes before it is sent is told with a ``Gap``). With
``"timestamps": true`` every delivery carries its record's receive time
(a ``DeliverTimed``), read from the log with the records.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from accounts import Account, LoanedItem, unlimited
from broker.protocol import TopicNameError, check_topic_name

from ..storage._store import LogError, Start, TopicStore
from ._lossy import OptionError
from ._topic import DELIVER_HEAD_ESTIMATE, Subscriber, Subscription, Topic

#: Records one pump reads from the log at a time (its guarantees cut it shorter).
PUMP_RECORDS = 1024
#: Bytes one pump reads from the log at a time (about).
PUMP_BYTES = 1 << 20
#: The reliable options this broker knows.
LOG_OPTIONS = frozenset({"from", "from_time", "cursor", "until", "timestamps"})
#: The option a worker adds to a Subscribe it forwards with a ``"cursor"``:
#: the principal whose cursor it is (taken only from another worker's link).
CURSOR_PRINCIPAL = "cursor_principal"


class CursorBook(Protocol):
    """Where durable cursors keep their positions (the next offset each wants)."""

    def position(self, key: str) -> int | None:
        """The stored next offset of cursor ``key``, or None if it is new."""
        ...

    def store(self, key: str, position: int) -> None:
        """Remember that cursor ``key`` next wants ``position`` (written at once:
        it survives the broker being killed)."""
        ...

    def items(self) -> list[tuple[str, int]]:
        """Every stored cursor, as ``(key, position)``, sorted by key."""
        ...

    def put(self, key: str, position: int) -> None:
        """:meth:`store` without writing: written by the next :meth:`write`
        (or :meth:`store`), for many cursors stored at once."""
        ...

    def write(self) -> None:
        """Write what :meth:`put` stored."""
        ...

    def delete(self, key: str) -> bool:
        """Forget cursor ``key`` (written at once); whether there was one."""
        ...


class LogSubscriber(Subscriber, Protocol):
    """A :class:`Subscriber` that also repays read loans once written."""

    @property
    def name(self) -> str:
        """The connection's name (for the subscription's account)."""
        ...

    @property
    def root_account(self) -> Account:
        """The account the subscription's own account rolls up to (never blocks)."""
        ...

    def written_later(self, loan: LoanedItem[Any]) -> None:
        """Repay ``loan`` once what is queued on the connection now is written."""
        ...

    def room(self, subscription: Subscription) -> int:
        """The bytes of deliveries the subscriber's guarantees let go now (0: none)."""
        ...

    def send_timed(
        self, subscription: Subscription, tails: list[bytes], times: list[int]
    ) -> int | None:
        """``send_deliveries`` with each record's receive time (``times[i]``
        for ``tails[i]``): as DeliverTimed frames."""
        ...


@dataclass(frozen=True, slots=True)
class StartRequest:
    """Where a reliable subscription asked to start."""

    start: Start
    #: A durable cursor's name, if it named one.
    cursor: str | None = None
    #: A bounded read: the offset it stops before (None: it never stops).
    until: int | None = None
    #: Its deliveries carry their records' receive times.
    timestamps: bool = False

    @property
    def plain(self) -> bool:
        """Whether it asks for nothing a memory-only broker lacks (live from now on)."""
        return (
            self.cursor is None
            and self.until is None
            and not self.timestamps
            and self.start.kind == "latest"
        )


def start_request(options: Mapping[str, object]) -> StartRequest:
    """The start a reliable Subscribe's ``options`` ask for (raises :class:`OptionError`,
    whose text names the option)."""
    unknown = set(options) - LOG_OPTIONS
    if unknown:
        raise OptionError(
            f"unknown subscribe option(s) {sorted(unknown)[:4]} "
            f"(a reliable subscription takes {sorted(LOG_OPTIONS)})"
        )
    if "from" in options and "from_time" in options:
        raise OptionError('"from" and "from_time" exclude each other: give one')
    start = Start.latest()
    if "from" in options:
        value = options["from"]
        if value == "earliest":
            start = Start.earliest()
        elif value == "latest":
            start = Start.latest()
        elif type(value) is int and value >= 0:
            start = Start.at(max(value, 1))
        elif type(value) is int:
            start = Start.last(-value)  # (-N: the last N records)
        else:
            raise OptionError(
                '"from" must be "earliest", "latest", an offset (an integer >= 0) '
                "or -N (the last N records)"
            )
    if "from_time" in options:
        value = options["from_time"]
        if type(value) is not int or value < 0:
            raise OptionError('"from_time" must be milliseconds since the Unix epoch (>= 0)')
        start = Start.from_time(value)
    cursor = options.get("cursor")
    if cursor is not None or "cursor" in options:
        if type(cursor) is not str:
            raise OptionError('"cursor" must be text: the durable cursor\'s name')
        try:
            check_topic_name(cursor)
        except TopicNameError as error:
            raise OptionError(f'"cursor": {error}') from None
    until = options.get("until")
    if until is not None or "until" in options:
        if type(until) is not int or until < 0:
            raise OptionError('"until" must be an offset (an integer >= 0): where the read stops')
        if cursor is not None:
            raise OptionError('"until" (a bounded read) and "cursor" exclude each other: give one')
    timestamps = options.get("timestamps", False)
    if type(timestamps) is not bool:
        raise OptionError('"timestamps" must be true or false')
    return StartRequest(start, cursor, until, timestamps)


#: The state journal's space of durable cursors (keys: :func:`cursor_key`).
CURSORS = "cursors"


def cursor_key(principal: str | None, topic: str, name: str) -> str:
    """The key a durable cursor is stored under: one namespace per principal and topic."""
    return "\x00".join((principal or "", topic, name))


def cursor_topic(key: str) -> str | None:
    """The topic a :func:`cursor_key` names (None: not such a key)."""
    parts = key.split("\x00")
    return parts[1] if len(parts) == 3 else None


class LogSubscription(Subscription):
    """A reliable subscription that reads its topic's log (see the module).

    ``next_seq`` is the next offset to send, ``acked`` the last offset the
    subscriber processed. Nothing is kept once sent: a resume sends again
    from the log what the subscriber did not process. With ``until`` it is
    a bounded read: it sends nothing at or after that offset (a ``Gap``
    for deleted records is cut there too) and holds no retention back.
    With ``timestamps`` each record goes with its receive time, as the log
    stored it (live records too: read from the log's record headers).
    """

    __slots__ = (
        "_cursors",
        "account",
        "cursor_key",
        "gaps_sent",
        "holder",
        "log",
        "timestamps",
        "until",
    )

    charges_publishers = False
    reads_log = True
    restorable = True

    def __init__(
        self,
        connection: LogSubscriber,
        handle: int,
        topic: Topic,
        mode: str,
        log: TopicStore,
        position: int,
        *,
        cursors: CursorBook | None = None,
        cursor_key: str | None = None,
        until: int | None = None,
        timestamps: bool = False,
    ) -> None:
        super().__init__(connection, handle, topic, mode)
        self.connection: LogSubscriber = connection
        self.log = log
        self.until = until
        #: Send each record's receive time with it (a DeliverTimed).
        self.timestamps = timestamps
        #: Holds ``when_full="block"`` retention at the first unprocessed
        #: offset (a bounded read's is not registered: it holds nothing).
        self.holder = log.reader(Start.at(position), register=until is None)
        self.next_seq = position
        self.acked = position - 1
        #: Pays for records read into the connection's output until written
        #: (rolls up to the broker's root account; never blocks anybody).
        self.account: Account = unlimited(
            f"{connection.name}/log/{handle}", parent=connection.root_account, kind="log"
        )
        self.gaps_sent = 0
        self._cursors = cursors
        self.cursor_key = cursor_key

    @property
    def queued(self) -> int:
        """Deliveries waiting in memory: none (what it has not sent waits in
        the log, on disk: see :attr:`lag`)."""
        return 0

    @property
    def lag(self) -> int:
        """Records retained and not yet processed by the subscriber."""
        return max(0, self.log.next_offset - max(self.acked + 1, self.log.first_offset))

    def offer(self, account: Account, tails: list[bytes], keys: list[bytes | None]) -> None:
        """Records reach a log subscription through the log (see :meth:`pump`)."""
        self.pump()

    def pump(self) -> None:
        """Send from the log, from :attr:`next_seq`, while the subscriber's
        guarantees allow and the log has written records; at the log's end,
        wait for the topic's next append."""
        log = self.log
        if log.closed:
            return
        until = self.until
        while True:
            end = log.written_offset  # never deliver what a crash could take back
            if until is not None:
                if self.next_seq >= until:
                    return  # a bounded read that is done: it waits for nothing more
                end = min(end, until - 1)
            if self.next_seq > end:
                self.topic.wait_for_records(self)
                return
            room = self.connection.room(self)
            if room <= 0:
                self.connection.subscription_stalled(self)  # it waits for guarantees
                return
            try:
                # (No more than the guarantees let go now: at least one record.)
                # (Nor past what may be delivered: with a log whose records are
                # durable later, it can hold many more than that.)
                wanted = min(PUMP_RECORDS, end - self.next_seq + 1)
                run = log.read(self.next_seq, wanted, min(PUMP_BYTES, room))
            except LogError:
                return  # closed under us: the broker is stopping
            if run.gap:
                # Retention deleted records this subscription had not sent.
                gap = run.gap if until is None else min(run.gap, until - self.next_seq)
                if not self.connection.gap(self, self.next_seq, gap):
                    return
                self.gaps_sent += 1
                self.next_seq = run.first_offset if until is None else min(run.first_offset, until)
                if self.next_seq != run.first_offset:
                    return  # the bounded read's range ended in the gap
            tails: list[Any] = run.tails
            if not tails:
                self.topic.wait_for_records(self)
                return
            if run.first_offset + len(tails) - 1 > end:
                tails = tails[: end - run.first_offset + 1]
            if not self._send(tails):
                return

    def take_live(self, tails: list[bytes], first: int) -> None:
        """Records from ``first`` were just appended and written with these
        ``tails``: send them as they are if this subscription is at ``first``
        (no read back from the log), else :meth:`pump`."""
        if self.next_seq != first or self.until is not None:
            self.pump()
        elif self._send(tails):
            self.topic.wait_for_records(self)

    def _send(self, tails: list[Any]) -> bool:
        """Send ``tails`` (records from :attr:`next_seq`) as far as the
        guarantees allow; whether all went (else it waits for guarantees)."""
        connection = self.connection
        if self.timestamps:
            try:
                times = self.log.times(self.next_seq, len(tails))
            except LogError:
                return False  # closed under us: the broker is stopping
            taken = connection.send_timed(self, tails, times)
        else:
            taken = connection.send_deliveries(self, tails)
        if taken is None:
            return False  # the client is freeing it
        if taken:
            sent = tails if taken == len(tails) else tails[:taken]
            cost = sum(map(len, sent)) + DELIVER_HEAD_ESTIMATE * taken
            connection.written_later(LoanedItem(self.account, cost, None))
        if taken < len(tails):
            # Waiting for guarantees: what only this subscriber's reading clears.
            connection.subscription_stalled(self)
            return False
        return True

    def ack(self, seq: int) -> None:
        """The subscriber processed every record up to offset ``seq`` (within
        what was sent): retention may drop them, and a durable cursor moves on."""
        acked = min(seq, self.next_seq - 1)
        if acked <= self.acked:
            return
        self.acked = acked
        if acked + 1 > self.holder.position:
            self.holder.advance_to(acked + 1)
        if self._cursors is not None and self.cursor_key is not None:
            self._cursors.store(self.cursor_key, acked + 1)
        self.topic.reader_moved()

    def attach(self, connection: Subscriber, processed: int) -> int:
        """A resumed connection takes over; the subscriber processed up to
        ``processed``. What it did not process is read from the log again;
        returns how many deliveries that is."""
        self.connection = connection  # type: ignore[assignment]  # the same connection type
        if processed >= self.next_seq:
            # Restored after a broker restart: the client had what it
            # processed from the broker before it (within what the log holds).
            self.next_seq = min(processed, self.log.written_offset) + 1
        self.ack(processed)
        resend = self.next_seq - 1 - self.acked
        self.next_seq = self.acked + 1
        self.pump()
        return resend

    def close(self) -> None:
        """Leave the topic; stop holding back retention."""
        self.topic.unsubscribe(self)
        self.holder.close()
        self.topic.reader_moved()
        self.account.close()


def make_log_subscription(
    connection: LogSubscriber,
    handle: int,
    topic: Topic,
    mode: str,
    request: StartRequest,
    *,
    log: TopicStore,
    cursors: CursorBook | None,
    principal: str | None,
) -> LogSubscription:
    """A :class:`LogSubscription` starting where ``request`` says (a known
    durable cursor: after its last acknowledged record)."""
    key = None
    position: int | None = None
    if request.cursor is not None:
        if cursors is None:
            raise OptionError('"cursor" needs a broker that stores cursors')
        key = cursor_key(principal, topic.topic_name, request.cursor)
        position = cursors.position(key)
    if position is None:
        position = log.reader(request.start, register=False).position
        if key is not None and cursors is not None:
            cursors.store(key, position)
    return LogSubscription(
        connection,
        handle,
        topic,
        mode,
        log,
        position,
        cursors=cursors,
        cursor_key=key,
        until=request.until,
        timestamps=request.timestamps,
    )
