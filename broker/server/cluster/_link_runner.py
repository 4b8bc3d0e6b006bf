"""Running a link's connections (see ``_link``): connect to the owner's Unix
socket, serve the connection with a reader, a writer and a keepalive task
until it breaks, and connect again with backoff, until cancelled.

The reader only hands each read's events to the link (in an
:class:`~._wake.Outbox` step, so what they cause on client connections is
written together) and never waits for anything but its socket. What the
link queues during an outbox step (a client's read that forwarded
publishes or Acks, the link's own read) is written at the end of the step
by the task that ran it, with one non-blocking ``write`` on the socket
(see ``_wake`` and ``_socket_io``), as a client connection's output is; the
writer task sends only what that could not (the socket was full, or
nothing was open) and what the keepalive queues.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Protocol

import trio

from broker.backoff import Backoff
from broker.protocol import Connection, ConnectionClosed

from ..transport._socket_io import SocketIO, socket_io
from ..transport._wake import Outbox, Wake

__all__ = ["LinkRunner", "LinkSide"]

log = logging.getLogger("broker.server")

RECEIVE_SIZE = 65536


class LinkSide(Protocol):
    """What runs over the link's connections: the link's state."""

    @property
    def open(self) -> bool:
        """The current connection was welcomed by the owner."""
        ...

    @property
    def connects(self) -> int:
        """How many connections were welcomed so far."""
        ...

    def connected(self) -> Connection:
        """A new connection, its Hello queued."""
        ...

    def handle(self, conn: Connection, events: Iterable[object]) -> str | None:
        """Apply a read's events; why the connection ended, if it did."""
        ...

    def broken(self) -> None:
        """The current connection is gone."""
        ...


class LinkRunner:
    """Keeps a link connected to ``path`` (see the module)."""

    def __init__(self, side: LinkSide, outbox: Outbox, name: str, owner: str, path: str) -> None:
        self.side = side
        self.outbox = outbox
        self.name = name
        self.owner = owner
        self.path = path
        self._wake = Wake(outbox)
        self._wake.write_now = self._write_now
        #: The current connection and its socket's fast path (None: none).
        self._conn: Connection | None = None
        self._io: SocketIO | None = None
        #: The writer task is in a ``send_all``.
        self._sending = False
        #: What a write from another task could not send: the writer sends
        #: it first.
        self._unsent = b""

    def flush(self) -> None:
        """Something was queued on the connection: it is sent (at the end of
        the outbox step under way, if one is; else by the writer)."""
        self._wake.set()

    def _write_now(self) -> bool:
        """Send what is queued from the calling task, if the writer is idle
        and the socket takes it all now; False if the writer must (it is
        woken then)."""
        conn, io = self._conn, self._io
        if conn is None or io is None or self._sending or self._unsent:
            return False
        data = conn.data_to_send(trio.current_time())
        if not data:
            return True
        try:
            sent = io.send_nowait(data)
        except OSError:
            sent = 0  # the writer meets the error and ends the connection
        if sent < len(data):
            self._unsent = data[sent:]
            return False
        return True

    async def run(self) -> None:
        """Keep the link connected until cancelled (reconnecting after the
        waits of a :class:`~broker.backoff.Backoff`, short again after a
        connection that was welcomed)."""
        backoff = Backoff()
        while True:
            try:
                stream = await trio.open_unix_socket(self.path)
            except OSError as error:
                log.debug("%s: cannot reach %s (%s): retrying", self.name, self.owner, error)
            else:
                connects = self.side.connects
                try:
                    reason = await self._serve(stream)
                except Exception:  # a bug of ours: this connection ends, not the broker
                    log.exception(
                        "%s: link to %s ended by an internal error", self.name, self.owner
                    )
                    reason = ""
                if self.side.connects > connects:
                    backoff.reset()
                    if reason:
                        log.info("%s: link to %s broke: %s", self.name, self.owner, reason)
            await trio.sleep(backoff.next())

    async def _serve(self, stream: trio.SocketStream) -> str:
        """Serve one connection of the link until it breaks; why it did."""
        conn = self._conn = self.side.connected()
        self._io = socket_io(stream)
        self._unsent = b""
        reason = ""
        try:
            async with trio.open_nursery() as nursery:

                async def reader() -> None:
                    nonlocal reason
                    reason = await self._reader(stream, conn)
                    nursery.cancel_scope.cancel()

                async def keepalive() -> None:
                    nonlocal reason
                    reason = await self._keepalive(conn)
                    nursery.cancel_scope.cancel()

                nursery.start_soon(reader)
                nursery.start_soon(keepalive)
                stopped = await self._writer(stream, conn)
                reason = reason or stopped
                nursery.cancel_scope.cancel()
        finally:
            self._conn = self._io = None
            self._unsent = b""
            self.side.broken()
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(stream)
        return reason

    async def _writer(self, stream: trio.SocketStream, conn: Connection) -> str:
        """Send what is queued whenever woken (what a write from another
        task left unsent first); why it stopped."""
        while True:
            data = conn.data_to_send(trio.current_time())
            if self._unsent:
                data, self._unsent = self._unsent + data, b""
            if data:
                self._sending = True
                try:
                    await stream.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError) as error:
                    return f"socket error: {error}"
                finally:
                    self._sending = False
            elif conn.closed:
                return ""
            else:
                await self._wake.wait()

    async def _keepalive(self, conn: Connection) -> str:
        """Ping the owner in time and notice when it goes silent."""
        while not conn.closed:
            await trio.sleep_until(conn.next_deadline())
            events = conn.handle_timer(trio.current_time())
            self.flush()
            for event in events:
                if isinstance(event, ConnectionClosed):
                    return f"owner silent: {event.reason}"
        return ""

    async def _reader(self, stream: trio.SocketStream, conn: Connection) -> str:
        """Hand each read's events to the link; why the connection ended."""
        outbox = self.outbox
        io = self._io
        while True:
            if io is not None:
                data: bytes = await io.receive_some(RECEIVE_SIZE)
                if not data:
                    return "closed by the owner, or broken"
            else:
                try:
                    data = await stream.receive_some(RECEIVE_SIZE)
                except (trio.BrokenResourceError, trio.ClosedResourceError) as error:
                    return f"socket error: {error}"
                if not data:
                    return "closed by the owner"
            events = conn.receive_data(data, trio.current_time())
            outbox.open()
            try:
                reason = self.side.handle(conn, events)
                self.flush()  # (written as the step ends, with what the events caused)
            finally:
                outbox.close()
            if reason is not None:
                return reason
