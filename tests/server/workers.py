"""A multi-worker broker in one trio test: the sockets made by hand as a
supervisor makes them (a listening TCP socket on 127.0.0.1:0 per worker for
its clients, a listening Unix socket per worker for the others' links)."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from broker.protocol import Cluster, Member, owner_id
from broker.server import Broker, serve_broker
from broker.server.cluster._placement import WorkerSetup

from .helpers import TIMEOUT, make_config, url

__all__ = ["owned_by", "running_workers", "url"]


def owned_by(worker: str, ids: list[str], prefix: str, count: int = 1) -> list[str]:
    """``count`` topic names starting with ``prefix`` that ``worker`` owns."""
    names: list[str] = []
    for n in range(10_000):
        name = f"{prefix}{n}"
        if owner_id(name, ids) == worker:
            names.append(name)
            if len(names) == count:
                return names
    raise AssertionError("no such topic names")


@asynccontextmanager
async def running_workers(
    tmp_path: Path, count: int = 2, *, data: bool = False, **overrides: Any
) -> AsyncIterator[list[Broker]]:
    """``count`` workers (ids ``w0``, ``w1``, ...) of one broker, memory-only
    or (``data``) sharing a data directory in ``tmp_path``; shut down
    together, gracefully, at the end of the block."""
    ids = [f"w{n}" for n in range(count)]
    tcp: list[socket.socket] = []
    paths: dict[str, str] = {}
    links: list[socket.socket] = []
    for worker in ids:
        client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        client.bind(("127.0.0.1", 0))
        client.listen(128)
        tcp.append(client)
        path = str(tmp_path / f"{worker}.link")
        link = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        link.bind(path)
        link.listen(128)
        links.append(link)
        paths[worker] = path
    members = tuple(
        Member(worker, "127.0.0.1", sock.getsockname()[1])
        for worker, sock in zip(ids, tcp, strict=True)
    )
    if data:
        overrides.setdefault("data_dir", str(tmp_path / "data"))
    config = make_config(**overrides)
    brokers: list[Broker] = []
    async with trio.open_nursery() as nursery:
        for worker, client, link in zip(ids, tcp, links, strict=True):
            setup = WorkerSetup(Cluster(1, worker, members), [client], link, paths)

            async def serve(setup: WorkerSetup, *, task_status: trio.TaskStatus[Broker]) -> None:
                await serve_broker(config, worker=setup, task_status=task_status)

            brokers.append(await nursery.start(serve, setup))
        yield brokers
        with trio.fail_after(config.shutdown_deadline + TIMEOUT):
            async with trio.open_nursery() as stopping:
                for broker in brokers:
                    stopping.start_soon(broker.shutdown)
