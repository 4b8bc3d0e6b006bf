"""A session resumed on another broker of one cluster (in-memory streams
and bucket): the scenario the cluster-records tests share."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from broker.client import open_client
from broker.server import Broker, serve_broker

from .helpers import make_config, url
from .run_streams import MemoryBucket, MemoryStreams

#: A hang guard only.
DEADLINE = 60


@dataclass(frozen=True)
class Moved:
    """What a session's move to another broker came to."""

    #: Sessions the client was told were lost (0: resumed).
    lost: int
    #: Sessions the second broker resumed.
    resumed: int


async def resume_on_another_broker(
    tmp_path: Path,
    streams: MemoryStreams,
    bucket: MemoryBucket,
    before: list[bytes],
    after: list[bytes],
    *,
    same_disk: bool = False,
    ssl_context: ssl.SSLContext | None = None,
    **settings: Any,
) -> Moved:
    """A client publishes ``before`` to topic ``orders`` (each confirmed),
    the broker shuts down, another starts (on a new data directory unless
    ``same_disk``) over the same streams and bucket, and the client, which
    reconnects to it, publishes ``after``."""
    address = ["127.0.0.1", 0]

    async def open_stream() -> trio.abc.Stream:
        return await trio.open_tcp_stream(str(address[0]), int(address[1]))

    stopped = trio.Event()

    async def serve(data_dir: Path, *, task_status: trio.TaskStatus[Broker]) -> None:
        config = make_config(data_dir=str(data_dir), lease=30.0, **settings)
        try:
            await serve_broker(config, streams=streams, records=bucket, task_status=task_status)
        finally:
            stopped.set()

    lost: list[int] = []
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            broker: Broker = await nursery.start(serve, tmp_path / "a")
            address[:] = broker.address
            async with open_client(
                url(broker),
                name="resumer",
                reconnect=30.0,
                open_stream=open_stream,
                ssl_context=ssl_context,
                on_session_lost=lambda: lost.append(1),
            ) as client:
                for body in before:
                    await client.publish("orders", body)
                await client.flush()
                assert len(broker.sessions.sessions) == 1
                await broker.shutdown()  # (its sessions' records stay)
                await stopped.wait()
                other: Broker = await nursery.start(serve, tmp_path / ("a" if same_disk else "b"))
                address[:] = other.address
                for body in after:
                    await client.publish("orders", body)
                await client.flush()
            await other.shutdown()
    return Moved(len(lost), other.sessions.resumed_total)
