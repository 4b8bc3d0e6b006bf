"""``serve_workers``: N worker processes behind one address, each owning its
topics; clients reach the owners from one address; a worker killed with
SIGKILL is restarted and its topics' logs recover while the others go on."""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from broker.client import open_client, open_cluster_client
from broker.config import BrokerConfig
from broker.protocol import owner_id
from broker.workers import Supervisor, serve_workers
from tests.proxy import proxied
from tests.server.helpers import wait_until

#: Generous: worker processes start in about a second, slower under load.
DEADLINE = 60.0


def worker_config(tmp_path: Path, **overrides: Any) -> BrokerConfig:
    settings: dict[str, Any] = {
        "listen": "127.0.0.1:0",
        "metrics_listen": "",
        "shutdown_deadline": 2.0,
        "data_dir": str(tmp_path / "data"),
        "lease": 30.0,
        "heartbeat": 1.0,
    }
    settings.update(overrides)
    return BrokerConfig(**settings)


@asynccontextmanager
async def running_workers(config: BrokerConfig, count: int) -> AsyncIterator[Supervisor]:
    async with trio.open_nursery() as nursery:
        with trio.fail_after(DEADLINE):
            supervisor: Supervisor = await nursery.start(
                partial(serve_workers, config, count, log_level="WARNING")
            )
        yield supervisor
        with trio.fail_after(DEADLINE):
            await supervisor.shutdown()


def topics_of(worker: str, ids: list[str], wanted: int) -> list[str]:
    """``wanted`` topic names that ``worker`` owns among ``ids``."""
    found = [f"t{i}" for i in range(1000) if owner_id(f"t{i}", ids) == worker]
    return found[:wanted]


async def across_a_break(
    url: str, topic: str, break_it: Callable[[], None], **options: Any
) -> list[bytes]:
    """A subscriber and a publisher (``reconnect`` on, ``options`` given) at
    ``url``: 100 messages, ``break_it()`` once 50 of them arrived, 100 more;
    what the subscriber received. Both clients must have resumed their
    sessions (none lost)."""
    got: list[bytes] = []
    async with (
        open_client(url, name="sub", reconnect=DEADLINE, **options) as subscriber,
        subscriber.subscribe(topic) as subscription,
        open_client(url, name="pub", reconnect=DEADLINE, **options) as publisher,
    ):
        for n in range(200):
            await publisher.publish(topic, b"%d" % n)
            if n == 99:
                await publisher.flush()
                with trio.fail_after(DEADLINE):
                    while len(got) < 50:
                        got.append((await subscription.receive()).payload)
                break_it()
        await publisher.flush()
        with trio.fail_after(DEADLINE):
            while len(got) < 200:
                got.append((await subscription.receive()).payload)
        for client in (subscriber, publisher):
            statistics = client.statistics()
            assert statistics["sessions_lost"] == 0 and statistics["resumes"] >= 1
    return got


async def read(client: Any, topic: str, count: int) -> list[bytes]:
    async with client.subscribe(topic, start="earliest") as subscription:
        with trio.fail_after(DEADLINE):
            return [(await subscription.receive()).payload for _ in range(count)]


async def test_clients_reach_each_topics_owner_from_one_address(tmp_path: Path) -> None:
    config = worker_config(tmp_path)
    async with running_workers(config, 2) as supervisor:
        host, port = supervisor.address
        topics = [f"topic-{i}" for i in range(8)]  # 4N topics
        async with open_cluster_client(f"{host}:{port}") as client:
            cluster = client.cluster
            assert cluster is not None and [m.id for m in cluster.members] == ["w0", "w1"]
            assert {m.port for m in cluster.members} == {
                w.direct.getsockname()[1] for w in supervisor.workers
            }
            for topic in topics:
                for n in range(25):
                    await client.publish(topic, b"%s %d" % (topic.encode(), n))
            await client.flush()
            for topic in topics:
                expected = [b"%s %d" % (topic.encode(), n) for n in range(25)]
                assert await read(client, topic, 25) == expected
        # Every topic's log is written by its owner, which holds its lock.
        for topic in topics:
            owner = cluster.owner(topic)
            direct = next(w for w in supervisor.workers if w.id == owner.id)
            async with open_client(f"127.0.0.1:{direct.direct.getsockname()[1]}") as one:
                assert (await one.offsets([topic]))[topic][1] >= 25


async def broker_run(
    config: BrokerConfig, ended: trio.Event, *, task_status: trio.TaskStatus[Supervisor]
) -> None:
    """Two workers until shut down; ``ended`` once the data directory's lock is free."""
    try:
        await serve_workers(config, 2, log_level="WARNING", task_status=task_status)
    finally:
        ended.set()


async def test_cluster_clients_go_on_after_the_whole_broker_restarts(tmp_path: Path) -> None:
    """A restart of the whole broker (``worker_port = 0``) gives every worker
    a new direct address: the cluster client's connections to the workers
    resume through the public address, which sends each resume on to its
    session's worker; publishing and subscribing go on with nothing lost
    and nothing twice, and no session lost."""
    topics = [f"topic-{i}" for i in range(4)]
    got: dict[str, list[bytes]] = {topic: [] for topic in topics}

    async with trio.open_nursery() as nursery:
        first_ended, second_ended = trio.Event(), trio.Event()
        with trio.fail_after(DEADLINE):
            first: Supervisor = await nursery.start(
                broker_run, worker_config(tmp_path), first_ended
            )
        host, port = first.address
        old = {w.direct.getsockname()[1] for w in first.workers}
        async with open_cluster_client(f"{host}:{port}", reconnect=DEADLINE) as client:
            reached = {(topic, n): trio.Event() for topic in topics for n in (20, 40)}

            async def take(topic: str, *, task_status: trio.TaskStatus[None]) -> None:
                async with client.subscribe(topic) as subscription:
                    task_status.started()
                    while len(got[topic]) < 40:
                        got[topic].append((await subscription.receive()).payload)
                        if (topic, len(got[topic])) in reached:
                            reached[topic, len(got[topic])].set()

            with trio.fail_after(DEADLINE):
                for topic in topics:
                    await nursery.start(take, topic)
                for topic in topics:
                    for n in range(20):
                        await client.publish(topic, b"%d" % n)
                await client.flush()
                for topic in topics:
                    await reached[topic, 20].wait()
                await first.shutdown()
                await first_ended.wait()
                # The same public address, new direct ones.
                again = worker_config(tmp_path, listen=f"{host}:{port}")
                second: Supervisor = await nursery.start(broker_run, again, second_ended)
            assert not {w.direct.getsockname()[1] for w in second.workers} & old
            with trio.fail_after(DEADLINE):
                for topic in topics:
                    for n in range(20, 40):
                        await client.publish(topic, b"%d" % n)
                await client.flush()
                for topic in topics:
                    await reached[topic, 40].wait()
            statistics = [member.statistics() for member in client.clients.values()]
        with trio.fail_after(DEADLINE):
            await second.shutdown()
    for topic in topics:
        assert got[topic] == [b"%d" % n for n in range(40)]
    assert all(s["resumes"] >= 1 and s["sessions_lost"] == 0 for s in statistics)


def reconnection_over(member: Any) -> bool:
    """A cluster client's member has replaced its broken connection (its
    session resumed, or lost)."""
    statistics = member.statistics()
    return not member.reconnecting and statistics["resumes"] + statistics["sessions_lost"] >= 1


async def test_a_cluster_clients_idle_connections_keep_their_sessions_over_a_restart(
    tmp_path: Path,
) -> None:
    """A cluster client using only a topic of ``w0`` holds an idle session
    on ``w1`` (nothing bound there): a graceful restart of the whole broker
    on the same data directory loses neither session."""
    (topic,) = topics_of("w0", ["w0", "w1"], 1)
    async with trio.open_nursery() as nursery:
        first_ended, second_ended = trio.Event(), trio.Event()
        with trio.fail_after(DEADLINE):
            first: Supervisor = await nursery.start(
                broker_run, worker_config(tmp_path), first_ended
            )
        host, port = first.address
        async with open_cluster_client(f"{host}:{port}", reconnect=DEADLINE) as client:
            with trio.fail_after(DEADLINE):
                await client.publish(topic, b"before")
                await client.flush()
                await first.shutdown()
                await first_ended.wait()
                again = worker_config(tmp_path, listen=f"{host}:{port}")
                second: Supervisor = await nursery.start(broker_run, again, second_ended)
                await client.publish(topic, b"after")
                await client.flush()  # (the w0 member resumed for it)
                members = list(client.clients.values())
            # The idle member, with nothing to flush, reconnects in its own time.
            await wait_until(lambda: all(reconnection_over(member) for member in members))
            statistics = [member.statistics() for member in members]
        with trio.fail_after(DEADLINE):
            await second.shutdown()
    assert [s["sessions_lost"] for s in statistics] == [0, 0]
    assert all(s["resumes"] == 1 for s in statistics)


async def test_a_killed_worker_restarts_its_topics_recover_and_the_other_goes_on(
    tmp_path: Path,
) -> None:
    config = worker_config(tmp_path)
    async with running_workers(config, 2) as supervisor:
        w0, w1 = supervisor.workers
        ids = ["w0", "w1"]
        mine, other = topics_of("w0", ids, 1)[0], topics_of("w1", ids, 1)[0]
        url0 = f"127.0.0.1:{w0.direct.getsockname()[1]}"
        url1 = f"127.0.0.1:{w1.direct.getsockname()[1]}"
        async with open_client(url0) as client:
            for n in range(100):
                await client.publish(mine, b"%d" % n)
            await client.flush()  # confirmed: written by w0
        assert w0.pid is not None
        old_pid = w0.pid
        os.kill(old_pid, signal.SIGKILL)
        # Meanwhile the other worker's topics never stop.
        async with open_client(url1) as client:
            for n in range(100):
                await client.publish(other, b"%d" % n)
            await client.flush()
        with trio.fail_after(DEADLINE):
            await w0.wait_up(restarts=1)
        assert w0.pid != old_pid
        assert w0.restarts == 1 and w0.last_exit == -signal.SIGKILL
        assert w1.restarts == 0
        async with open_client(url0, reconnect=DEADLINE) as client:
            assert await read(client, mine, 100) == [b"%d" % n for n in range(100)]
        async with open_client(url1) as client:
            assert await read(client, other, 100) == [b"%d" % n for n in range(100)]


async def test_a_hung_worker_is_killed_and_restarted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker whose event loop stopped (here: SIGSTOP) used to stay in
    place for good: /healthz 200, nothing logged, its topics unserved."""
    import broker.workers._supervisor as supervising

    monkeypatch.setattr(supervising, "WATCH_EVERY", 0.2)
    monkeypatch.setattr(supervising, "WATCH_TIMEOUT", 0.5)
    monkeypatch.setattr(supervising, "HUNG_AFTER", 3)
    async with running_workers(worker_config(tmp_path), 2) as supervisor:
        w0, w1 = supervisor.workers
        assert w0.pid is not None
        os.kill(w0.pid, signal.SIGSTOP)
        with trio.fail_after(DEADLINE):
            await w0.wait_up(restarts=1)
        assert w0.last_exit == -signal.SIGKILL
        assert w1.restarts == 0  # answering all along: left alone
        url0 = f"127.0.0.1:{w0.direct.getsockname()[1]}"
        async with open_client(url0) as client:
            await client.publish(topics_of("w0", ["w0", "w1"], 1)[0], b"served again")
            await client.flush()


@pytest.mark.parametrize("owner", ["w0", "w1"])
async def test_a_session_on_a_killed_worker_resumes_with_no_loss_and_no_duplicate(
    tmp_path: Path, owner: str
) -> None:
    """Clients with sessions at w0 publish and subscribe to a topic of
    ``owner`` (w1: both forwarded); w0 is killed: once restarted, the
    sessions resume, with their subscription (a forwarded one restored from
    the session's record), after the last message the client processed."""
    config = worker_config(tmp_path)
    async with running_workers(config, 2) as supervisor:
        w0 = supervisor.workers[0]
        topic = topics_of(owner, ["w0", "w1"], 1)[0]
        url0 = f"127.0.0.1:{w0.direct.getsockname()[1]}"

        def kill() -> None:
            assert w0.pid is not None
            os.kill(w0.pid, signal.SIGKILL)

        got = await across_a_break(url0, topic, kill)
        assert got == [b"%d" % n for n in range(200)]
        assert w0.restarts == 1


async def test_shutdown_drains_every_worker(tmp_path: Path) -> None:
    config = worker_config(tmp_path)
    async with running_workers(config, 2) as supervisor:
        processes = [w.process for w in supervisor.workers]
    assert all(p is not None and p.returncode == 0 for p in processes)
    assert not any(map(os.path.lexists, [w.link_path for w in supervisor.workers]))


async def test_a_resume_that_lands_on_another_worker_is_handed_to_the_sessions_home(
    tmp_path: Path,
) -> None:
    config = worker_config(tmp_path)
    async with running_workers(config, 2) as supervisor:
        w0, w1 = supervisor.workers
        topic = topics_of("w0", ["w0", "w1"], 1)[0]
        # Through a proxy that first leads to w0, then (after a cut) to w1:
        # the resumes land on w1, which passes the sockets to w0.
        async with proxied(("127.0.0.1", w0.direct.getsockname()[1])) as proxy:

            def lead_elsewhere() -> None:
                proxy.target = ("127.0.0.1", w1.direct.getsockname()[1])
                proxy.cut()

            got = await across_a_break(proxy.url, topic, lead_elsewhere)
        assert got == [b"%d" % n for n in range(200)]
