"""Pattern subscriptions under ``broker serve --workers 2``: a subscriber at
one worker gets the records of matching topics owned by either worker,
those on disk when it subscribes and those made later at the other."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import trio

from broker.client import open_client
from broker.protocol import owner_id
from tests.workers.test_supervisor import DEADLINE, running_workers, worker_config

from .helpers import take


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


async def test_a_delete_at_the_owner_ends_what_other_workers_feed(tmp_path: Path) -> None:
    """A topic deleted at its owner: a plain subscriber at another worker
    ends (no hang), a pattern there reads the topic made again from 1."""
    ids = ["w0", "w1"]
    (topic,) = _names("wk", "w0", ids, 1)
    async with running_workers(worker_config(tmp_path), 2) as supervisor:
        w0, w1 = supervisor.workers
        at_w0 = f"127.0.0.1:{w0.direct.getsockname()[1]}"
        at_w1 = f"127.0.0.1:{w1.direct.getsockname()[1]}"
        async with open_client(at_w0, name="publisher") as publisher:
            for n in range(3):
                await publisher.publish(topic, b"%d" % n)
            await publisher.flush()
        async with (
            open_client(at_w1, name="subscriber") as client,
            client.subscribe(topic, start="earliest") as plain,
            client.subscribe("wk.*", start="earliest") as pattern,
            open_client(at_w0, name="admin") as admin,
        ):
            assert len(await take(plain, 3)) == len(await take(pattern, 3)) == 3
            assert (await admin.admin("delete-topic", topic=topic))[0]["deleted"]
            with trio.fail_after(DEADLINE):
                async for message in plain:
                    raise AssertionError(f"nothing comes after the delete: {message}")
            assert plain.ended is not None
            async with open_client(at_w0, name="publisher") as publisher:
                for n in range(2):
                    await publisher.publish(topic, b"again %d" % n)
                await publisher.flush()
            again = await take(pattern, 2)
            assert [(m.offset, m.payload) for m in again] == [(1, b"again 0"), (2, b"again 1")]


async def test_a_pattern_from_the_end_gets_what_another_worker_serves(tmp_path: Path) -> None:
    """A topic on disk, served by another worker and published to only
    there: a pattern from the end (the default) gets what comes after."""
    ids = ["w0", "w1"]
    (topic,) = _names("wk", "w0", ids, 1)
    async with running_workers(worker_config(tmp_path), 2) as supervisor:
        w0, w1 = supervisor.workers
        at_w0 = f"127.0.0.1:{w0.direct.getsockname()[1]}"
        at_w1 = f"127.0.0.1:{w1.direct.getsockname()[1]}"
        async with open_client(at_w0, name="publisher") as publisher:
            await publisher.publish(topic, b"before")
            await publisher.flush()
            async with (
                open_client(at_w1, name="subscriber") as client,
                client.subscribe("wk.*") as pattern,
            ):
                got = None
                with trio.fail_after(DEADLINE):
                    while got is None:  # (until its member is made at the owner)
                        await publisher.publish(topic, b"after")
                        await publisher.flush()
                        with trio.move_on_after(0.2):
                            got = await pattern.receive()
                assert got.topic == topic and got.payload == b"after"
