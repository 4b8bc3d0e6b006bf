"""TLS in memory for the blocking client: ciphertext in and out, plaintext between.

The blocking client owns a non-blocking socket and its own write buffer;
:class:`TLSPipe` sits between that buffer and the protocol, so the client's
I/O loop stays the same with or without TLS (an ``ssl.SSLObject`` over two
``MemoryBIO``, the sans-IO way).
"""

from __future__ import annotations

import contextlib
import ssl


class TLSPipe:
    """One TLS client session over memory buffers.

    :meth:`receive` takes bytes read from the socket and returns the
    plaintext they complete; :meth:`send` takes plaintext and returns
    nothing (the records wait in :meth:`take_output`). Before the handshake
    is done, :meth:`send` must not be called; :attr:`established` says when.
    Certificate or protocol failures raise :class:`ssl.SSLError`.
    """

    def __init__(self, context: ssl.SSLContext, server_hostname: str) -> None:
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._object = context.wrap_bio(
            self._incoming, self._outgoing, server_hostname=server_hostname
        )
        #: The handshake is done: plaintext may flow.
        self.established = False
        #: The broker ended the TLS session (close_notify).
        self.closed = False
        #: TLS failed (a bad record, a certificate refused): nothing more flows.
        self.failed = False
        self._advance()  # the ClientHello

    def _advance(self) -> None:
        try:
            self._object.do_handshake()
        except ssl.SSLWantReadError:
            return
        except ssl.SSLError:
            self.failed = True
            raise
        self.established = True

    def receive(self, data: bytes) -> bytes:
        """The plaintext that ``data`` (from the socket) completes, perhaps none."""
        if self.failed:
            return b""
        self._incoming.write(data)
        if not self.established:
            self._advance()
            if not self.established:
                return b""
        chunks = []
        while True:
            try:
                chunk = self._object.read(64 * 1024)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError:
                self.closed = True
                break
            except ssl.SSLError:
                self.failed = True
                raise
            if not chunk:  # close_notify (CPython returns b"" rather than raising)
                self.closed = True
                break
            chunks.append(chunk)
        return b"".join(chunks)

    def send(self, data: bytes) -> None:
        """Encrypt ``data``; its records join :meth:`take_output`. After a
        failure, nothing more is sent."""
        if self.failed:
            return
        try:
            self._object.write(data)
        except ssl.SSLError:
            self.failed = True
            raise

    def take_output(self) -> bytes:
        """TLS records to write to the socket (handshake, data, alerts)."""
        return self._outgoing.read()

    def close(self) -> None:
        """Queue a close_notify (without waiting for the broker's)."""
        if self.failed or self.closed:
            return
        with contextlib.suppress(ssl.SSLError):  # SSLWantReadError included
            self._object.unwrap()


def failure_hint(cause: object) -> str:
    """What to check after a failed TLS handshake, from OpenSSL's reason in
    ``cause`` (its text): a parenthesised hint with a leading space, or ``""``."""
    text = str(cause)
    if "WRONG_VERSION_NUMBER" in text:  # (it answered, not in TLS)
        return " (does the broker use TLS? without tls:// the connection is plain TCP)"
    if "CERTIFICATE_VERIFY_FAILED" in text:  # self-signed, or a private CA
        return (
            " (the broker's certificate is not trusted: give the CA that signed it with"
            " --cafile PEM, or client_context(cafile=...); a self-signed certificate is its own)"
        )
    return ""
