"""A front end's readiness follows its NATS connection (issue 44, item 7):
over one real ``nats-server``, ``/readyz`` is 200 while connected, 503
(``broker_cluster_connected`` 0) once the server is killed, and 200 again
after it is restarted, when publishing goes on.

The server is started on free loopback ports and stopped by PID. Every
wait is for a state, with a hang guard: nothing waits for a time to pass.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from broker.client import open_client
from broker.metrics import serve_metrics
from broker.nats._servers import NatsServers, open_nats_servers
from tests.metrics.test_metrics import Scrape, get, scrape, wait_until
from tests.server.helpers import make_config, running_broker, url

from .raw import require_nats_server

#: Hang guard of every step (seconds).
DEADLINE = 120.0

Address = tuple[str, int]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[NatsServers]:
    """One server, every write synced, the JSZ ping the start-up check asks
    for imported into the application account."""
    require_nats_server()
    with open_nats_servers(
        tmp_path / "nats", 1, system_account=True, app_jsz_import=True
    ) as servers:
        yield servers


async def ready_is(metrics: Address, status: int) -> Scrape:
    """Ask ``/readyz`` until it answers ``status``, and scrape until
    ``broker_ready`` agrees (a scrape may be up to a second old); that scrape."""
    while True:
        if (await get(metrics, "/readyz")).status == status:
            result = await scrape(metrics)
            if result("broker_ready") == (status == 200):
                return result
        await trio.sleep(0.05)


async def publish(address: str, payload: bytes) -> None:
    async with open_client(address, name="pub") as client:
        await client.publish("t", payload)
        await client.flush()  # (confirmed: the stream has it)


async def test_readyz_follows_the_nats_connection(server: NatsServers, tmp_path: Path) -> None:
    config = make_config(
        data_dir=str(tmp_path / "data"), cluster=server.urls[0], cluster_replicas=1
    )
    with trio.fail_after(DEADLINE):
        async with running_broker(config) as broker, trio.open_nursery() as nursery:
            metrics: Address = await nursery.start(serve_metrics, broker, "127.0.0.1", 0)
            await publish(url(broker), b"before")
            up = await ready_is(metrics, 200)
            assert up("broker_cluster_connected") == 1
            assert up("broker_ready") == 1
            assert up("broker_cluster_records_stored_total") == 1

            await trio.to_thread.run_sync(server[0].kill)
            down = await ready_is(metrics, 503)
            assert down("broker_cluster_connected") == 0
            assert down("broker_ready") == 0
            body = (await get(metrics, "/readyz")).body
            assert b"not connected to the NATS servers" in body
            assert (await get(metrics, "/healthz")).status == 200

            await trio.to_thread.run_sync(server[0].restart)
            again = await ready_is(metrics, 200)
            assert again("broker_cluster_connected") == 1
            await publish(url(broker), b"after")
            # (A scrape may be up to a second old: the next shows it.)
            await wait_until(metrics, lambda s: s("broker_cluster_records_stored_total") == 2)
            nursery.cancel_scope.cancel()
