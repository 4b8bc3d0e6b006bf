"""A tiny HTTP/1.1 client (``h11`` over trio TCP): one GET per connection,
for the supervisor to read its workers' metrics endpoints."""

from __future__ import annotations

from typing import Final

import h11
import trio

#: Largest response head read, in bytes.
MAX_RESPONSE_HEAD: Final = 16 * 1024
#: Largest response body read by default, in bytes.
MAX_RESPONSE_BYTES: Final = 32 * 1024 * 1024
#: Bytes asked of the socket at a time.
_CHUNK: Final = 64 * 1024


class FetchError(Exception):
    """The server could not be reached, or its answer was not a complete
    HTTP/1.1 response within the size limits."""


async def http_get(
    address: tuple[str, int], path: str, *, max_bytes: int = MAX_RESPONSE_BYTES
) -> tuple[int, bytes]:
    """``GET path`` from the server at ``address``: its status code and body.

    Raises :class:`FetchError` if the connection fails, the response is
    malformed or incomplete, or its body exceeds ``max_bytes``. It has no
    timeout of its own: the caller bounds it (``trio.move_on_after``).
    """
    host, port = address
    connection = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_RESPONSE_HEAD)
    request = h11.Request(
        method="GET",
        target=path,
        headers=[("Host", f"{host}:{port}"), ("Connection", "close"), ("User-Agent", "broker")],
    )
    try:
        stream = await trio.open_tcp_stream(host, port)
    except OSError as error:
        raise FetchError(f"cannot connect: {error}") from error
    async with stream:
        try:
            await stream.send_all(
                (connection.send(request) or b"") + (connection.send(h11.EndOfMessage()) or b"")
            )
            return await _response(stream, connection, max_bytes)
        except (OSError, trio.BrokenResourceError) as error:
            raise FetchError(f"connection failed: {error}") from error
        except h11.RemoteProtocolError as error:
            raise FetchError(f"malformed response: {error}") from error


async def _response(
    stream: trio.SocketStream, connection: h11.Connection, max_bytes: int
) -> tuple[int, bytes]:
    status: int | None = None
    body = bytearray()
    while True:
        event = connection.next_event()
        if event is h11.NEED_DATA:
            connection.receive_data(await stream.receive_some(_CHUNK))
        elif isinstance(event, h11.Response):
            status = event.status_code
        elif isinstance(event, h11.Data):
            body += event.data
            if len(body) > max_bytes:
                raise FetchError(f"response larger than {max_bytes} bytes")
        elif isinstance(event, h11.EndOfMessage):
            assert status is not None  # h11 gives the response before its end
            return status, bytes(body)
        elif isinstance(event, h11.ConnectionClosed):
            raise FetchError("connection closed before the response was complete")
        # else an informational (1xx) response: the real one follows
