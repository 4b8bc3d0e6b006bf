"""One client connection: the I/O driver around a sans-IO Connection.

:class:`ServerConnection` runs a reader, a writer and a keepalive task (a
:class:`~broker.pump.Pump`); a read's events go to
:class:`~._dispatch.Dispatch` (publishes and guarantees in line, control
events to the part whose job they are:
:class:`~._admission.Admission`, :class:`~._publishing.Publishing`,
:class:`~._delivery.Deliveries`, :class:`~._budget.ConnectionBudget`). The
protocol is never called while it handles a read: the policy only computes
(see ``_budget``); the budget books its grants once ``receive_data`` has
returned, and settles after the read's events.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from accounts import Account, LoanedItem
from broker.protocol import Connection, ConnectionClosed, Event, GoodbyeCode, Role
from broker.protocol.connection import DELIVER_SLACK
from broker.pump import Pump

from .._peer_logging import ConnectionLog
from .._principal_usage import ConnectionLedger, PrincipalUsage
from .._services import BrokerServices
from ..sessions._records import RecordCopies
from ..sessions._session import Session
from ..topics._topic import Subscription
from ..transport._linger import LINGER_SECONDS, linger
from ..transport._socket_io import socket_io
from ..transport._wake import Wake
from ._admission import Admission
from ._answers import ControlCharges
from ._budget import ConnectionBudget
from ._delivery import ConnectionCounters, Deliveries
from ._dispatch import Dispatch
from ._policy import BrokerPolicy
from ._publishing import FORWARD_BATCH, FORWARD_SLICE, PublishChannel, Publishing

__all__ = [
    "FORWARD_BATCH",
    "FORWARD_SLICE",
    "FRAMES_PER_TURN",
    "LINGER_SECONDS",
    "RECEIVE_SIZE",
    "ConnectionCounters",
    "PublishChannel",
    "ServerConnection",
]

#: Bytes asked of the socket per read. The connection account is checked
#: between turns; channel frames are bounded by guarantees regardless.
RECEIVE_SIZE = 64 * 1024
#: Frames one turn of the reader handles at most before the other tasks go
#: (a read of tiny frames holds thousands): the rest wait in the protocol.
FRAMES_PER_TURN = 64


class ServerConnection:
    """The broker's end of one TCP connection (see the module).

    Its parts: :attr:`admission` (Hello, credentials, session),
    :attr:`publishing` (publish channels, forwarding, Confirms, commits),
    :attr:`deliveries` (subscriptions and what they send) and :attr:`budget`
    (receive buffers). The reader stops reading while the connection's
    account is blocked (the backstop) or while too much output waits for a
    client that does not read. Nothing holds the connection but its tasks,
    the broker and its session, so a closed one is freed by reference counting.
    """

    def __init__(
        self,
        services: BrokerServices,
        forget: Callable[[ServerConnection], None],
        stream: trio.abc.Stream,
        serial: int,
        peer: str,
        identity: str | None = None,
        *,
        trusted: bool = False,
    ) -> None:
        #: What the broker offers its parts (each part is handed the ones it uses).
        self.services = services
        resources = self._resources = services.resources
        self._life = services.life
        self._storage = services.storage
        #: Cluster mode: the session (hex id) whose record the output waits
        #: for to be kept in the cluster ("": none; ``sessions._cluster_records``).
        self._record_waited = ""
        #: Called once the connection closed and is cleaned up (the broker forgets it).
        self._forget = forget
        self.stream = stream
        self.serial = serial
        #: Another worker's link (trusted), not a client: left out of client metrics.
        self.link = trusted
        config = services.config
        self.peer = peer
        self.name = f"conn-{serial}"
        self.account = Account(
            self.name,
            high_watermark=config.connection_high_watermark,
            low_watermark=config.connection_low_watermark,
            parent=resources.account,
            kind="connection",
        )
        self.counters = ConnectionCounters()
        #: What this connection reserved of the buffer budgets.
        self.ledger = ConnectionLedger(resources)
        self._wake = Wake(resources.outbox)
        self._log = ConnectionLog(resources.peer_log, self.name, peer)
        # No reference cycles through the connection (its parts never hold
        # it; the policy sees the budget through a proxy and the channels
        # through their dict), so a closed connection is freed by reference
        # counting (see test_churn).
        #: Who gets the connection's receive-buffer budget, and when.
        self.budget = ConnectionBudget(config, self.ledger)
        channels: dict[int, PublishChannel] = {}

        def publish_blocked(index: int) -> bool:
            """Publish channel ``index``'s account withholds its guarantees."""
            state = channels.get(index)
            return state is not None and state.account.blocked

        self.protocol = Connection(
            Role.BROKER,
            policy=BrokerPolicy(weakref.proxy(self.budget), publish_blocked),
            # A worker's link passes clients' publishes on under handles of its
            # own, a few bytes longer at most: as far over max_frame as a Deliver.
            max_frame=config.max_frame + (DELIVER_SLACK if trusted else 0),
            max_message=config.max_message,
            heartbeat=config.heartbeat,
            lease=config.lease,
            now=trio.current_time(),
        )
        self.protocol.accept_origins = trusted
        self.budget.protocol = self.protocol
        self.budget.pool = resources.budget_pool
        self.budget.wake = self._wake
        resources.budget_pool.add(self.budget)
        self.ledger.buffer_reserved = self.budget.capacity_in_use()  # (none before the Hello)
        self.deliveries = Deliveries(
            self.name,
            self.protocol,
            self.counters,
            self._wake,
            lossy_budget=config.lossy_budget,
            root_account=resources.account,
        )
        self.publishing = Publishing(
            services.config,
            services.life,
            services.topics,
            services.commits,
            services.seen,
            self.name,
            self.account,
            self.protocol,
            self.budget,
            self.counters,
            self._wake,
            self._log,
        )
        self.publishing.channels = channels
        self.admission = Admission(
            services.gate,
            services.sessions,
            services.storage,
            self.protocol,
            self.publishing,
            self.deliveries,
            self.ledger,
            self._log,
            peer=peer,
            identity=identity,
            trusted=trusted,
        )
        self.dispatch = Dispatch(
            services,
            self.admission,
            self.publishing,
            self.deliveries,
            self.budget,
            self.counters,
            self._log,
        )
        #: The Hello must have arrived by then, whatever else the peer sends.
        self._hello_deadline = trio.current_time() + config.hello_timeout
        self._writing: list[LoanedItem[Any]] = []
        #: Control frames whose answers wait to be written (see ``_answers``).
        self.control_charges = ControlCharges(self.account)
        self._drained = trio.Event()
        self._nursery: trio.Nursery | None = None
        self.closed = trio.Event()
        self.close_reason = ""
        #: The connection was cut without waiting for the client to read.
        self._aborted = False
        #: The reader waits for a reassembly slot before its next turn.
        self._slot_wanted = False
        #: The lease expired: the keepalive gives the Goodbye a moment, then cuts.
        self._lease_expired = False
        #: The reader, writer and keepalive (with the plain socket's fast path).
        self._pump = Pump(
            stream,
            self.protocol,
            self._wake,
            io=socket_io(stream),
            counts=self.counters,
            take=self._take_output,
            written=self._written,
            ready=self._may_write_now,
        )
        self._wake.write_now = self._pump.write_now

    # ================================================================ views

    @property
    def channels(self) -> dict[int, PublishChannel]:
        """The publish channels, by topic handle."""
        return self.publishing.channels

    @property
    def subscriptions(self) -> dict[int, Subscription]:
        """The session's subscriptions, by handle."""
        return self.deliveries.subscriptions

    @property
    def buffer_reserved(self) -> int:
        """Receive-buffer capacity this connection reserved of the budgets."""
        return self.ledger.buffer_reserved

    @property
    def dropping_bytes(self) -> int:
        """What this connection's lossy and latest queues hold."""
        return self.deliveries.dropping_bytes

    @property
    def identity(self) -> str | None:
        """The verified client certificate's common name (mutual TLS), if any."""
        return self.admission.identity

    @property
    def principal(self) -> PrincipalUsage | None:
        """The authenticated principal's usage (None while unauthenticated or without auth)."""
        return self.admission.principal

    @property
    def client_name(self) -> str:
        """The name the client gave in its Hello (at most 64 characters)."""
        return self.admission.client_name

    @property
    def session(self) -> Session | None:
        """The session this connection serves (None before the Welcome)."""
        return self.admission.session

    @property
    def ends_session(self) -> bool:
        """The session ends with this connection (else it waits for a resume)."""
        return self.admission.ends_session

    # ================================================================ lifecycle

    async def run(self) -> None:
        """Serve the connection until either side closes it."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = self.publishing.nursery = nursery
                nursery.start_soon(self._reader)
                nursery.start_soon(self._keepalive)
                await self._writer()
                nursery.cancel_scope.cancel()
            if not self._aborted:
                await linger(self.stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as error:
            self.close_reason = self.close_reason or f"socket error: {error}"
        finally:
            self._cleanup()
            with trio.CancelScope(shield=True), trio.move_on_after(1):
                await self.stream.aclose()
            self.closed.set()

    def goodbye(self, code: GoodbyeCode, reason: str) -> None:
        """Say Goodbye; the writer sends it and closes the connection."""
        if not self.protocol.closed:
            self.protocol.goodbye(code, reason)
            self.close_reason = self.close_reason or f"goodbye {int(code)}: {reason}"
        self.wake_writer()

    def shutting_down(self) -> None:
        """The broker shuts down: send the last Confirms (of what was routed),
        then Goodbye 5 (or a refusal held back, now)."""
        if self.admission.held is not None:
            self.admission.held.cancel()
        if self.publishing.confirm_dirty and not self.protocol.closed:
            self._persist()
            self.publishing.send_confirms()
        self.goodbye(GoodbyeCode.SHUTTING_DOWN, "broker shutting down")

    def _persist(self) -> None:
        """Write the session's record and the broker's state journal (a broker
        with a data directory) before anything relying on them is sent; in
        cluster mode note the record's copy the output waits for."""
        storage = self._storage
        records = storage.session_records
        if records is not None:
            copies = records.copies
            before = 0 if copies is None else copies.generation
            self.admission.record(records)
            storage.persist_state()
            if copies is not None and copies.generation != before:
                session = self.admission.session
                if session is not None:
                    self._record_waited = session.id.hex()

    def _copies(self) -> RecordCopies | None:
        records = self._storage.session_records
        return None if records is None else records.copies

    def _record_waits(self) -> bool:
        """Whether the output waits for the session's record to be kept in
        the cluster (the writer is woken once it is)."""
        copies = self._copies()
        if copies is None or copies.stored(self._record_waited):
            self._record_waited = ""
            return False
        copies.when_stored(self._record_waited, self.wake_writer)
        return True

    def _cleanup(self) -> None:
        self._wake.write_now = None  # (the reference cycles through the pump's hooks:
        self._pump.close()  # freed by refcount after; its descriptor may be reused)
        self._persist()
        self.admission.leave(end=self._life.closing)
        self.publishing.close_all()
        self.deliveries.close_all()
        for loan in self._writing:
            loan.repay()
        self._writing = []
        self.control_charges.repay()
        resources = self._resources
        resources.reassembly.release(self)
        self.account.close()
        self.ledger.reserve(-self.ledger.buffer_reserved)
        resources.budget_pool.remove(self.budget)
        resources.budget_pool.freed()
        self._forget(self)
        self._log(logging.INFO, "closed: %s", self.close_reason or "done")

    def hand_over(self) -> None:
        """The session resumes on another connection while this one still
        looks alive: let go of it now, forward what was received, and close."""
        if self.admission.session is None:
            return
        self.admission.detach()
        self.publishing.close_all()
        self.goodbye(GoodbyeCode.NORMAL, "session resumed on another connection")

    # ================================================================ writer

    def wake_writer(self) -> None:
        self._wake.set()

    async def _writer(self) -> None:
        await self._pump.write(self._write_failed, hold=self._held)

    def _held(self) -> Awaitable[None] | None:
        """A refusal held back: the writer waits until it is let go; and
        until the session's record is kept in the cluster (cluster mode)."""
        held = self.admission.held
        if held is not None:
            return self._hold(held)
        if self._record_waited:
            copies = self._copies()
            if copies is not None and not copies.stored(self._record_waited):
                return self._record_kept(copies, self._record_waited)
        return None

    async def _record_kept(self, copies: RecordCopies, session: str) -> None:
        kept = trio.Event()
        copies.when_stored(session, kept.set)
        await kept.wait()

    async def _hold(self, held: trio.CancelScope) -> None:
        with held:
            await trio.sleep_forever()
        self.admission.held = None

    def _write_failed(self, error: Exception) -> None:
        self.close_reason = self.close_reason or f"socket error: {error}"
        self._nursery_cancel()

    def _take_output(self) -> list[bytes]:
        """What is queued to send, made ready (buffers to write in order,
        large message tails not copied: see ``pieces_to_send``): what the Confirms and
        Outcomes about to go out rely on (staged publishes, commits, the
        session's record) is written first, the Confirms are queued, and the
        loans of the deliveries being sent move to ``_writing`` (where
        clean-up finds them if the write never completes: a reset, a
        shutdown) until :meth:`_written`."""
        protocol = self.protocol
        publishing = self.publishing
        self._persist()
        if self._record_waited and self._record_waits():
            return []  # (the session's record is not in the cluster yet: woken then)
        if publishing.confirm_dirty and not protocol.closed:
            # (A Goodbye read since the routing was noted closes the protocol:
            # nothing more may be said then.)
            publishing.send_confirms()
        deliveries = self.deliveries
        if deliveries.inflight:
            if self._writing:
                self._writing += deliveries.inflight
            else:
                self._writing = deliveries.inflight
            deliveries.inflight = []
        if self.control_charges.waiting:
            self._writing += self.control_charges.take()
        return protocol.pieces_to_send(trio.current_time())

    def _written(self) -> None:
        """Everything taken for sending is with the kernel: its loans are repaid."""
        loans = self._writing
        if loans:
            self._writing = []
            for loan in loans:
                loan.repay()
        self._drained.set()

    def _may_write_now(self) -> bool:
        """What is queued may be written from the calling task (see
        ``_wake``; besides the pump's own conditions: a plain socket, the
        writer idle, nothing unfinished): not while a refusal is held back,
        nor once the connection is closing (the writer does it then)."""
        return not self.protocol.closed and self.admission.held is None

    # ================================================================ reader

    async def _reader(self) -> None:
        try:
            await self._pump.read(
                self._turn,
                self._peer_closed,
                pause=self._pause_if_needed,
                frames_left=True,
                size=RECEIVE_SIZE,
            )
        finally:
            self._resources.outbox.flush()  # (what turns of a read cut short left noted)

    def _turn(self, data: bytes | bytearray) -> bool:
        """Hand a read (or, with ``b""``, the frames it left waiting) to the
        protocol, at most ``FRAMES_PER_TURN`` frames, and act on the events;
        whether to read on."""
        protocol = self.protocol
        outbox = self._resources.outbox
        dispatch = self.dispatch
        frames, size = protocol.frames_received, protocol.bytes_received
        events = protocol.receive_data(data, trio.current_time(), max_frames=FRAMES_PER_TURN)
        self.budget.book()  # (what the policy granted the channels the read opened)
        # The protocol is done with the turn: only now is it acted on. What
        # it causes to be sent, on any connection, is written after (``_wake``).
        outbox.open()
        try:
            dispatch.channel_frames = dispatch.channel_bytes = 0
            if events:
                self._handle_events(events)
            # (An Absolve may have completed a shrink; handles may have gone;
            # channels opened short get their shrinks and top-ups.)
            self.budget.settle()
            if protocol.bytes_to_send or protocol.closed:
                self._wake.set()
        finally:
            # Output waits for the read's last turn (or another task's).
            outbox.close(flush=not protocol.frames_waiting)
        self.control_charges.note(
            protocol.frames_received - frames - dispatch.channel_frames,
            protocol.bytes_received - size - dispatch.channel_bytes,
        )
        if not protocol.frames_waiting:  # (the read's last turn)
            self.control_charges.settle(bool(protocol.bytes_to_send or self._pump.unsent))
        if not self._resources.reassembly.update(self, protocol.reassembling):
            self._slot_wanted = True  # (waited for before the next turn)
        return not protocol.closed

    def _peer_closed(self, error: Exception | None) -> None:
        """The stream ended, or broke: nothing more can reach the peer."""
        self.close_reason = self.close_reason or "peer closed the connection"
        if not self.protocol.closed:
            self.protocol.goodbye(GoodbyeCode.NORMAL, "connection closed")
        # Nothing more can reach a peer that closed: the writer stops.
        self._nursery_cancel()

    def _nursery_cancel(self) -> None:
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    async def _pause_if_needed(self) -> None:
        if self._slot_wanted:
            self._slot_wanted = False
            await self._suspended(self._resources.reassembly.wait_for_slot(self))
        max_unsent = self._resources.config.max_unsent
        if self.protocol.memory_to_send > max_unsent:
            # Write what the read's turns held (perhaps all it takes), then wait.
            self._resources.outbox.flush()
            if self.protocol.memory_to_send > max_unsent:
                self.counters.reader_pauses += 1
                self._drained = trio.Event()
                await self._suspended(self._drained.wait())
        deliveries = self.deliveries
        if not deliveries.refresh_stalled() and not self.account.is_clear():
            self._resources.outbox.flush()
        if not deliveries.refresh_stalled() and not self.account.is_clear():
            self.counters.reader_pauses += 1
            with trio.CancelScope() as scope:
                deliveries.funds_scope = scope
                try:
                    await self._suspended(self.account.ensure_clear_funds())
                finally:
                    deliveries.funds_scope = None

    async def _suspended(self, wait: Awaitable[None]) -> None:
        """Await ``wait`` with the client's lease not running (we are not reading)."""
        protocol = self.protocol
        protocol.suspend_reading(trio.current_time())
        try:
            await wait
        finally:
            protocol.resume_reading(trio.current_time())

    # ================================================================ keepalive

    async def _keepalive(self) -> None:
        await self._pump.keep_time(self._timer, due=self._next_deadline)
        if self._lease_expired:
            # A client that reads nothing would keep the writer (and the
            # connection) forever: the Goodbye gets a moment, not more.
            await trio.sleep(LINGER_SECONDS)
            self.close_reason = self.close_reason or "lease expired"
            self._aborted = True  # no more lingering for it either
            self._nursery_cancel()

    def _next_deadline(self) -> float:
        protocol = self.protocol
        deadline = protocol.next_deadline()
        if protocol.welcome_message is None:
            deadline = min(deadline, self._hello_deadline)
        return deadline

    def _timer(self, now: float) -> bool:
        """The protocol's timers (a Ping, the lease) and the Hello's; True
        once the connection is to end."""
        protocol = self.protocol
        if protocol.welcome_message is None and now >= self._hello_deadline:
            self.goodbye(GoodbyeCode.LEASE_EXPIRED, "no Hello in time")
            return True
        handshake = protocol.welcome_message is None
        events = protocol.handle_timer(now)
        self.wake_writer()  # a Ping, or a Goodbye, may be queued
        expired = [e for e in events if isinstance(e, ConnectionClosed)]
        if expired:
            if not handshake:
                self.services.gate.security.lease_expirations += 1
            reason = expired[0].reason
            self.close_reason = self.close_reason or f"goodbye {int(expired[0].code)}: {reason}"
            self._lease_expired = True
            return True
        return False

    # ================================================================ events

    def _handle_events(self, events: list[Event]) -> None:
        """Apply a read's events (see :class:`~._dispatch.Dispatch`)."""
        self.dispatch.handle(events, self)
