"""A principal's ``max_connections`` holds for the whole multi-worker broker:
its workers count its connections together (``_shared_counts``)."""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from broker.client import ConnectionLost, open_client
from broker.protocol import GoodbyeCode
from broker.server.cluster._connection_counts import SharedCounts, clear_row, create_counts

from .test_supervisor import DEADLINE, running_workers, worker_config

AUTH = """
[principals.writer]
token = "writer-token"
max_connections = 2
"""


@asynccontextmanager
async def admitted(address: str) -> AsyncIterator[None]:
    """A connection of the writer's at ``address``, tried again while it is
    refused for the limit (connections closed just before are counted until
    the workers see them close)."""
    deadline = trio.current_time() + DEADLINE
    while True:
        entered = False
        try:
            async with open_client(address, token="writer-token"):
                entered = True
                yield
                return
        except ConnectionLost as error:
            if entered:
                raise
            assert error.code == GoodbyeCode.LIMIT_EXCEEDED, error
            assert trio.current_time() < deadline, "never admitted"
        await trio.sleep(0.05)


def test_each_worker_writes_its_row_and_every_worker_sums_the_column(tmp_path: Path) -> None:
    path = tmp_path / "counts"
    names = ["writer", "reader"]
    create_counts(path, 3, names)
    with SharedCounts(path, 0, names) as w0, SharedCounts(path, 2, names) as w2:
        w0.add("writer", 1)
        w2.add("writer", 2)
        w2.add("reader", 1)
        assert (w0.total("writer"), w2.total("writer"), w0.total("reader")) == (3, 3, 1)
        clear_row(path, 2, names)  # worker 2 ended: its connections are gone
        assert (w0.total("writer"), w0.total("reader")) == (1, 0)


async def test_a_principals_limit_counts_its_connections_on_every_worker(tmp_path: Path) -> None:
    auth = tmp_path / "auth.toml"
    auth.write_text(AUTH)
    config = worker_config(tmp_path, auth_file=str(auth))
    async with running_workers(config, 2) as supervisor:
        w0, w1 = (f"127.0.0.1:{w.direct.getsockname()[1]}" for w in supervisor.workers)
        async with (
            open_client(w0, token="writer-token"),
            open_client(w1, token="writer-token"),
        ):
            for address in (w0, w1):  # a third, on either worker, is one too many
                with trio.fail_after(DEADLINE), pytest.raises(ConnectionLost) as caught:
                    async with open_client(address, token="writer-token"):
                        pass  # pragma: no cover - refused at Hello
                assert caught.value.code == GoodbyeCode.LIMIT_EXCEEDED
                assert "'writer' already has 2 connection(s)" in caught.value.reason
        # Both closed: room again (once the workers saw them close). A worker
        # killed with its connection open gives its share back when it restarts.
        async with admitted(w0):
            victim = supervisor.workers[1]
            async with admitted(w1):
                assert victim.pid is not None
                os.kill(victim.pid, signal.SIGKILL)
                with trio.fail_after(DEADLINE):
                    await victim.wait_up(restarts=1)
            async with admitted(w1):  # never, if the dead worker's count stayed
                pass
