"""The trio client's engine: one session driven by trio tasks.

:class:`TrioDriver` runs, per connection, a reader task (bytes in), a writer
task (bytes out) and a keepalive task (the session's timers), those of a
:class:`~broker.pump.Pump`, and a reconnection task when a connection breaks; it feeds the sans-IO
:class:`~broker.client._core.ClientSession` and runs its flows
(``_flows.py``), parking until their conditions hold.
:class:`~broker.client.Client` adds the operations.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import trio

from broker.protocol import Connection, Policy
from broker.pump import Pump, Signal

from . import _flows as flows
from ._common import PEER_CLOSED, ConnectionLost
from ._core import ClientSession, Ending
from ._topics import DEFAULT_MAX_TOPICS
from ._view import SessionView

T = TypeVar("T")


class TrioDriver(SessionView):
    """A session with one broker over a trio stream (see :func:`~broker.client.open_client`)."""

    def __init__(
        self,
        stream: trio.abc.Stream,
        name: str,
        policy: Policy | None,
        token: str | None = None,
        *,
        connect: Callable[[str | None], Awaitable[trio.abc.Stream]] | None = None,
        reconnect: float = 0.0,
        connect_timeout: float = 10.0,
        on_session_lost: Callable[[], object] | None = None,
        max_topics: int = DEFAULT_MAX_TOPICS,
    ) -> None:
        self._session = session = ClientSession(
            name,
            policy,
            token,
            max_topics=max_topics,
            reconnect=reconnect if connect is not None else 0.0,
            clock=trio.current_time,
        )
        session.on_output = self._wake_writer
        self._stream = stream
        self._changed = trio.lowlevel.ParkingLot()
        #: Wakes the writer (of whichever connection is current).
        self._wakeup = Signal()
        self._since_yield = 0
        self._writer_done = trio.Event()
        self._connect = connect
        self._connect_timeout = connect_timeout
        self._on_session_lost = on_session_lost
        self._nursery: trio.Nursery | None = None
        self._scope: trio.CancelScope | None = None
        #: Streams of broken connections (closed soon, and for sure on exit).
        self._retired: list[trio.abc.Stream] = []

    @property
    def _reconnecting(self) -> bool:
        """A broken connection is being replaced (callers wait meanwhile)."""
        return self._session.broken is not None

    @property
    def reconnecting(self) -> bool:
        """The connection broke and is being replaced (see ``reconnect``)."""
        return self._reconnecting

    # ---------------------------------------------------------------- running

    async def _run(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        conn = self._session.start(trio.current_time())
        nursery.start_soon(self._serve, self._stream, conn)
        self._wake_writer()
        await self._wait_for(lambda: conn.welcome_message is not None)

    async def _serve(self, stream: trio.abc.Stream, conn: Connection) -> None:
        """Run one connection's reader, writer and keepalive (until replaced)."""
        done = self._writer_done = trio.Event()
        pump = Pump(stream, conn, self._wakeup)
        with trio.CancelScope() as scope:
            self._scope = scope
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._reader, pump)
                nursery.start_soon(self._writer, pump, done)
                nursery.start_soon(self._keepalive, pump)

    def _fail(self, error: ConnectionLost, conn: Connection) -> None:
        """``conn`` ended with ``error`` (nothing to do if it was replaced already)."""
        if conn is not self._session.conn:
            return
        ending = self._session.fail(error, trio.current_time())
        if ending is Ending.RECONNECT:
            self._start_reconnect()
        elif ending is Ending.ENDED:
            self._wakeup.set()
        self._changed.unpark_all()

    def _check_open(self) -> None:
        """Raise :class:`ConnectionLost` if the client has ended (a connection
        being replaced has not: the application's calls wait meanwhile)."""
        self._session.check_open(attempt=False)

    async def _wait_for(self, condition: Callable[[], bool], *, attempt: bool = False) -> None:
        """Until ``condition()`` holds; raises :class:`ConnectionLost` if the
        client ends first (or, with ``attempt``, the connection attempt fails)."""
        while not condition():
            self._session.check_open(attempt=attempt)
            self._wake_writer()  # (what the condition's attempt queued)
            await self._changed.park()

    async def _run_flow(self, steps: flows.Steps[T], *, attempt: bool = False) -> T:
        """Run one of the session's flows to its result, waiting as it asks."""
        self._session.check_open(attempt=attempt)  # (a closed client sends nothing)
        with flows.Flow(steps) as flow:
            for condition in flow:
                await self._wait_for(condition, attempt=attempt)
                self._wake_writer()
        return flow.result

    async def _ready_for_the_application(self) -> None:
        """Until no connection is being replaced (the application's calls wait)."""
        await self._wait_for(lambda: self._session.broken is None)

    def _wake_writer(self) -> None:
        self._wakeup.set()

    async def _reader(self, pump: Pump) -> None:
        session = self._session
        stream, conn = pump.stream, pump.conn

        def turn(data: bytes | bytearray) -> bool:
            if stream in self._retired or conn is not session.conn:
                # Replaced while this read was under way (a read can return
                # after its cancellation): what it brought belongs to the old
                # connection, and the resume sends it again.
                return False
            lost = session.receive_data(data, trio.current_time())
            if lost is not None:
                self._fail(lost, conn)
            if conn.bytes_to_send:
                self._wakeup.set()
            self._changed.unpark_all()
            return not conn.closed

        def ended(error: Exception | None) -> None:
            if error is not None:
                self._fail(ConnectionLost(f"connection broken: {_why(error)}"), conn)
            elif stream not in self._retired and conn is session.conn:  # (see turn)
                self._fail(ConnectionLost(PEER_CLOSED), conn)

        if not conn.closed:
            await pump.read(turn, ended)

    async def _writer(self, pump: Pump, done: trio.Event) -> None:
        session = self._session
        conn = pump.conn

        def broken(error: Exception) -> None:
            self._fail(ConnectionLost(f"connection broken: {_why(error)}"), conn)

        try:
            await pump.write(broken, done=lambda: session.error is not None)
        finally:
            done.set()

    async def _keepalive(self, pump: Pump) -> None:
        """The session's timers: Pings and held acknowledgements when due; a
        silent broker ends the connection."""
        session = self._session
        conn = pump.conn

        def over() -> bool:
            return conn.closed or session.error is not None or conn is not session.conn

        def due() -> float:
            due = session.next_deadline()
            return conn.next_deadline() if due is None else due

        def fire(now: float) -> bool:
            lost = session.handle_timer(now)
            if lost is not None:
                self._fail(lost, conn)
                return True
            if conn.bytes_to_send:
                self._wake_writer()
            return False

        while conn.welcome_message is None:
            if over():
                return
            await self._changed.park()
        # (an acknowledgement held back until a sooner time wakes it sooner)
        session.held.on_timer = pump.sooner
        await pump.keep_time(fire, due=due, over=over)

    # ---------------------------------------------------------------- reconnecting

    def _start_reconnect(self) -> None:
        """Replace the broken connection, resuming the session (see :func:`open_client`)."""
        assert self._nursery is not None
        if self._scope is not None:
            self._scope.cancel()
        self._retired.append(self._stream)
        self._nursery.start_soon(trio.aclose_forcefully, self._stream)
        self._nursery.start_soon(self._reconnect_loop)

    async def _reconnect_loop(self) -> None:
        """Connect again, with backoff, until the session is resumed or
        restored (see :class:`~broker.client._resume.ReconnectPlan`)."""
        session = self._session
        while True:
            plan = session.plan
            assert plan is not None
            await trio.sleep_until(plan.next_attempt)
            deadline = plan.attempt_deadline(trio.current_time(), self._connect_timeout)
            outcome = await self._attempt(deadline)
            if isinstance(outcome, bool):
                break
            session.attempt_failed(outcome, trio.current_time())
            self._changed.unpark_all()
            if session.error is not None:
                self._wakeup.set()
                return
        session.reconnected()
        self._changed.unpark_all()
        self._wake_writer()
        if outcome and self._on_session_lost is not None:
            self._on_session_lost()

    async def _attempt(self, deadline: float) -> bool | ConnectionLost:
        """One connection attempt until ``deadline``: whether the session was
        lost (and restored) once welcomed, else the error."""
        assert self._connect is not None and self._nursery is not None
        session = self._session
        try:
            with trio.fail_after(max(deadline - trio.current_time(), 0)):
                plan = session.plan
                stream = await self._connect(None if plan is None else plan.redirect)
        except trio.TooSlowError:
            return ConnectionLost("cannot connect in time")
        except OSError as error:
            return ConnectionLost(f"cannot connect: {error}", unreachable=True)
        except ConnectionLost as error:
            return error
        conn = session.start(trio.current_time(), session.begin_attempt(trio.current_time()))
        self._stream = stream
        self._nursery.start_soon(self._serve, stream, conn)
        self._wake_writer()
        try:
            with trio.fail_after(max(deadline - trio.current_time(), 0)):
                while conn.welcome_message is None and session.attempt_error is None:
                    await self._changed.park()
                session.check_open()
                lost = session.attempt_welcomed()
                if lost is not None:
                    await self._run_flow(flows.restore(session, lost), attempt=True)
            return lost is not None
        except (ConnectionLost, trio.TooSlowError) as error:
            if self._scope is not None:
                self._scope.cancel()
            self._retired.append(stream)
            await trio.aclose_forcefully(stream)
            if isinstance(error, ConnectionLost):
                return error
            return session.attempt_error or ConnectionLost("no Welcome in time")


def _why(error: BaseException) -> str:
    """What broke a stream: trio's errors often say nothing themselves and
    carry the cause (a TLS alert, a reset) in ``__cause__``."""
    cause = error.__cause__
    text = str(error)
    if cause is not None and str(cause) and str(cause) not in text:
        text = f"{text}: {cause}" if text else str(cause)
    return text or type(error).__name__
