"""The blocking client's transport: a non-blocking socket, its write buffer,
a selector to wait on, and TLS in memory (:class:`~._tls.TLSPipe`) between.

It moves bytes only: what they mean is the session's business. Failures are
raised as :class:`~broker.client.ConnectionLost`.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import ssl
import time

from broker.protocol import Connection

from ._common import PEER_CLOSED, ConnectionLost
from ._tls import TLSPipe, failure_hint

#: Bytes asked of the socket per ``recv``.
RECEIVE_SIZE = 64 * 1024


class SocketPipe:
    """A connection to ``host:port`` made by ``deadline`` (monotonic), in TLS
    with ``context`` if given (the certificate checked for ``server_hostname``,
    by default ``host``); :class:`OSError` if it cannot be made."""

    def __init__(
        self,
        host: str,
        port: int,
        deadline: float,
        context: ssl.SSLContext | None,
        server_hostname: str | None = None,
    ) -> None:
        timeout = max(deadline - time.monotonic(), 0.001)
        self.sock: socket.socket | None = socket.create_connection((host, port), timeout=timeout)
        #: TLS between the write buffer and the protocol (None: plain TCP).
        self.tls = TLSPipe(context, server_hostname or host) if context is not None else None
        self.wbuf = bytearray()
        #: The peer ended the stream (TLS close_notify) after the last read.
        self.eof = False
        self._selector = selectors.DefaultSelector()
        self._mask = selectors.EVENT_READ
        try:
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.sock.setblocking(False)
            self._selector.register(self.sock, self._mask)
        except BaseException:
            self.close()
            raise
        if self.tls is not None:
            self.wbuf += self.tls.take_output()  # the ClientHello

    def shutdown(self) -> None:
        """Shut the socket down both ways, from any thread: a wait on it in
        another thread returns, and its read finds the stream ended."""
        sock = self.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        """Close the socket (at once); later calls do nothing."""
        sock, self.sock = self.sock, None
        if sock is not None:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(sock)
            sock.close()
            self._selector.close()
        self.wbuf.clear()

    def collect(self, conn: Connection) -> None:
        """Move what ``conn`` has queued into the write buffer (through TLS,
        once its handshake is done)."""
        tls = self.tls
        if tls is None:
            if conn.bytes_to_send:
                self.wbuf += conn.data_to_send(time.monotonic())
            return
        try:
            if tls.established and conn.bytes_to_send:
                tls.send(conn.data_to_send(time.monotonic()))
        except ssl.SSLError as error:
            raise ConnectionLost(f"TLS error: {error}{failure_hint(error)}") from None
        self.wbuf += tls.take_output()

    def send_some(self) -> None:
        """Write as much of the write buffer as the socket takes now (never waits)."""
        sock = self.sock
        wbuf = self.wbuf
        while wbuf and sock is not None:
            try:
                sent = sock.send(wbuf)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:
                raise ConnectionLost(f"connection broken: {error}") from None
            del wbuf[:sent]

    def read(self) -> bytes | None:
        """Plaintext the socket holds now (perhaps empty: TLS records without
        any yet), or None if nothing is readable. The end of the stream
        raises :class:`ConnectionLost`, except a TLS close_notify: then
        :attr:`eof` is set and the plaintext before it returned."""
        sock = self.sock
        if sock is None:
            return None
        try:
            data = sock.recv(RECEIVE_SIZE)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError as error:
            raise ConnectionLost(f"connection broken: {error}") from None
        if not data:
            raise ConnectionLost(PEER_CLOSED)
        tls = self.tls
        if tls is None:
            return data
        try:
            data = tls.receive(data)
        except ssl.SSLError as error:
            raise ConnectionLost(f"TLS error: {error}{failure_hint(error)}") from None
        self.wbuf += tls.take_output()  # handshake replies
        self.eof = tls.closed
        return data

    def wait(self, timeout: float | None) -> tuple[bool, bool]:
        """Wait up to ``timeout`` seconds (None: no limit) until the socket is
        readable, or writable while output is pending: ``(readable, writable)``."""
        sock = self.sock
        if sock is None:
            return False, False
        mask = selectors.EVENT_READ | (selectors.EVENT_WRITE if self.wbuf else 0)
        if mask != self._mask:
            self._selector.modify(sock, mask)
            self._mask = mask
        ready = self._selector.select(timeout)
        if not ready:
            return False, False
        events = ready[0][1]
        return bool(events & selectors.EVENT_READ), bool(events & selectors.EVENT_WRITE)

    def linger(self, conn: Connection, seconds: float) -> None:
        """Write what is pending (``conn``'s Goodbye, TLS close_notify) within
        ``seconds``, then read until the broker closes its end, so that
        closing does not reset the connection before the broker read it."""
        deadline = time.monotonic() + seconds
        with contextlib.suppress(ConnectionLost):
            self.collect(conn)
            if self.tls is not None and self.tls.established:
                self.tls.close()  # close_notify after the Goodbye
                self.collect(conn)
            while self.wbuf and self.sock is not None:
                self.send_some()
                if self.wbuf and not self._wait_for(selectors.EVENT_WRITE, deadline):
                    return
        sock = self.sock
        if sock is None:
            return
        try:
            sock.shutdown(socket.SHUT_WR)
            while self._wait_for(selectors.EVENT_READ, deadline):
                if not sock.recv(RECEIVE_SIZE):
                    return
        except OSError:
            return  # the connection is going away anyway (or nothing to read yet)

    def _wait_for(self, mask: int, deadline: float) -> bool:
        """Wait for readiness ``mask`` until ``deadline``; False if it did not come."""
        sock = self.sock
        if sock is None:
            return False
        if mask != self._mask:
            self._selector.modify(sock, mask)
            self._mask = mask
        timeout = deadline - time.monotonic()
        return timeout > 0 and bool(self._selector.select(timeout))
