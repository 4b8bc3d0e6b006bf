"""A worker of ``broker serve --workers 2`` killed with SIGKILL while it
routes a staged commit: the supervisor starts it again, the new worker
completes the commit from its own state journal before it accepts
clients, and the retried commit answers "duplicate". Every message of the
batch is in its topics once."""

from __future__ import annotations

import os
import signal
from collections import Counter
from contextlib import suppress
from pathlib import Path

import trio

from broker.client import Client, ClientError, open_client
from broker.protocol import OutcomeStatus, Stage

from .test_supervisor import DEADLINE, running_workers, topics_of, worker_config

#: Large enough that the commit is still routing when the kill lands (it
#: lands once 200 of them were seen: a hundredth of the batch).
PER_TOPIC = 10_000


async def read_all(client: Client, topic: str) -> list[bytes]:
    first, end = (await client.offsets([topic]))[topic]
    got: list[bytes] = []
    async with client.subscribe(topic, start="earliest") as subscription:
        while len(got) < end - first:
            got.append((await subscription.receive()).payload)
    return got


async def test_a_worker_killed_mid_commit_completes_it_when_started_again(
    tmp_path: Path,
) -> None:
    async with running_workers(worker_config(tmp_path), 2) as supervisor:
        owner = supervisor.workers[1]
        address = f"127.0.0.1:{owner.direct.getsockname()[1]}"
        topics = topics_of("w1", ["w0", "w1"], 2)
        async with open_client(address, name="task") as task:
            stage = Stage("job", "m")
            for index in range(PER_TOPIC * len(topics)):
                topic = topics[(index // 300) % len(topics)]
                await task.publish(topic, b"job|%d" % index, stage=stage)
            members = [("m", await task.finish_stage(stage))]
        outcome: list[int] = []

        async def commit(client: Client) -> None:
            with suppress(ClientError):  # (the kill)
                outcome.append((await client.commit("job", members)).status)

        assert owner.pid is not None
        with trio.fail_after(DEADLINE):
            async with (
                open_client(address, name="driver") as driver,
                open_client(address, name="watch") as watch,
                watch.subscribe(topics[0], start="earliest") as seen,
                trio.open_nursery() as nursery,
            ):
                nursery.start_soon(commit, driver)
                for _ in range(200):  # (of 10,000 there: the commit is routing)
                    await seen.receive()
                os.kill(owner.pid, signal.SIGKILL)
                nursery.cancel_scope.cancel()
            await owner.wait_up(restarts=1)
            async with open_client(address, name="reader") as reader:
                got = [m for topic in topics for m in await read_all(reader, topic)]
                retried = await reader.commit("job", members)
    assert not outcome  # (the kill cut the commit off)
    counts = Counter(got)
    assert len(counts) == PER_TOPIC * len(topics)
    assert set(counts.values()) == {1}, "a message of the batch is stored twice"
    assert retried.status == OutcomeStatus.DUPLICATE
