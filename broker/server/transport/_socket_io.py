"""Reads and writes on a plain TCP socket without trio's per-call yields.

trio's ``SocketStream`` yields to the scheduler after every successful
``recv`` and ``send`` (so that a busy stream cannot starve other tasks);
each yield is a task switch. At everyday rates, when every read carries one
message, those switches are most of a connection's cost. :class:`SocketIO`
reads with a non-blocking ``read`` and yields only when the data was there
without waiting (the same fairness: one yield per read under load), and
writes with a non-blocking ``write`` from whatever task has output ready.
It works on the socket's file descriptor: only for a plain
``trio.SocketStream`` (:func:`socket_io` gives None for TLS and other
streams, which keep their stream's own methods).
"""

from __future__ import annotations

import os

import trio

__all__ = ["SocketIO", "socket_io"]


class SocketIO:
    """Non-blocking reads and writes on one connected socket (see the module)."""

    __slots__ = ("_emptied", "fd")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        #: The last read took less than it asked for: the socket was emptied,
        #: so the next read waits for data first instead of trying (a read
        #: that would fail is a system call saved per message at low rates;
        #: epoll reports data that came meanwhile at once).
        self._emptied = False

    async def receive_some(self, max_bytes: int) -> bytes:
        """The next bytes the peer sent (at most ``max_bytes``), waiting for
        some if none are there; ``b""`` once the peer closed the connection
        or it broke (reset), or the stream was closed meanwhile. A checkpoint,
        as trio's ``receive_some`` is."""
        fd = self.fd
        if not self._emptied:
            try:
                data = os.read(fd, max_bytes)
            except BlockingIOError:
                pass
            except OSError:
                await trio.lowlevel.checkpoint()
                return b""
            else:
                # The data was there without waiting: others go first (fairness).
                await trio.lowlevel.checkpoint()
                self._emptied = len(data) < max_bytes
                return data
        while True:
            try:
                await trio.lowlevel.wait_readable(fd)
            except trio.ClosedResourceError:
                return b""
            try:
                data = os.read(fd, max_bytes)
            except BlockingIOError:
                continue  # (a spurious wake-up)
            except OSError:
                return b""
            self._emptied = len(data) < max_bytes
            return data

    def send_nowait(self, data: bytes) -> int:
        """Write as much of ``data`` as the socket takes now; how much that
        was (0 if it takes nothing now). Raises ``OSError`` if the
        connection is broken."""
        try:
            return os.write(self.fd, data)
        except BlockingIOError:
            return 0


def socket_io(stream: trio.abc.Stream) -> SocketIO | None:
    """The fast path for ``stream``: only a plain ``trio.SocketStream``."""
    if type(stream) is trio.SocketStream:
        return SocketIO(stream.socket.fileno())
    return None
