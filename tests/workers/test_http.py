"""serve_merged_metrics over two real in-process brokers (serve_broker and
serve_metrics on 127.0.0.1 port 0), read over real TCP with the workers'
own h11 client."""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from functools import partial
from typing import Any

import trio
from prometheus_client.parser import text_string_to_metric_families

from broker.client import open_client
from broker.server import Broker
from broker.workers import WorkerInfo, serve_merged_metrics
from broker.workers._client import FetchError, http_get
from tests.metrics.test_metrics import running, url

#: A generous bound on anything here; the merged endpoint's own timeout is far below.
DEADLINE = 60.0
#: The merged endpoint's timeout per worker in these tests.
FETCH_TIMEOUT = 1.0

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def info(worker: str, broker: Broker | None, metrics: tuple[str, int]) -> WorkerInfo:
    direct = url(broker) if broker is not None else "127.0.0.1:1"
    return WorkerInfo(worker, 4000 + len(worker), True, 1, direct, metrics)


@asynccontextmanager
async def merged(
    workers: Callable[[], Sequence[WorkerInfo]],
) -> AsyncIterator[tuple[str, int]]:
    async with trio.open_nursery() as nursery:
        address: tuple[str, int] = await nursery.start(
            partial(serve_merged_metrics, fetch_timeout=FETCH_TIMEOUT), workers, "127.0.0.1", 0
        )
        yield address
        nursery.cancel_scope.cancel()


async def get(address: tuple[str, int], path: str) -> tuple[int, bytes]:
    with trio.fail_after(DEADLINE):
        return await http_get(address, path)


def samples(text: str) -> Samples:
    found: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[sample.name, frozenset(sample.labels.items())] = sample.value
    return found


def connections_of(found: Samples, worker: str) -> set[str]:
    """The ``client`` labels of ``worker``'s connections."""
    return {
        dict(labels)["client"]
        for name, labels in found
        if name == "broker_connection_info" and ("worker", worker) in labels
    }


def closed_port() -> tuple[str, int]:
    """An address nothing listens on (bound, then closed: connection refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return "127.0.0.1", port


async def test_two_brokers_merged_over_tcp() -> None:
    async with AsyncExitStack() as stack:
        b0, m0 = await stack.enter_async_context(running())
        b1, m1 = await stack.enter_async_context(running())
        workers = [info("w0", b0, m0), info("w1", b1, m1)]
        c0 = await stack.enter_async_context(open_client(url(b0), name="alice"))
        c1 = await stack.enter_async_context(open_client(url(b1), name="bob"))
        await c0.publish("news", b"to w0")
        await c1.publish("weather", b"to w1")
        await c0.flush()
        await c1.flush()
        address = await stack.enter_async_context(merged(lambda: workers))

        status, body = await get(address, "/metrics")
        assert status == 200
        found = samples(body.decode())
        for worker in ("w0", "w1"):
            labels = frozenset({("worker", worker)})
            assert found["broker_received_messages_total", labels] == 1
            assert found["broker_connections_open", labels] == 1
            assert found["broker_worker_up", labels] == 1
            assert found["broker_worker_restarts_total", labels] == 1
        assert found["broker_workers", frozenset()] == 2
        assert connections_of(found, "w0") == {"alice"}
        assert connections_of(found, "w1") == {"bob"}
        unlabelled = [key for key in found if not key[0].startswith("broker_worker")]
        assert all(dict(labels).get("worker") in ("w0", "w1") for _, labels in unlabelled)

        status, body = await get(address, "/stat.json")
        assert status == 200
        document: dict[str, Any] = json.loads(body)
        assert document["connections_total"] == 2
        assert document["totals"]["broker_received_messages_total"] == 2
        assert document["broker"]["statistics"]["connections"] == 2
        assert {(c["worker"], c["client"]) for c in document["connections"]} == {
            ("w0", "alice"),
            ("w1", "bob"),
        }
        assert {(t["worker"], t["name"]) for t in document["topics"]} == {
            ("w0", "news"),
            ("w1", "weather"),
        }
        assert [(w["id"], w["up"], w["direct"]) for w in document["workers"]] == [
            ("w0", True, url(b0)),
            ("w1", True, url(b1)),
        ]

        assert await get(address, "/readyz") == (200, b"ready\n")
        assert await get(address, "/healthz") == (200, b"ok\n")
        status, body = await get(address, "/")
        assert status == 200 and b"/stat.json" in body


async def test_a_dead_or_silent_worker_is_down_and_the_scrape_still_answers() -> None:
    async with AsyncExitStack() as stack:
        b0, m0 = await stack.enter_async_context(running())
        # w1 refuses connections; w2 accepts and never answers; w3 is not running.
        silent = trio.socket.socket()
        stack.enter_context(silent)
        await silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        workers = [
            info("w0", b0, m0),
            info("w1", None, closed_port()),
            info("w2", None, silent.getsockname()),
            WorkerInfo("w3", None, False, 4, "127.0.0.1:1", closed_port()),
        ]
        address = await stack.enter_async_context(merged(lambda: workers))

        status, body = await get(address, "/metrics")
        assert status == 200
        found = samples(body.decode())
        up = {
            w: found["broker_worker_up", frozenset({("worker", w)})]
            for w in ("w0", "w1", "w2", "w3")
        }
        assert up == {"w0": 1, "w1": 0, "w2": 0, "w3": 0}
        assert found["broker_workers", frozenset()] == 4
        assert found["broker_connections_open", frozenset({("worker", "w0")})] == 0
        assert {dict(labels).get("worker") for _, labels in found} == {None, "w0", "w1", "w2", "w3"}
        assert not any(
            ("worker", "w2") in labels
            for name, labels in found
            if name != "broker_worker_up" and name != "broker_worker_restarts_total"
        )

        status, body = await get(address, "/stat.json")
        assert status == 200
        document = json.loads(body)
        assert [(w["id"], w["up"]) for w in document["workers"]] == [
            ("w0", True),
            ("w1", False),
            ("w2", False),
            ("w3", False),
        ]
        assert document["broker"]["address"] == url(b0)

        status, body = await get(address, "/readyz")
        assert status == 503
        assert body == b"503 Service Unavailable: not ready: w1 w2 w3\n"
        assert await get(address, "/healthz") == (200, b"ok\n")


async def test_readyz_is_503_while_a_worker_shuts_down() -> None:
    async with AsyncExitStack() as stack:
        b0, m0 = await stack.enter_async_context(running())
        b1, m1 = await stack.enter_async_context(running())
        workers = [info("w0", b0, m0), info("w1", b1, m1)]
        address = await stack.enter_async_context(merged(lambda: workers))
        assert (await get(address, "/readyz"))[0] == 200
        with trio.fail_after(DEADLINE):
            await b1.shutdown()
        assert await get(address, "/readyz") == (503, b"503 Service Unavailable: not ready: w1\n")


async def test_the_client_refuses_a_response_too_large() -> None:
    async with running() as (_broker, metrics):
        with trio.fail_after(DEADLINE):
            status, body = await http_get(metrics, "/metrics")
            assert status == 200
            try:
                await http_get(metrics, "/metrics", max_bytes=len(body) // 2)
            except FetchError as error:
                assert "larger than" in str(error)
            else:
                raise AssertionError("a response past max_bytes was read")
