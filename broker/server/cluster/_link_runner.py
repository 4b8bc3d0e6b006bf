"""Running a link's connections (see ``_link``): connect to the owner's Unix
socket (a worker's) or TCP address (a front end's, ``host:port``), serve
the connection with a reader, a writer and a keepalive task (a
:class:`~broker.pump.Pump`) until it breaks, and connect again with
backoff, until cancelled.

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
from broker.pump import Pump

from ..transport._socket_io import socket_io
from ..transport._wake import Outbox, Wake

__all__ = ["LinkRunner", "LinkSide"]

log = logging.getLogger("broker.server")


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
        #: Written from the outbox step's task by the current connection's pump
        #: (its ``write_now``: None while there is no connection).
        self._wake = Wake(outbox)

    def flush(self) -> None:
        """Something was queued on the connection: it is sent (at the end of
        the outbox step under way, if one is; else by the writer)."""
        self._wake.set()

    async def run(self) -> None:
        """Keep the link connected until cancelled (reconnecting after the
        waits of a :class:`~broker.backoff.Backoff`, short again after a
        connection that was welcomed)."""
        backoff = Backoff()
        while True:
            try:
                stream = await self._open()
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

    async def _open(self) -> trio.SocketStream:
        """A connection to the owner: its Unix socket, or ``host:port``."""
        if self.path.startswith("/"):
            return await trio.open_unix_socket(self.path)
        host, _, port = self.path.rpartition(":")
        return await trio.open_tcp_stream(host.strip("[]"), int(port))

    async def _serve(self, stream: trio.SocketStream) -> str:
        """Serve one connection of the link until it breaks; why it did."""
        conn = self.side.connected()
        pump = Pump(stream, conn, self._wake, io=socket_io(stream))
        self._wake.write_now = pump.write_now
        self._wake.set()  # (the Hello)
        outbox = self.outbox
        side = self.side
        reason = ""
        silent = ""

        def turn(data: bytes | bytearray) -> bool:
            """Hand a read's events to the link (in an outbox step)."""
            nonlocal reason
            events = conn.receive_data(data, trio.current_time())
            outbox.open()
            try:
                ended = side.handle(conn, events)
                self.flush()  # (written as the step ends, with what the events caused)
            finally:
                outbox.close()
            if ended is None:
                return True
            reason = ended
            return False

        def read_ended(error: Exception | None) -> None:
            nonlocal reason
            if error is not None:
                reason = f"socket error: {error}"
            elif pump.io is not None:
                reason = "closed by the owner, or broken"
            else:
                reason = "closed by the owner"

        def write_failed(error: Exception) -> None:
            nonlocal reason
            reason = reason or f"socket error: {error}"

        def timer(now: float) -> bool:
            """Ping the owner in time and notice when it goes silent."""
            nonlocal silent
            events = conn.handle_timer(now)
            self.flush()
            for event in events:
                if isinstance(event, ConnectionClosed):
                    silent = f"owner silent: {event.reason}"
                    return True
            return False

        try:
            async with trio.open_nursery() as nursery:

                async def reader() -> None:
                    await pump.read(turn, read_ended)
                    nursery.cancel_scope.cancel()

                async def keepalive() -> None:
                    nonlocal reason
                    await pump.keep_time(timer)
                    reason = silent
                    nursery.cancel_scope.cancel()

                nursery.start_soon(reader)
                nursery.start_soon(keepalive)
                await pump.write(write_failed)
                nursery.cancel_scope.cancel()
        finally:
            self._wake.write_now = None
            pump.close()
            self.side.broken()
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(stream)
        return reason
