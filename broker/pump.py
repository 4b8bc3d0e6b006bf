"""One connection's bytes on a trio stream: the reader, writer and timer
tasks around a sans-IO :class:`~broker.protocol.Connection`, for the
broker's client connections, the workers' links and the trio client.

A :class:`Pump` holds what the three tasks share: the stream, the
connection, the writer's wake-up call and what a write left unsent. Each
task is one method, given hooks for what its user does differently:

- :meth:`Pump.read` reads (with the plain socket's fast path, if given one)
  and hands each read to a ``turn`` hook, until the hook says stop or the
  stream ends (``ended``); an optional ``pause`` runs before each read (the
  server's throttling), and with ``frames_left`` (turns that pass
  ``max_frames``) the frames a turn left waiting get the next turn, after
  the other tasks had their go, without reading.
- :meth:`Pump.write` waits for its wake-up call and sends what ``take``
  gives (after what a write from another task left unsent), until the
  connection is closed and has nothing left to send (or ``done``).
- :meth:`Pump.keep_time` sleeps until the connection's next deadline (or
  ``due``'s) and calls ``fire``; :meth:`Pump.sooner` brings the wait forward.
- :meth:`Pump.write_now` writes what is queued from the calling task
  without waiting (a plain socket only, when the writer is idle): what an
  outbox flush calls (``broker/server/transport/_wake.py``), leaving what
  the socket did not take for the writer.

The hooks are plain calls (no awaits, no allocations on the way), except
the server's ``pause`` and ``hold``. Only the stream's ordinary failures
(``trio.BrokenResourceError``, ``trio.ClosedResourceError``) are caught;
cancellation and anything else go through.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import Protocol

import trio

from broker.protocol import Connection

__all__ = ["RECEIVE_SIZE", "ByteCounts", "FastIO", "Pump", "Signal", "Waker"]

#: Bytes asked of the stream per read.
RECEIVE_SIZE = 64 * 1024


class FastIO(Protocol):
    """A plain socket's reads and writes without trio's per-call yields
    (``broker/server/transport/_socket_io.py``'s ``SocketIO``)."""

    async def receive_some(self, max_bytes: int) -> bytes:
        """The next bytes; ``b""`` once the peer closed or the socket broke."""
        ...

    def send_nowait(self, data: bytes) -> int:
        """How much of ``data`` the socket took now; ``OSError`` if broken."""
        ...


class Waker(Protocol):
    """The writer's wake-up call (``Wake``, or :class:`Signal`)."""

    async def wait(self) -> None:
        """Until it is set (at once if it was meanwhile), and re-arm."""
        ...


class ByteCounts(Protocol):
    """Where the bytes read and written are counted."""

    bytes_in: int
    bytes_out: int


class _Counts:
    """Bytes counted by a pump whose user keeps no count."""

    __slots__ = ("bytes_in", "bytes_out")

    def __init__(self) -> None:
        self.bytes_in = 0
        self.bytes_out = 0


class Signal:
    """A wake-up call without an outbox: :meth:`set` any number of times;
    :meth:`wait` returns once it was set since the last :meth:`wait` returned.

    ``set`` is the current event's own method (no call in between: it is
    called once per message published)."""

    __slots__ = ("_event", "set")

    def __init__(self) -> None:
        self._event = event = trio.Event()
        self.set: Callable[[], None] = event.set

    async def wait(self) -> None:
        await self._event.wait()
        self._event = event = trio.Event()
        self.set = event.set


def _no_pieces() -> list[bytes]:
    return []


def _data_to_send(conn: Connection) -> list[bytes]:
    """What ``conn`` has queued, as one buffer (the default ``take``)."""
    data = conn.data_to_send(trio.current_time())
    return [data] if data else []


class Pump:
    """The reader, writer and timer tasks of one connection (see the module).

    ``take`` gives what is queued, as buffers to write in order (default:
    the connection's ``data_to_send``); ``written`` runs once all that was
    taken is with the kernel; ``ready`` says whether :meth:`write_now` may
    write now (besides the writer being idle and nothing left unsent).
    """

    __slots__ = (
        "conn",
        "counts",
        "io",
        "ready",
        "sending",
        "stream",
        "take",
        "timer",
        "unsent",
        "wake",
        "written",
    )

    def __init__(
        self,
        stream: trio.abc.Stream,
        conn: Connection,
        wake: Waker,
        *,
        io: FastIO | None = None,
        counts: ByteCounts | None = None,
        take: Callable[[], list[bytes]] | None = None,
        written: Callable[[], None] | None = None,
        ready: Callable[[], bool] | None = None,
    ) -> None:
        self.stream = stream
        self.conn = conn
        self.wake = wake
        #: The plain socket's fast path (None: TLS, another kind of stream,
        #: or a user that keeps trio's own reads).
        self.io = io
        self.counts: ByteCounts = _Counts() if counts is None else counts
        # (the default bound to the connection, not the pump: no cycle)
        self.take = partial(_data_to_send, conn) if take is None else take
        self.written = written
        self.ready = ready
        #: The writer is sending (a write from another task would interleave).
        self.sending = False
        #: Buffers a write from another task could not finish: the writer sends them first.
        self.unsent: list[bytes] = []
        #: The timer task's current wait (see :meth:`sooner`).
        self.timer = trio.CancelScope()

    def close(self) -> None:
        """The connection is done: no more writes from other tasks (its
        descriptor is closed next, and may be reused), and the hooks (bound
        to the pump's user, which holds the pump) are let go."""
        self.io = None
        self.take = _no_pieces
        self.written = None
        self.ready = None

    # ================================================================ reader

    async def read(
        self,
        turn: Callable[[bytes | bytearray], bool],
        ended: Callable[[Exception | None], None],
        *,
        pause: Callable[[], Awaitable[None]] | None = None,
        frames_left: bool = False,
        size: int = RECEIVE_SIZE,
    ) -> None:
        """Read, and hand each read to ``turn`` until it returns False;
        ``ended(None)`` when the stream ends, ``ended(error)`` when it breaks
        (a fast path reports both as the end). ``pause`` runs before each
        turn. With ``frames_left`` (``turn`` passes ``max_frames`` to
        ``receive_data``), frames a turn left waiting get the next turns, as
        ``b""``, after the other tasks had their go."""
        conn = self.conn
        stream = self.stream
        io = self.io
        counts = self.counts
        data: bytes | bytearray
        while True:
            if pause is not None:
                await pause()
            if frames_left and conn.frames_waiting:  # (the rest of a read: others go first)
                await trio.lowlevel.checkpoint()
                data = b""
            else:
                if io is not None:
                    data = await io.receive_some(size)
                else:
                    try:
                        data = await stream.receive_some(size)
                    except (trio.BrokenResourceError, trio.ClosedResourceError) as error:
                        ended(error)
                        return
                if not data:
                    ended(None)
                    return
                counts.bytes_in += len(data)
            if not turn(data):
                return

    # ================================================================ writer

    async def write(
        self,
        broken: Callable[[Exception], None],
        *,
        hold: Callable[[], Awaitable[None] | None] | None = None,
        done: Callable[[], bool] | None = None,
    ) -> None:
        """Whenever woken, send what is queued (what a write from another
        task left unsent first), until the connection is closed with nothing
        left to send, or ``done()``; ``broken(error)`` if the stream breaks.
        ``hold`` may give something to wait for before taking output."""
        conn = self.conn
        stream = self.stream
        wake = self.wake
        counts = self.counts
        woken = False
        while True:
            if not woken:
                await wake.wait()
            if hold is not None:
                holding = hold()
                if holding is not None:
                    await holding
            pieces = self.take()
            if self.unsent:
                pieces = self.unsent + pieces
                self.unsent = []
            if pieces:
                self.sending = True
                try:
                    for data in pieces:
                        await stream.send_all(data)
                        counts.bytes_out += len(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError) as error:
                    broken(error)
                    return
                finally:
                    self.sending = False
            if self.written is not None:
                self.written()
            if done is not None and done():
                return
            # (Closed while sending, by what was read meanwhile: the rest, then stop.)
            woken = conn.closed
            if woken and not conn.bytes_to_send:
                return

    def write_now(self) -> bool:
        """Write what is queued from the calling task, if the writer is idle
        and the stream has a fast path; False if the writer must (what the
        socket did not take now is left to it)."""
        io = self.io
        if io is None or self.sending or self.unsent:
            return False
        ready = self.ready
        if ready is not None and not ready():
            return False
        pieces = self.take()
        counts = self.counts
        for index, data in enumerate(pieces):
            try:
                sent = io.send_nowait(data)
            except OSError:
                # The writer meets the error and ends the connection.
                self.unsent = pieces[index:]
                return False
            counts.bytes_out += sent
            if sent < len(data):
                self.unsent = [data[sent:], *pieces[index + 1 :]]
                return False
        written = self.written
        if written is not None:
            written()
        return True

    # ================================================================ timers

    async def keep_time(
        self,
        fire: Callable[[float], bool],
        *,
        due: Callable[[], float] | None = None,
        over: Callable[[], bool] | None = None,
    ) -> None:
        """Until the connection is closed (or ``over()``, checked after each
        wait too), sleep until its next deadline (or ``due()``) and call
        ``fire(now)``; stop when it returns True."""
        conn = self.conn
        while not (conn.closed if over is None else over()):
            timer = self.timer = trio.CancelScope(
                deadline=conn.next_deadline() if due is None else due()
            )
            with timer:
                await trio.sleep_forever()
            if over is not None and over():
                return
            if fire(trio.current_time()):
                return

    def sooner(self, due: float) -> None:
        """Wake the timer task by ``due`` at the latest."""
        timer = self.timer
        timer.deadline = min(timer.deadline, due)
