"""The last moment of a connection the broker closes.

After its last bytes (a Goodbye, an MQTT CONNACK refusal or DISCONNECT), a
connection is half-closed and what the peer still sends is read and
dropped, for at most :data:`LINGER_SECONDS`: closing at once, with unread
bytes in the socket, would reset the connection and could lose those last
bytes before the peer read them.
"""

from __future__ import annotations

import trio

__all__ = ["LINGER_SECONDS", "linger"]

#: How long a closing connection reads and drops what its peer still sends.
LINGER_SECONDS = 1.0

#: Bytes asked of the stream per read while lingering.
_RECEIVE_SIZE = 64 * 1024


async def linger(stream: trio.abc.Stream) -> None:
    """Half-close ``stream`` (if it can) and drop what it still receives,
    until the peer closes or :data:`LINGER_SECONDS` pass. Stream errors go
    to the caller; cancellation goes through."""
    with trio.move_on_after(LINGER_SECONDS):
        if isinstance(stream, trio.abc.HalfCloseableStream):
            await stream.send_eof()
        while await stream.receive_some(_RECEIVE_SIZE):
            pass
