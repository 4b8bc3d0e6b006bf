"""The metrics HTTP endpoint: HTTP/1.1 parsed by ``h11``, served on trio in the broker's thread.

Probes cannot be starved. A connection that has not sent its request (or
lingers after its response) holds no slot anybody needs: beyond
``max_clients`` of those, a new connection closes the one that has waited
longest. ``/healthz``, ``/readyz`` and ``/`` answer from memory at once and
are never refused; only ``/metrics`` and ``/stat.json`` count against
``max_clients`` answers being prepared (503 beyond), and they share one cached
walk of the broker that gives the loop a turn between pieces
(:class:`~broker.metrics.BrokerCollector`).
"""

from __future__ import annotations

import itertools
import json
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING, Final

import h11
import trio
from prometheus_client import CONTENT_TYPE_LATEST

from ._collector import MAX_AGE, BrokerCollector
from ._stat import build_stat_document

if TYPE_CHECKING:
    from broker.server import Broker

#: How many first bytes of a request are checked for the start of a method.
METHOD_MOST = 16
#: What those bytes may be: a method's letters, then a space (or not yet).
_METHOD_START = re.compile(rb"[A-Z]{1,15}(?: .*)?|", re.DOTALL)

log = logging.getLogger("broker.metrics")

#: Largest request head (request line and headers) read, in bytes.
MAX_REQUEST_HEAD: Final = 8 * 1024
#: Seconds a client has to send its whole request head.
READ_TIMEOUT: Final = 10.0
#: Seconds a client has to take the response.
WRITE_TIMEOUT: Final = 10.0
#: Seconds to wait, after the response, for the client to close its side.
LINGER_SECONDS: Final = 1.0
#: Connections kept waiting for their request (more close the longest waiting),
#: and ``/metrics`` and ``/stat.json`` answers being prepared at once (more: 503).
MAX_CLIENTS: Final = 64

_TEXT: Final = "text/plain; charset=utf-8"
_INDEX: Final = b"""trio-broker metrics endpoint

/metrics    Prometheus metrics (text exposition format)
/stat.json  the live broker as JSON (totals; the busiest connections and topics in detail)
/healthz    liveness: 200 while the broker's event loop serves requests
/readyz     readiness: 200 while the broker accepts clients, 503 while shutting down
"""


@dataclass(frozen=True, slots=True)
class _Response:
    status: HTTPStatus
    body: bytes = b""
    content_type: str = _TEXT
    extra: tuple[tuple[str, str], ...] = ()


def _error(
    status: HTTPStatus, detail: str = "", extra: tuple[tuple[str, str], ...] = ()
) -> _Response:
    text = f"{status.value} {status.phrase}" + (f": {detail}" if detail else "") + "\n"
    return _Response(status, text.encode("utf-8", "replace"), extra=extra)


def _head_size(request: h11.Request) -> int:
    """The size of ``request``'s head as sent (near enough: CRLFs counted)."""
    line = len(request.method) + len(request.target) + 12
    return line + sum(len(name) + len(value) + 4 for name, value in request.headers)


class _MetricsServer:
    def __init__(
        self, broker: Broker, collector: BrokerCollector, read_timeout: float, max_clients: int
    ) -> None:
        self.broker = broker
        self.collector = collector
        self.read_timeout = read_timeout
        self.max_clients = max(1, max_clients)
        #: Answers of ``/metrics`` and ``/stat.json`` in progress.
        self.busy = 0
        #: Connections waiting for their request or lingering, oldest first.
        self.waiting: dict[int, trio.CancelScope] = {}
        self._ids = itertools.count()
        self.routes: dict[str, Callable[[], Awaitable[_Response]]] = {
            "/metrics": self._metrics,
            "/stat.json": self._stat,
            "/healthz": self._alive,
            "/readyz": self._ready,
            "/": self._index,
        }

    # ------------------------------------------------------------ routes

    async def _metrics(self) -> _Response:
        return _Response(HTTPStatus.OK, await self.collector.text(), CONTENT_TYPE_LATEST)

    async def _stat(self) -> _Response:
        document = await build_stat_document(self.broker, self.collector)
        text = json.dumps(document, allow_nan=False, indent=1)
        return _Response(HTTPStatus.OK, text.encode("utf-8") + b"\n", "application/json")

    @staticmethod
    async def _index() -> _Response:
        return _Response(HTTPStatus.OK, _INDEX)

    @staticmethod
    async def _alive() -> _Response:
        return _Response(HTTPStatus.OK, b"ok\n")

    async def _ready(self) -> _Response:
        if not self.broker.ready:
            return _error(HTTPStatus.SERVICE_UNAVAILABLE, "not accepting clients")
        return _Response(HTTPStatus.OK, b"ready\n")

    async def respond(self, request: h11.Request) -> _Response:
        """The response to a request h11 has parsed."""
        if _head_size(request) > MAX_REQUEST_HEAD:
            return _error(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "request head too large")
        if not request.http_version.startswith(b"1."):
            return _error(HTTPStatus.HTTP_VERSION_NOT_SUPPORTED, "only HTTP/1.x is served")
        if not request.target.startswith(b"/"):
            return _error(HTTPStatus.BAD_REQUEST, "malformed request target")
        path = request.target.partition(b"?")[0].decode("ascii", "replace")
        route = self.routes.get(path)
        if route is None:
            return _error(HTTPStatus.NOT_FOUND)
        if request.method not in (b"GET", b"HEAD"):
            return _error(HTTPStatus.METHOD_NOT_ALLOWED, extra=(("Allow", "GET, HEAD"),))
        expensive = path in ("/metrics", "/stat.json")
        if expensive and self.busy >= self.max_clients:
            return _error(HTTPStatus.SERVICE_UNAVAILABLE, "too many requests at once")
        self.busy += expensive
        try:
            return await route()
        except Exception:  # a bug of ours: log it, never show it
            log.exception("metrics: %s %s failed", request.method.decode(), path)
            return _error(HTTPStatus.INTERNAL_SERVER_ERROR)
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
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as error:
            log.debug("metrics: client went away: %s", error)
        except Exception:  # pragma: no cover - a bug of ours; keep serving
            log.exception("metrics: request failed")
        finally:
            await trio.aclose_forcefully(stream)

    async def _serve(self, stream: trio.SocketStream) -> None:
        connection = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_REQUEST_HEAD)
        request: h11.Request | _Response | None = None
        with trio.CancelScope() as waiting:
            key = self._wait(waiting)
            try:
                with trio.move_on_after(self.read_timeout):
                    request = await self._read(stream, connection)
            finally:
                self.waiting.pop(key, None)
        if waiting.cancelled_caught:
            log.debug("metrics: closed a waiting connection to make room")
            return
        if request is None:
            request = _error(HTTPStatus.REQUEST_TIMEOUT)
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
    ) -> h11.Request | _Response:
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
                            return _error(HTTPStatus.BAD_REQUEST, "not an HTTP request")
                    connection.receive_data(data)
                elif isinstance(event, h11.Request):
                    return event
                else:  # ConnectionClosed (or PAUSED): nothing to answer
                    return _error(HTTPStatus.BAD_REQUEST, "incomplete request")
        except h11.RemoteProtocolError as error:
            status = HTTPStatus(error.error_status_hint)
            return _error(status, str(error))

    @staticmethod
    def _encode(connection: h11.Connection, response: _Response, head_only: bool) -> bytes:
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


async def serve_metrics(
    broker: Broker,
    host: str,
    port: int,
    *,
    read_timeout: float = READ_TIMEOUT,
    max_clients: int = MAX_CLIENTS,
    max_age: float = MAX_AGE,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``broker``'s metrics over HTTP/1.1 on ``host:port`` until cancelled.

    ``task_status.started((host, port))`` reports the bound address once it
    listens (so ``port=0`` picks a free port; with ``port=0`` only the first
    address ``host`` resolves to is bound). ``host=""`` listens on every
    interface.

    Routes: ``GET /metrics`` (Prometheus text format, ``CONTENT_TYPE_LATEST``),
    ``GET /stat.json`` (:func:`~broker.metrics.stat_document`), ``GET /healthz``
    (200 whenever it answers: the event loop runs), ``GET /readyz`` (200 while
    the broker accepts clients, else 503), ``GET /`` (a short index); ``HEAD``
    on each. Any other path is 404; another method on a known path is 405
    (with ``Allow``).

    Promises: one request per connection, each response carries
    ``Connection: close`` and the server then closes; a request head larger
    than :data:`MAX_REQUEST_HEAD` gets 431, a malformed one 400 (HTTP/1.1
    needs ``Host``), one not complete within ``read_timeout`` seconds 408.
    At most ``max_clients`` connections wait for their request at once: a
    new one closes the one waiting longest, so idle clients cannot starve
    probes. ``/healthz``, ``/readyz`` and ``/`` are never refused; beyond
    ``max_clients`` ``/metrics`` and ``/stat.json`` answers being prepared
    the answer is 503. ``/metrics`` and ``/stat.json`` reuse one walk of the
    broker for ``max_age`` seconds, and a walk gives the loop a turn between
    pieces, so a scrape never holds the loop for long. No client can make it
    raise, and no response contains a traceback. It runs in the calling trio
    thread (no worker thread).
    """
    collector = BrokerCollector(broker, max_age=max_age)
    server = _MetricsServer(broker, collector, read_timeout, max_clients)
    try:
        listeners = await trio.open_tcp_listeners(port, host=host or None)
        if port == 0:
            # Each listener got a port of its own: keep the first, report it.
            for extra in listeners[1:]:
                await extra.aclose()
            del listeners[1:]
        sockname = listeners[0].socket.getsockname()
        address = (str(sockname[0]), int(sockname[1]))
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, server.handle, listeners)
            log.info("metrics on http://%s:%d/metrics", *address)
            task_status.started(address)
    finally:
        collector.close()
