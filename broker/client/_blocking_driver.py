"""The blocking client's engine: one session driven over a socket, from
whichever thread calls (under the client's lock), and from a heartbeat thread.

:class:`BlockingDriver` connects (``_socket.py``), feeds the sans-IO
:class:`~broker.client._core.ClientSession` what it reads, writes what it
queues, runs its timers and its flows (``_flows.py``), and replaces a broken
connection; :class:`~broker.client.BlockingClient` adds the operations. See
``_blocking.py`` for the threading rules.
"""

from __future__ import annotations

import contextlib
import logging
import ssl
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import TypeVar

from broker.protocol import Policy
from broker.protocol.connection import ClientSessionState

from . import _flows as flows
from ._common import (
    PEER_CLOSED,
    ClientError,
    ConnectionLost,
    client_policy,
    connection_target,
    show_address,
    split_url,
)
from ._core import ClientSession, Ending
from ._socket import SocketPipe
from ._topics import DEFAULT_MAX_TOPICS
from ._view import SessionView

log = logging.getLogger("broker.client")

#: Pending output above this many bytes is written at once (without waiting);
#: below it, output waits for the next wait, flush, close or heartbeat.
SEND_THRESHOLD = 64 * 1024

T = TypeVar("T")


def deadline_in(timeout: float | None) -> float | None:
    """``timeout`` seconds from now on the monotonic clock (None: no deadline)."""
    if timeout is None:
        return None
    return time.monotonic() + max(timeout, 0.0)


def remaining(deadline: float | None) -> float | None:
    """Seconds left until ``deadline`` (None: no limit)."""
    return None if deadline is None else max(deadline - time.monotonic(), 0.0)


def _heartbeat(
    client_ref: weakref.ref[BlockingDriver],
    stop: threading.Event,
    nudge: threading.Event,
    interval: float,
) -> None:
    """The heartbeat thread's loop: a tick every ``interval`` seconds, and
    when a held acknowledgement falls due (``nudge`` is set when one starts
    being held); holds the client only weakly between ticks."""
    timeout = interval
    while True:
        nudge.wait(timeout)
        nudge.clear()
        if stop.is_set():
            return
        client = client_ref()
        if client is None:
            return
        timeout = interval
        if client._heartbeat_tick():  # (else the lock's holder services it)
            due = client._session.held.earliest()
            if due is not None:
                timeout = min(interval, max(due - time.monotonic(), 0.001))
        del client


class BlockingDriver(SessionView):
    """A session with one broker, driven by the threads that call it (see
    :class:`~broker.client.BlockingClient` for the arguments)."""

    def __init__(
        self,
        url: str = "127.0.0.1:7400",
        *,
        name: str = "blocking-client",
        connect_timeout: float = 10.0,
        policy: Policy | None = None,
        token: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        optimism: int = 0,
        reconnect: float = 0.0,
        on_session_lost: Callable[[], object] | None = None,
        max_topics: int = DEFAULT_MAX_TOPICS,
    ) -> None:
        if reconnect < 0:
            raise ClientError("reconnect must be >= 0 seconds")
        if max_topics < 1:
            raise ClientError("max_topics must be at least 1")
        self._host, self._port, self._context = connection_target(url, ssl_context, token)
        self._session = ClientSession(
            name,
            client_policy(policy, optimism),
            token,
            max_topics=max_topics,
            reconnect=reconnect,
            clock=time.monotonic,
        )
        self._connect_timeout = connect_timeout
        self._on_session_lost = on_session_lost
        self._lock = threading.RLock()
        self._service_requested = False
        self._stop = threading.Event()
        self._nudge = nudge = threading.Event()
        self._session.held.on_timer = lambda due: nudge.set()  # (not self: no cycle)
        self._thread: threading.Thread | None = None
        self._pipe: SocketPipe | None = None
        with self._lock:
            self._open(time.monotonic() + connect_timeout, None)
        welcome = self._session.conn.welcome_message
        assert welcome is not None
        self._thread = threading.Thread(
            target=_heartbeat,
            args=(weakref.ref(self), self._stop, self._nudge, welcome.heartbeat_ms / 2000),
            name=f"broker-heartbeat:{name}",
            daemon=True,
        )
        self._thread.start()

    def _open(self, deadline: float, resume: ClientSessionState | None) -> None:
        """Connect, say Hello (resuming ``resume``) and wait for the Welcome (lock held).

        Raises :class:`ConnectionLost` if that fails by ``deadline``.
        """
        host, port = self._host, self._port
        plan = self._session.plan
        if plan is not None and plan.redirect:  # where the session lives (Goodbye 8)
            host, port, _ = split_url(plan.redirect)
        waited = round(deadline - time.monotonic(), 1)
        try:
            self._pipe = SocketPipe(host, port, deadline, self._context, self._host)
        except OSError as error:
            raise ConnectionLost(
                f"cannot connect to {host}:{port}: {error}", unreachable=True
            ) from error
        session = self._session
        try:
            conn = session.start(time.monotonic(), resume)
            self._wait_until(lambda: conn.welcome_message is not None, deadline, "handshake")
        except (TimeoutError, ConnectionLost) as error:
            self._close_pipe()
            lost = error if isinstance(error, ConnectionLost) else None
            tls = self._context is not None
            raise session.handshake_error(lost, show_address(host, port), waited, tls) from None
        except BaseException:
            self._close_pipe()
            raise

    @property
    def closed(self) -> bool:
        """The connection has ended for good (by either side); operations raise
        :class:`ConnectionLost`. A connection being replaced is not closed."""
        return self._session.closed

    @property
    def reconnecting(self) -> bool:
        """The connection broke and is being replaced (see ``reconnect``)."""
        session = self._session
        return session.broken is not None and session.error is None

    @property
    def _sock(self) -> object | None:
        """The socket of the current connection (None: none is open)."""
        return None if self._pipe is None else self._pipe.sock

    def _check_open(self) -> None:
        self._session.check_open()

    def _fail(self, error: ConnectionLost) -> None:
        """The connection is over: write what we can, close the socket; then
        replace it (``reconnect``) or end the client."""
        pipe = self._pipe
        if pipe is not None:
            with contextlib.suppress(ConnectionLost):
                pipe.collect(self._session.conn)
                pipe.send_some()
        self._close_pipe()
        if self._session.fail(error, time.monotonic()) is Ending.ENDED:
            self._stop_heartbeat()

    def _stop_heartbeat(self) -> None:
        """The client ended: its heartbeat thread stops (at once)."""
        self._stop.set()
        self._nudge.set()

    def _close_pipe(self) -> None:
        pipe, self._pipe = self._pipe, None
        if pipe is not None:
            pipe.close()

    # ---------------------------------------------------------------- reconnecting

    def _reconnect_step(self, deadline: float | None) -> None:
        """While reconnecting: wait for the next attempt (no later than
        ``deadline``), or make it; the client ends once the plan gives up."""
        session = self._session
        plan = session.plan
        assert plan is not None
        now = time.monotonic()
        if now < plan.next_attempt:
            until = plan.next_attempt if deadline is None else min(deadline, plan.next_attempt)
            time.sleep(max(until - now, 0.0))
            return
        error = self._reconnect_attempt(plan.attempt_deadline(now, self._connect_timeout))
        if error is not None:
            session.attempt_failed(error, time.monotonic())
            if session.error is not None:
                self._stop_heartbeat()

    def _reconnect_attempt(self, deadline: float) -> ConnectionLost | None:
        """Connect once and resume the session (or restore a lost one); the error if not."""
        session = self._session
        state = session.begin_attempt(time.monotonic())
        try:
            self._open(deadline, state)
            session.check_open()  # it may have broken right after the Welcome
            lost = session.attempt_welcomed()
            if lost is not None:
                self._run(flows.restore(session, lost), deadline, "restoring the session")
        except (ConnectionLost, TimeoutError) as error:
            self._close_pipe()
            if isinstance(error, ConnectionLost):
                return error
            return ConnectionLost(f"restoring the session timed out: {error}")
        except BaseException:
            # Raised to the caller (e.g. LimitReached while restoring a lost
            # session): this attempt is over; a later call attempts again.
            self._close_pipe()
            session.attempt_aborted()
            raise
        broke_again = session.attempt_error if self._pipe is None else None
        session.reconnected()
        if broke_again is not None:  # it broke again once the session was restored
            self._fail(broke_again)
        if lost is not None and self._on_session_lost is not None:
            self._on_session_lost()
        return None

    # ---------------------------------------------------------------- I/O

    def _write_now(self) -> None:
        """Write what is pending, as far as the socket takes it now."""
        pipe = self._pipe
        if pipe is None:
            return
        try:
            pipe.collect(self._session.conn)
            pipe.send_some()
        except ConnectionLost as error:
            self._fail(error)

    def _read_available(self) -> None:
        """Read and process everything the socket holds now (never waits)."""
        session = self._session
        while (pipe := self._pipe) is not None:
            try:
                data = pipe.read()
            except ConnectionLost as error:
                self._fail(error)
                return
            if data is None:
                return
            if data:
                lost = session.receive_data(data, time.monotonic())
                if lost is not None:
                    self._fail(lost)
                    return
            if pipe.eof:
                self._fail(ConnectionLost(PEER_CLOSED))
                return

    def _keepalive(self) -> None:
        """Ping when this side has been silent, send held acknowledgements
        when due (what the timers queued is written at once); give up on a
        silent broker."""
        if self._pipe is not None:
            session = self._session
            lost = session.handle_timer(time.monotonic())
            if lost is not None:
                self._fail(lost)
            elif session.conn.bytes_to_send:
                self._write_now()

    def _service(self) -> None:
        """Without waiting: read what is readable, keep alive, write what is pending."""
        self._service_requested = False
        if self._pipe is None:
            return
        self._read_available()
        self._keepalive()
        self._write_now()

    def _heartbeat_tick(self) -> bool:
        """Called by the heartbeat thread: service now (or reconnect, when an
        attempt is due), or ask the lock's holder to (then False).

        Never raises: an unexpected error ends the connection (and is logged),
        so the application sees it as :class:`ConnectionLost` on its next call.
        """
        if not self._lock.acquire(blocking=False):
            self._service_requested = True
            return False
        session = self._session
        try:
            if session.broken is not None and session.error is None:
                plan = session.plan
                if plan is not None and time.monotonic() >= plan.next_attempt:
                    self._reconnect_step(time.monotonic())
            else:
                self._service()
        except Exception as error:
            log.exception("%s: heartbeat failed", session.name)
            session.broken = None
            self._fail(ConnectionLost(f"heartbeat failed: {error!r}"))
        finally:
            self._lock.release()
        return True

    def _acquire(self, deadline: float | None) -> bool:
        """Take the client's lock, waiting no later than ``deadline``; whether it was taken."""
        if deadline is None:
            return self._lock.acquire()
        return self._lock.acquire(timeout=max(deadline - time.monotonic(), 0.0))

    @contextlib.contextmanager
    def _locked(self, deadline: float | None) -> Iterator[None]:
        """Hold the client's lock, waiting for it no later than ``deadline``.

        Raises :class:`TimeoutError` if another thread holds it until then.
        """
        if not self._acquire(deadline):
            raise TimeoutError("another thread kept the client busy")
        try:
            yield
        finally:
            self._lock.release()

    def _after_operation(self, *, urgent: bool = False) -> None:
        """End of a call that may have queued output: write it if it is due.

        Publishes are batched (written once ``SEND_THRESHOLD`` bytes are
        pending); ``urgent`` output (guarantees after a release, frees) is
        written at once, without waiting.
        """
        pending = self._session.conn.bytes_to_send
        if pending >= SEND_THRESHOLD or (urgent and pending):
            self._write_now()
        if self._service_requested:
            self._service()

    def _step(self, deadline: float | None) -> bool:
        """Wait once for the socket, the next heartbeat or ``deadline``, and process it.

        Pending output is written while waiting; the socket is read whenever
        it is readable; a broken connection is replaced (``reconnect``).
        Returns whether ``deadline`` has passed.
        """
        session = self._session
        if session.broken is not None and not session.attempting:
            self._reconnect_step(deadline)
            return deadline is not None and time.monotonic() >= deadline
        self._write_now()
        pipe = self._pipe
        if pipe is None:
            self._check_open()
            if session.broken is not None and not session.attempting:
                return False  # it broke just now: reconnect on the next step
            raise ConnectionLost("the connection is closed")
        timeout = remaining(deadline)
        due = session.next_deadline()
        if due is not None:
            until_timer = max(due - time.monotonic(), 0.0)
            timeout = until_timer if timeout is None else min(timeout, until_timer)
        try:
            readable, writable = pipe.wait(timeout)
            if writable:
                pipe.send_some()
        except ConnectionLost as error:
            self._fail(error)
            readable = False
        if readable:
            self._read_available()
        self._keepalive()
        return deadline is not None and time.monotonic() >= deadline

    def _wait_until(self, condition: Callable[[], bool], deadline: float | None, what: str) -> None:
        """Do I/O until ``condition()`` holds (lock held).

        ``condition`` is checked before each wait and once more after the
        deadline has passed (so a zero timeout still processes what the
        socket holds). Raises :class:`ConnectionLost` if the connection ends
        first and :class:`TimeoutError` if ``deadline`` passes first.
        """
        expired = False
        while not condition():
            self._check_open()
            if expired:
                raise TimeoutError(f"{what} timed out")
            expired = self._step(deadline)

    def _run(self, steps: flows.Steps[T], deadline: float | None, what: str) -> T:
        """Run one of the session's flows to its result, waiting as it asks (lock held)."""
        with flows.Flow(steps) as flow:
            for condition in flow:
                self._wait_until(condition, deadline, what)
        return flow.result
