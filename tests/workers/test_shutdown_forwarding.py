"""A graceful shutdown of a memory-only broker of two workers while clients
publish to and read every topic, the subscribers at the worker that does
not own the topic (forwarded): what a publisher saw confirmed reaches its
subscriber, and no worker waits for what would never come.

Before, at every such shutdown, the subscribers of one worker's topics
missed the last batch of 20 confirmed messages (the forwarder said Goodbye
to them before the owner's last relayed deliveries arrived); publishers at
the forwarder made it wait, most times, for Confirms its owner (shutting
down too) would never send, until half the deadline was gone; and a
forwarder sometimes crashed, publishing on a link its owner had closed."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from broker.client import ConnectionLost, open_client
from broker.protocol import GoodbyeCode, owner_id

from .test_supervisor import DEADLINE, running_workers, topics_of, worker_config

IDS = ["w0", "w1"]
#: Each topic's confirmed messages before the shutdown begins.
TRAFFIC = 400
#: Long, so that waiting half of it cannot pass for a quick drain.
SHUTDOWN_DEADLINE = 20.0


@pytest.mark.parametrize("publishers", ["at_owner", "at_forwarder"])
async def test_confirmed_messages_reach_subscribers_behind_a_forwarder(
    tmp_path: Path, publishers: str
) -> None:
    topics = topics_of("w0", IDS, 4) + topics_of("w1", IDS, 4)
    confirmed = dict.fromkeys(topics, 0)
    received: dict[str, list[int]] = {topic: [] for topic in topics}
    ends: list[int | None] = []
    enough = trio.Event()

    async def publish(at: str, topic: str) -> None:
        n = 0
        try:
            async with open_client(at, name=f"pub-{topic}") as client:
                while True:
                    for _ in range(20):
                        await client.publish(topic, b"%d" % n)
                        n += 1
                    await client.flush()
                    confirmed[topic] = n
                    if min(confirmed.values()) >= TRAFFIC:
                        enough.set()
        except ConnectionLost as error:
            ends.append(error.code)

    async def read(at: str, topic: str, *, task_status: trio.TaskStatus[None]) -> None:
        try:
            async with (
                open_client(at, name=f"sub-{topic}") as client,
                client.subscribe(topic) as subscription,
            ):
                task_status.started()
                async for message in subscription:
                    received[topic].append(int(message.payload))
        except ConnectionLost as error:
            ends.append(error.code)

    config = worker_config(tmp_path, memory_only=True, shutdown_deadline=SHUTDOWN_DEADLINE)
    async with running_workers(config, 2) as supervisor:
        direct = {
            worker.id: f"127.0.0.1:{worker.direct.getsockname()[1]}"
            for worker in supervisor.workers
        }
        with trio.fail_after(DEADLINE):
            async with trio.open_nursery() as clients:
                for topic in topics:
                    forwarder = "w1" if owner_id(topic, IDS) == "w0" else "w0"
                    await clients.start(read, direct[forwarder], topic)
                    at = forwarder if publishers == "at_forwarder" else owner_id(topic, IDS)
                    clients.start_soon(publish, direct[at], topic)
                await enough.wait()
                began = trio.current_time()
                await supervisor.shutdown()
                took = trio.current_time() - began
        processes = [worker.process for worker in supervisor.workers]
        # (what running_workers does next finds nothing left to stop)
    assert all(p is not None and p.returncode == 0 for p in processes)  # (none crashed)
    assert ends == [GoodbyeCode.SHUTTING_DOWN] * 2 * len(topics)
    for topic in topics:
        # (memory-only, from the latest: what was published before the
        # subscription reached the owner is not for it)
        got, last = received[topic], confirmed[topic]
        assert got and got[0] < TRAFFIC
        assert got[: last - got[0]] == list(range(got[0], last)), topic
    assert took < SHUTDOWN_DEADLINE / 2
