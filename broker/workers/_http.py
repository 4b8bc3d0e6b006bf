"""The supervisor's one HTTP endpoint for the whole broker: each worker's
``/metrics`` and ``/stat.json`` read over loopback and merged, and probes
over all workers; HTTP/1.1 (``h11``) on trio.

A scrape never waits on a worker for long: every worker that runs is read at
once, each with a timeout, and one that does not answer in time (or answers
badly) is left out of the merge (``broker_worker_up`` 0, ``"up": false``).
Parsing and merging run in a worker thread, so the supervisor's event loop
keeps serving meanwhile.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from http import HTTPStatus
from typing import Any, Final

import trio
from prometheus_client import CONTENT_TYPE_LATEST

from broker.metrics._serving import (
    MAX_CLIENTS,
    READ_TIMEOUT,
    Response,
    error,
    serve_endpoint,
)

from ._client import MAX_RESPONSE_BYTES, FetchError, http_get
from ._info import WorkerInfo
from ._merge import DEFAULT_TOP, merge_expositions, merge_stat_documents

log = logging.getLogger("broker.workers")

#: Seconds each worker has to answer one request of a scrape or probe.
FETCH_TIMEOUT: Final = 2.0

_INDEX: Final = b"""trio-broker supervisor metrics endpoint (every worker, merged)

/metrics    Prometheus metrics of every worker (label worker), and broker_worker_up
/stat.json  every worker's /stat.json as one document (sums; per-worker lists; workers)
/healthz    liveness: 200 while the supervisor serves requests
/readyz     readiness: 200 while every worker runs and its own /readyz is 200
"""


class _Routes:
    def __init__(
        self,
        workers: Callable[[], Sequence[WorkerInfo]],
        fetch_timeout: float,
        max_bytes: int,
        top: int,
    ) -> None:
        self.workers = workers
        self.fetch_timeout = fetch_timeout
        self.max_bytes = max_bytes
        self.top = top

    async def _fetch(
        self, workers: Sequence[WorkerInfo], path: str
    ) -> dict[str, tuple[int, bytes] | None]:
        """``GET path`` of each worker that runs, all at once: worker id ->
        status and body, or None if it did not answer in time or at all."""
        answers: dict[str, tuple[int, bytes] | None] = {w.id: None for w in workers}

        async def one(worker: WorkerInfo) -> None:
            with trio.move_on_after(self.fetch_timeout) as scope:
                try:
                    answers[worker.id] = await http_get(
                        worker.metrics, path, max_bytes=self.max_bytes
                    )
                except FetchError as problem:
                    log.debug("worker %s: %s %s", worker.id, path, problem)
            if scope.cancelled_caught:
                log.debug("worker %s: %s not answered in %g s", worker.id, path, self.fetch_timeout)

        async with trio.open_nursery() as nursery:
            for worker in workers:
                if worker.up:
                    nursery.start_soon(one, worker)
        return answers

    async def _bodies(self, workers: Sequence[WorkerInfo], path: str) -> dict[str, bytes]:
        """The bodies of the workers that answered ``path`` with 200."""
        answers = await self._fetch(workers, path)
        return {w: a[1] for w, a in answers.items() if a is not None and a[0] == HTTPStatus.OK}

    async def metrics(self) -> Response:
        workers = list(self.workers())
        bodies = await self._bodies(workers, "/metrics")
        text = await trio.to_thread.run_sync(_merged_metrics, bodies, workers)
        return Response(HTTPStatus.OK, text, CONTENT_TYPE_LATEST)

    async def stat(self) -> Response:
        workers = list(self.workers())
        bodies = await self._bodies(workers, "/stat.json")
        merge = partial(_merged_stat, bodies, workers, self.top)
        return Response(HTTPStatus.OK, await trio.to_thread.run_sync(merge), "application/json")

    async def ready(self) -> Response:
        workers = list(self.workers())
        if not workers:
            return error(HTTPStatus.SERVICE_UNAVAILABLE, "no workers")
        answers = await self._fetch(workers, "/readyz")
        waiting = [
            w.id for w in workers if (answer := answers[w.id]) is None or answer[0] != HTTPStatus.OK
        ]
        if waiting:
            return error(HTTPStatus.SERVICE_UNAVAILABLE, "not ready: " + " ".join(waiting))
        return Response(HTTPStatus.OK, b"ready\n")

    @staticmethod
    async def alive() -> Response:
        return Response(HTTPStatus.OK, b"ok\n")

    @staticmethod
    async def index() -> Response:
        return Response(HTTPStatus.OK, _INDEX)


def _merged_metrics(bodies: Mapping[str, bytes], workers: Sequence[WorkerInfo]) -> bytes:
    texts = {}
    for worker, body in bodies.items():
        try:
            texts[worker] = body.decode("utf-8")
        except UnicodeDecodeError:
            continue  # not an exposition: as if it had not answered
    return merge_expositions(texts, workers).encode("utf-8")


def _merged_stat(bodies: Mapping[str, bytes], workers: Sequence[WorkerInfo], top: int) -> bytes:
    docs: dict[str, dict[str, Any] | None] = {}
    for worker, body in bodies.items():
        try:
            document = json.loads(body)
        except ValueError:  # not JSON (UnicodeDecodeError is one too)
            continue
        if isinstance(document, dict):
            docs[worker] = document
    merged = merge_stat_documents(docs, workers, top=top)
    return json.dumps(merged, allow_nan=False, indent=1).encode("utf-8") + b"\n"


async def serve_merged_metrics(
    workers: Callable[[], Sequence[WorkerInfo]],
    host: str,
    port: int,
    *,
    fetch_timeout: float = FETCH_TIMEOUT,
    max_response_bytes: int = MAX_RESPONSE_BYTES,
    top: int = DEFAULT_TOP,
    read_timeout: float = READ_TIMEOUT,
    max_clients: int = MAX_CLIENTS,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the whole broker's metrics over HTTP/1.1 on ``host:port`` until
    cancelled, from the workers' own endpoints (``workers()``: the
    supervisor's current view, asked at each request).

    ``task_status.started((host, port))`` reports the bound address once it
    listens (``port=0`` picks a free port; ``host=""``: every interface).

    Routes (``GET`` and ``HEAD``; the HTTP behaviour, limits and refusals
    are those of the broker's own endpoint, :func:`broker.metrics.serve_metrics`):

    - ``/metrics``: every running worker's ``/metrics`` read at once, each
      within ``fetch_timeout`` seconds and ``max_response_bytes``; the ones
      that answered 200 merged (:func:`~._merge.merge_expositions`: label
      ``worker``, and ``broker_workers``, ``broker_worker_up``,
      ``broker_worker_restarts_total``). A worker that does not answer in
      time, fails or answers badly is left out with ``broker_worker_up`` 0;
      the scrape answers within about ``fetch_timeout`` seconds whatever the
      workers do.
    - ``/stat.json``: the same with ``/stat.json``
      (:func:`~._merge.merge_stat_documents`, ``top`` its ``metrics_top``).
    - ``/healthz``: 200 while the supervisor serves requests.
    - ``/readyz``: 200 only if every worker runs and answers its own
      ``/readyz`` with 200 within ``fetch_timeout``; else 503 naming the others.
    - ``/``: a short index.
    """
    await serve_endpoint(
        _Routes(workers, fetch_timeout, max_response_bytes, top),
        host,
        port,
        read_timeout=read_timeout,
        max_clients=max_clients,
        log=log,
        name="merged metrics of the workers",
        task_status=task_status,
    )
