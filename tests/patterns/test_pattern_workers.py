"""Pattern subscriptions under ``broker serve --workers 2``: a subscriber at
one worker gets the records of matching topics owned by either worker,
those on disk when it subscribes and those made later at the other."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import trio

from broker.client import open_client
from broker.protocol import owner_id

from ..workers.test_supervisor import DEADLINE, running_workers, worker_config


def _names(prefix: str, worker: str, ids: list[str], wanted: int) -> list[str]:
    found = [f"{prefix}.{i}" for i in range(1000) if owner_id(f"{prefix}.{i}", ids) == worker]
    return found[:wanted]


async def test_a_pattern_gets_every_workers_topics(tmp_path: Path) -> None:
    ids = ["w0", "w1"]
    before = _names("wk", "w0", ids, 2) + _names("wk", "w1", ids, 2)
    later = [n for n in _names("wk", "w0", ids, 4) + _names("wk", "w1", ids, 4) if n not in before]
    count = 50
    async with running_workers(worker_config(tmp_path), 2) as supervisor:
        w0, w1 = supervisor.workers
        at_w0 = f"127.0.0.1:{w0.direct.getsockname()[1]}"
        at_w1 = f"127.0.0.1:{w1.direct.getsockname()[1]}"
        async with open_client(at_w0, name="early") as publisher:
            for topic in before:
                for n in range(count):
                    await publisher.publish(topic, b"%d" % n)
            await publisher.flush()
        got: dict[str, list[int]] = defaultdict(list)
        async with (
            open_client(at_w1, name="subscriber") as subscriber,
            subscriber.subscribe("wk.*", start="earliest") as subscription,
            open_client(at_w0, name="late") as publisher,
        ):
            for topic in later:
                for n in range(count):
                    await publisher.publish(topic, b"%d" % n)
            await publisher.flush()
            with trio.fail_after(DEADLINE):
                while sum(map(len, got.values())) < count * len(before + later):
                    message = await subscription.receive()
                    got[message.topic].append(int(message.payload))
        assert set(got) == set(before + later)
        for topic in before + later:
            assert got[topic] == list(range(count)), topic
