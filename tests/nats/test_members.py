"""Cluster front ends' membership over a real nats-server: two front ends
learn each other, a front end that stops says it leaves and is dropped at
once, one that falls silent is dropped after ``dead_after``, and what is not
a heartbeat is counted and ignored."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial

import pytest
import trio

from broker.nats import NatsClient, open_nats
from broker.nats._servers import NatsServer
from broker.protocol import Cluster
from broker.server.cluster._members import FrontEnd, Membership, encode_heartbeat
from broker.server.cluster._members_io import serve_membership

# Each start listens dead_after seconds after hearing its own heartbeat.
pytestmark = pytest.mark.slow

#: A hang guard only: no test depends on being faster than this.
PATIENCE = 30
SUBJECT = "test.members"
#: Long beside the interval, so that no heartbeat is late enough on a loaded
#: machine to drop a member that is still there.
DEAD_AFTER = 3.0
INTERVAL = 0.2

A = FrontEnd("aaaaaaaaaaaa", "127.0.0.1", 7001, "127.0.0.1", 8001)
B = FrontEnd("bbbbbbbbbbbb", "127.0.0.1", 7002, "127.0.0.1", 8002)


def _serve(
    client: NatsClient, table: Membership, changes: list[Cluster]
) -> Callable[..., Awaitable[None]]:
    return partial(
        serve_membership,
        client,
        table,
        subject=SUBJECT,
        interval=INTERVAL,
        on_change=changes.append,
    )


async def _until(condition: Callable[[], bool]) -> None:
    """Look at the tables every 10 ms until ``condition()`` holds (the test's
    hang guard bounds the wait)."""
    while not condition():  # noqa: ASYNC110 (the tables' state, polled)
        await trio.sleep(0.01)


def _ids(cluster: Cluster) -> list[str]:
    return [member.id for member in cluster.members]


async def test_two_front_ends_learn_each_other_and_a_leave_is_heard(
    nats_server: NatsServer,
) -> None:
    table_a, table_b = Membership(A, dead_after=DEAD_AFTER), Membership(B, dead_after=DEAD_AFTER)
    changes_a: list[Cluster] = []
    changes_b: list[Cluster] = []
    after_b: list[str] = []
    with trio.fail_after(PATIENCE):
        async with (
            open_nats(nats_server.url) as client_a,
            open_nats(nats_server.url) as client_b,
            trio.open_nursery() as nursery,
        ):
            first_a = await nursery.start(_serve(client_a, table_a, changes_a))
            assert _ids(first_a) == [A.id]
            assert changes_a == []
            async with trio.open_nursery() as b_nursery:

                async def run_b(task_status: trio.TaskStatus[Cluster]) -> None:
                    await _serve(client_b, table_b, changes_b)(task_status=task_status)
                    after_b.append("serve_membership returned")

                first_b = await b_nursery.start(run_b)
                # B started only once it had heard A: its first cluster has both.
                assert _ids(first_b) == [A.id, B.id]
                assert first_b.worker == B.id
                await _until(lambda: len(table_a.members) == 2)
                assert _ids(changes_a[-1]) == [A.id, B.id]
                assert table_a.link_address(B.id) == (B.link_host, B.link_port)
                b_nursery.cancel_scope.cancel()
            assert after_b == []  # (the cancellation went on through it)
            await _until(lambda: len(table_a.members) == 1)
            assert _ids(changes_a[-1]) == [A.id]
            assert changes_a[-1].epoch > changes_a[0].epoch
            stats = table_a.statistics()
            assert (stats.left, stats.expired, stats.malformed) == (1, 0, 0)
            nursery.cancel_scope.cancel()


async def test_a_silent_front_end_is_dropped_after_dead_after(nats_server: NatsServer) -> None:
    """B beats (by hand here) and then stops without saying it leaves, as a
    killed process would: A drops it once it has been silent ``dead_after``."""
    table_a = Membership(A, dead_after=DEAD_AFTER)
    changes_a: list[Cluster] = []
    with trio.fail_after(PATIENCE):
        async with (
            open_nats(nats_server.url) as client_a,
            open_nats(nats_server.url) as client_b,
            trio.open_nursery() as nursery,
        ):
            beating = trio.CancelScope()

            async def beat_b() -> None:
                with beating:
                    while True:
                        await client_b.publish(SUBJECT, encode_heartbeat(B))
                        await trio.sleep(INTERVAL)

            nursery.start_soon(beat_b)
            first_a = await nursery.start(_serve(client_a, table_a, changes_a))
            assert _ids(first_a) == [A.id, B.id]
            beating.cancel()
            await _until(lambda: len(table_a.members) == 1)
            assert _ids(changes_a[-1]) == [A.id]
            stats = table_a.statistics()
            assert (stats.left, stats.expired) == (0, 1)
            nursery.cancel_scope.cancel()


async def test_what_is_not_a_heartbeat_is_counted_and_ignored(nats_server: NatsServer) -> None:
    table_a = Membership(A, dead_after=DEAD_AFTER)
    changes_a: list[Cluster] = []
    with trio.fail_after(PATIENCE):
        async with (
            open_nats(nats_server.url) as client_a,
            open_nats(nats_server.url) as client_b,
            trio.open_nursery() as nursery,
        ):
            await nursery.start(_serve(client_a, table_a, changes_a))
            await client_b.publish(SUBJECT, b"\x00not a heartbeat")
            await client_b.publish(SUBJECT, encode_heartbeat(B)[:-1])
            await client_b.publish(SUBJECT, encode_heartbeat(B))
            await _until(lambda: table_a.statistics().malformed == 2 and len(changes_a) == 1)
            assert table_a.members == (A, B)
            assert _ids(changes_a[0]) == [A.id, B.id]
            nursery.cancel_scope.cancel()


async def test_the_interval_must_be_below_dead_after(nats_server: NatsServer) -> None:
    async with open_nats(nats_server.url) as client:
        with pytest.raises(ValueError):
            await serve_membership(
                client, Membership(A, dead_after=1.0), interval=1.0, on_change=print
            )
