"""Durable cursors and consumer groups kept in the cluster, over a real
``nats-server``: a cluster-mode broker's cursor continues where its
subscriber acknowledged when its topic is served by another broker on a
new data directory (a new disk), whether the first one stopped (and wrote
its positions first) or was cut off once the bucket held the position;
and a group goes on after what its members settled.

The server (the ``nats_url`` fixture's) syncs every write. Every
wait is for a state, with a hang guard: nothing waits for a time to pass.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from broker.config import BrokerConfig
from broker.nats import JetStream, open_nats
from broker.server import Broker, serve_broker
from broker.server.storage._cluster_cursors import BUCKET, bucket_key
from tests.server.helpers import make_config, running_broker, url, wait_until
from tests.server.test_cluster_groups import settle_six_of_ten, the_rest
from tests.server.test_topic_log import publish, read

#: Hang guard of every step (seconds).
DEADLINE = 120.0


async def _held(nats_url: str, topic: str) -> int | None:
    """The position the cursors' bucket holds for ``topic``'s cursor."""
    async with open_nats(nats_url, name="looker") as client:
        key = bucket_key(f"\x00{topic}\x00billing")
        entry = await JetStream(client).key_value(BUCKET).get(key)
    return None if entry is None else int(json.loads(entry.value)["next"])


def _config(nats_url: str, data_dir: Path) -> BrokerConfig:
    return make_config(
        data_dir=str(data_dir),
        cluster=nats_url,
        cluster_replicas=1,
        cluster_unsafe_sync=True,  # (the fixture's server answers no JSZ ping)
    )


@pytest.mark.parametrize("stop", ["graceful", "cut off"])
async def test_a_cursor_continues_where_acked_on_another_disk(
    nats_url: str, tmp_path: Path, stop: str
) -> None:
    topic = f"orders-{stop.replace(' ', '-')}"
    options = {"from": "earliest", "cursor": "billing"}

    stopped = trio.Event()

    async def serve(data_dir: Path, *, task_status: trio.TaskStatus[Broker]) -> None:
        try:
            await serve_broker(_config(nats_url, data_dir), task_status=task_status)
        finally:
            stopped.set()

    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            first: Broker = await nursery.start(serve, tmp_path / "a")
            await publish(url(first), topic, [b"r%d" % n for n in range(1, 11)])
            got = await read(url(first), topic, 6, options)  # (acked as it leaves)
            assert [m.seq for m in got] == list(range(1, 7))
            if stop == "graceful":
                await first.shutdown()  # (it writes what it stored first)
            else:
                assert first.logs is not None and first.logs.cluster_cursors is not None
                writes = first.logs.cluster_cursors.writes  # (late: within 0.2 s)
                await wait_until(lambda: writes.writes == 1 and not writes.pending)
                assert await _held(nats_url, topic) == 7
                assert first.life.nursery is not None
                first.life.nursery.cancel_scope.cancel()  # (no shutdown: cut off)
            await stopped.wait()
            second: Broker = await nursery.start(serve, tmp_path / "b")
            got = await read(url(second), topic, 4, options)
            await second.shutdown()
    assert [(m.seq, m.payload) for m in got] == [(n, b"r%d" % n) for n in range(7, 11)]
    assert await _held(nats_url, topic) == 11


async def test_a_group_goes_on_after_what_was_settled_on_another_disk(
    nats_url: str, tmp_path: Path
) -> None:
    with trio.fail_after(DEADLINE):
        async with running_broker(_config(nats_url, tmp_path / "a")) as broker:
            await settle_six_of_ten(broker)
        async with running_broker(_config(nats_url, tmp_path / "b")) as broker:
            assert await the_rest(broker) == [7, 8, 9, 10]  # (settled ones never again)
