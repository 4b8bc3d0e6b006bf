"""The metrics HTTP endpoint: HTTP/1.1 parsed by ``h11``, served on trio in the broker's thread.

Probes cannot be starved. A connection that has not sent its request (or
lingers after its response) holds no slot anybody needs: beyond
``max_clients`` of those, a new connection closes the one that has waited
longest. ``/healthz``, ``/readyz`` and ``/`` answer from memory at once and
are never refused; only ``/metrics`` and ``/stat.json`` count against
``max_clients`` answers being prepared (503 beyond), and they share one cached
walk of the broker that gives the loop a turn between pieces
(:class:`~broker.metrics.BrokerCollector`). The HTTP handling itself is
:class:`._serving.RouteServer`'s.
"""

from __future__ import annotations

import json
import logging
from http import HTTPStatus
from typing import TYPE_CHECKING, Final

import trio
from prometheus_client import CONTENT_TYPE_LATEST

from ._cluster_figures import not_ready
from ._collector import MAX_AGE, BrokerCollector
from ._serving import (
    MAX_CLIENTS,
    MAX_REQUEST_HEAD,
    READ_TIMEOUT,
    Response,
    error,
    serve_endpoint,
)
from ._stat import build_stat_document

if TYPE_CHECKING:
    from broker.server import Broker

__all__ = ["MAX_CLIENTS", "MAX_REQUEST_HEAD", "READ_TIMEOUT", "serve_metrics"]

log = logging.getLogger("broker.metrics")

_INDEX: Final = b"""trio-broker metrics endpoint

/metrics    Prometheus metrics (text exposition format)
/stat.json  the live broker as JSON (totals; the busiest connections and topics in detail)
/healthz    liveness: 200 while the broker's event loop serves requests
/readyz     readiness: 200 while the broker accepts clients, 503 while shutting down
            (and, in cluster mode, while its NATS connection is down)
"""


class _Routes:
    """The metrics endpoint's routes over one broker and its collector."""

    def __init__(self, broker: Broker, collector: BrokerCollector) -> None:
        self.broker = broker
        self.collector = collector

    async def metrics(self) -> Response:
        return Response(HTTPStatus.OK, await self.collector.text(), CONTENT_TYPE_LATEST)

    async def stat(self) -> Response:
        document = await build_stat_document(self.broker, self.collector)
        text = json.dumps(document, allow_nan=False, indent=1)
        return Response(HTTPStatus.OK, text.encode("utf-8") + b"\n", "application/json")

    @staticmethod
    async def index() -> Response:
        return Response(HTTPStatus.OK, _INDEX)

    @staticmethod
    async def alive() -> Response:
        return Response(HTTPStatus.OK, b"ok\n")

    async def ready(self) -> Response:
        if not self.broker.ready:
            return error(HTTPStatus.SERVICE_UNAVAILABLE, "not accepting clients")
        if (why := not_ready(self.broker)) is not None:
            return error(HTTPStatus.SERVICE_UNAVAILABLE, why)
        return Response(HTTPStatus.OK, b"ready\n")


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
    the broker accepts clients and, in cluster mode, is connected to its
    NATS servers; else 503), ``GET /`` (a short index); ``HEAD``
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
    try:
        await serve_endpoint(
            _Routes(broker, collector),
            host,
            port,
            read_timeout=read_timeout,
            max_clients=max_clients,
            log=log,
            name="metrics",
            task_status=task_status,
        )
    finally:
        collector.close()
