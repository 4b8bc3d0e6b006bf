"""A small HTTP/1.1 server (``h11`` on trio) of GET/HEAD routes answered from
memory or computed: what the broker's metrics endpoint and the supervisor's
merged endpoint (:mod:`broker.workers`) both serve with.

Probes cannot be starved. A connection that has not sent its request (or
lingers after its response) holds no slot anybody needs: beyond
``max_clients`` of those, a new connection closes the one that has waited
longest. Only the routes named ``expensive`` count against ``max_clients``
answers being prepared (503 beyond); the others are never refused.
"""

from __future__ import annotations

import itertools
import logging
import re
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Final, Protocol

import h11
import trio

#: How many first bytes of a request are checked for the start of a method.
METHOD_MOST = 16
#: What those bytes may be: a method's letters, then a space (or not yet).
_METHOD_START = re.compile(rb"[A-Z]{1,15}(?: .*)?|", re.DOTALL)

#: Largest request head (request line and headers) read, in bytes.
MAX_REQUEST_HEAD: Final = 8 * 1024
#: Seconds a client has to send its whole request head.
READ_TIMEOUT: Final = 10.0
#: Seconds a client has to take the response.
WRITE_TIMEOUT: Final = 10.0
#: Seconds to wait, after the response, for the client to close its side.
LINGER_SECONDS: Final = 1.0
#: Connections kept waiting for their request (more close the longest waiting),
#: and expensive answers being prepared at once (more: 503).
MAX_CLIENTS: Final = 64

TEXT: Final = "text/plain; charset=utf-8"


@dataclass(frozen=True, slots=True)
class Response:
    """One answer: status, body, its content type and extra headers."""

    status: HTTPStatus
    body: bytes = b""
    content_type: str = TEXT
    extra: tuple[tuple[str, str], ...] = ()


def error(
    status: HTTPStatus, detail: str = "", extra: tuple[tuple[str, str], ...] = ()
) -> Response:
    """A plain-text error response: ``<code> <phrase>[: detail]``."""
    text = f"{status.value} {status.phrase}" + (f": {detail}" if detail else "") + "\n"
    return Response(status, text.encode("utf-8", "replace"), extra=extra)


#: A route: computes its response (on the server's trio thread).
Route = Callable[[], Awaitable[Response]]


def _head_size(request: h11.Request) -> int:
    """The size of ``request``'s head as sent (near enough: CRLFs counted)."""
    line = len(request.method) + len(request.target) + 12
    return line + sum(len(name) + len(value) + 4 for name, value in request.headers)


class RouteServer:
    """Serves ``routes`` (path -> :data:`Route`), one request per connection.

    Promises: one request per connection, each response carries
    ``Connection: close`` and the server then closes; ``GET`` and ``HEAD``
    on a route, 404 on any other path, 405 (with ``Allow``) for another
    method; a request head larger than :data:`MAX_REQUEST_HEAD` gets 431, a
    malformed one 400, one not complete within ``read_timeout`` seconds 408.
    At most ``max_clients`` connections wait for their request at once (a
    new one closes the one waiting longest) and at most ``max_clients``
    answers of the ``expensive`` routes are prepared at once (503 beyond).
    A route that raises is logged and answered 500; no client can make
    :meth:`handle` raise, and no response contains a traceback.
    """

    def __init__(
        self,
        routes: Mapping[str, Route],
        *,
        expensive: Collection[str] = (),
        read_timeout: float = READ_TIMEOUT,
        max_clients: int = MAX_CLIENTS,
        log: logging.Logger,
        name: str = "metrics",
    ) -> None:
        self.routes = dict(routes)
        self.expensive = frozenset(expensive)
        self.read_timeout = read_timeout
        self.max_clients = max(1, max_clients)
        self.log = log
        self.name = name
        #: Answers of expensive routes in progress.
        self.busy = 0
        #: Connections waiting for their request or lingering, oldest first.
        self.waiting: dict[int, trio.CancelScope] = {}
        self._ids = itertools.count()

    async def respond(self, request: h11.Request) -> Response:
        """The response to a request h11 has parsed."""
        if _head_size(request) > MAX_REQUEST_HEAD:
            return error(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "request head too large")
        if not request.http_version.startswith(b"1."):
            return error(HTTPStatus.HTTP_VERSION_NOT_SUPPORTED, "only HTTP/1.x is served")
        if not request.target.startswith(b"/"):
            return error(HTTPStatus.BAD_REQUEST, "malformed request target")
        path = request.target.partition(b"?")[0].decode("ascii", "replace")
        route = self.routes.get(path)
        if route is None:
            return error(HTTPStatus.NOT_FOUND)
        if request.method not in (b"GET", b"HEAD"):
            return error(HTTPStatus.METHOD_NOT_ALLOWED, extra=(("Allow", "GET, HEAD"),))
        expensive = path in self.expensive
        if expensive and self.busy >= self.max_clients:
            return error(HTTPStatus.SERVICE_UNAVAILABLE, "too many requests at once")
        self.busy += expensive
        try:
            return await route()
        except Exception:  # a bug of ours: log it, never show it
            self.log.exception("%s: %s %s failed", self.name, request.method.decode(), path)
            return error(HTTPStatus.INTERNAL_SERVER_ERROR)
        finally:
            self.busy -= expensive

    # ------------------------------------------------------------ connections

    def _wait(self, scope: trio.CancelScope) -> int:
        """Count ``scope``'s connection as waiting; make room by cancelling the
        one waiting longest if ``max_clients`` already wait."""
        while len(self.waiting) >= self.max_clients:
            oldest = next(iter(self.waiting))
            self.waiting.pop(oldest).cancel()
        key = next(self._ids)
        self.waiting[key] = scope
        return key

    async def handle(self, stream: trio.SocketStream) -> None:
        """Serve one request on ``stream`` and close it; never raises an Exception."""
        try:
            await self._serve(stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as problem:
            self.log.debug("%s: client went away: %s", self.name, problem)
        except Exception:  # pragma: no cover - a bug of ours; keep serving
            self.log.exception("%s: request failed", self.name)
        finally:
            await trio.aclose_forcefully(stream)

    async def _serve(self, stream: trio.SocketStream) -> None:
        connection = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_REQUEST_HEAD)
        request: h11.Request | Response | None = None
        with trio.CancelScope() as waiting:
            key = self._wait(waiting)
            try:
                with trio.move_on_after(self.read_timeout):
                    request = await self._read(stream, connection)
            finally:
                self.waiting.pop(key, None)
        if waiting.cancelled_caught:
            self.log.debug("%s: closed a waiting connection to make room", self.name)
            return
        if request is None:
            request = error(HTTPStatus.REQUEST_TIMEOUT)
        if isinstance(request, h11.Request):
            response = await self.respond(request)
            head_only = request.method == b"HEAD"
        else:
            response, head_only = request, False
        try:
            data = self._encode(connection, response, head_only)
        except h11.LocalProtocolError:  # h11 cannot answer in this state: just close
            return
        with trio.move_on_after(WRITE_TIMEOUT):
            await stream.send_all(data)
            await stream.send_eof()
        await self._linger(stream)

    @staticmethod
    async def _read(
        stream: trio.SocketStream, connection: h11.Connection
    ) -> h11.Request | Response:
        """The request h11 parses from ``stream``, or the error response for what it refuses."""
        start = b""
        try:
            while True:
                event = connection.next_event()
                if event is h11.NEED_DATA:
                    data = await stream.receive_some(MAX_REQUEST_HEAD)
                    if len(start) < METHOD_MOST:
                        start += data[: METHOD_MOST - len(start)]
                        if not _METHOD_START.fullmatch(start):
                            # Not HTTP (a broker client sent here, say): say
                            # so at once instead of waiting for a line end.
                            return error(HTTPStatus.BAD_REQUEST, "not an HTTP request")
                    connection.receive_data(data)
                elif isinstance(event, h11.Request):
                    return event
                else:  # ConnectionClosed (or PAUSED): nothing to answer
                    return error(HTTPStatus.BAD_REQUEST, "incomplete request")
        except h11.RemoteProtocolError as refused:
            status = HTTPStatus(refused.error_status_hint)
            return error(status, str(refused))

    @staticmethod
    def _encode(connection: h11.Connection, response: Response, head_only: bool) -> bytes:
        headers = [
            ("Content-Type", response.content_type),
            ("Content-Length", str(len(response.body))),
            ("Cache-Control", "no-store"),
            ("Connection", "close"),
            *response.extra,
        ]
        status = response.status
        data = connection.send(
            h11.Response(status_code=status.value, reason=status.phrase, headers=headers)
        )
        assert data is not None
        if not head_only and response.body:
            data += connection.send(h11.Data(data=response.body)) or b""
        return data + (connection.send(h11.EndOfMessage()) or b"")

    async def _linger(self, stream: trio.SocketStream) -> None:
        """Discard what the client still sends for a moment, so closing does
        not reset the connection before the client has read the response;
        as a waiting connection (closed first to make room)."""
        with trio.CancelScope() as scope, trio.move_on_after(LINGER_SECONDS):
            key = self._wait(scope)
            try:
                discarded = 0
                while discarded < 16 * MAX_REQUEST_HEAD:
                    chunk = await stream.receive_some(MAX_REQUEST_HEAD)
                    if not chunk:
                        break
                    discarded += len(chunk)
            finally:
                self.waiting.pop(key, None)


async def open_listeners(host: str, port: int) -> tuple[list[trio.SocketListener], tuple[str, int]]:
    """Listeners on ``host:port`` (``""``: every interface) and the address to
    report: with ``port=0`` only the first address ``host`` resolves to is
    bound (each would get a port of its own)."""
    listeners = await trio.open_tcp_listeners(port, host=host or None)
    if port == 0:
        for extra in listeners[1:]:
            await extra.aclose()
        del listeners[1:]
    sockname = listeners[0].socket.getsockname()
    return listeners, (str(sockname[0]), int(sockname[1]))


class Endpoint(Protocol):
    """The routes of a metrics endpoint (the broker's, or a supervisor's)."""

    async def metrics(self) -> Response: ...
    async def stat(self) -> Response: ...
    async def alive(self) -> Response: ...
    async def ready(self) -> Response: ...
    async def index(self) -> Response: ...


async def serve_endpoint(
    endpoint: Endpoint,
    host: str,
    port: int,
    *,
    read_timeout: float,
    max_clients: int,
    log: logging.Logger,
    name: str,
    task_status: trio.TaskStatus[tuple[str, int]],
) -> None:
    """Serve ``endpoint`` on ``host:port`` until cancelled with a
    :class:`RouteServer`: ``/metrics`` and ``/stat.json`` (the expensive
    routes), ``/healthz``, ``/readyz`` and ``/``; ``task_status.started``
    the bound address (see :func:`open_listeners`) once it listens."""
    server = RouteServer(
        {
            "/metrics": endpoint.metrics,
            "/stat.json": endpoint.stat,
            "/healthz": endpoint.alive,
            "/readyz": endpoint.ready,
            "/": endpoint.index,
        },
        expensive=("/metrics", "/stat.json"),
        read_timeout=read_timeout,
        max_clients=max_clients,
        log=log,
        name=name,
    )
    listeners, address = await open_listeners(host, port)
    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, server.handle, listeners)
        log.info("%s on http://%s:%d/metrics", name, *address)
        task_status.started(address)
