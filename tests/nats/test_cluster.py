"""The client against a JetStream cluster of three nats-servers (the
launcher of ``broker/nats/_servers.py``): the servers INFO names learned,
an R3 stream, publishes resent through a kill of the stream's leader
stored once each, in order, and a lost quorum as the metrics count it."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from broker.log import LogConfig, LogStore
from broker.nats import JetStream, JetStreamUnavailable, StreamConfig, open_nats
from broker.nats._servers import open_nats_servers_async
from broker.server.storage._jetstream import JetStreamRuns, stream_name
from broker.server.storage._replication import STORE_FAILURES
from broker.server.storage._topic_logs import Replication

from ..server.helpers import wait_until
from .raw import require_nats_server

pytestmark = pytest.mark.slow  # (an election after the kill: 4-9 s by NATS's constants)

#: A hang guard only.
PATIENCE = 120


async def test_publishes_resent_through_a_leader_kill_are_stored_once(tmp_path: Path) -> None:
    require_nats_server()
    async with (
        open_nats_servers_async(tmp_path, 3) as servers,
        open_nats(servers[0].url, reconnect_wait_most=0.2) as client,
    ):
        # Learned from INFO: the first one at connect, the rest in the INFO a
        # server sends when its routes come up (which may be after we connect).
        await wait_until(lambda: set(servers.urls) <= set(client.servers), what="the INFOs")
        js = JetStream(client, timeout=2.0)
        await js.add_stream(StreamConfig("R", ["r.>"], num_replicas=3, allow_direct=True))
        leader = await trio.to_thread.run_sync(servers.wait_for_leader_of, "R")
        resends = 0
        with trio.fail_after(PATIENCE):
            for i in range(60):
                if i == 20:
                    leader.kill()
                while True:
                    try:
                        ack = await js.publish("r.x", b"%d" % i, msg_id=f"m{i}")
                        break
                    except JetStreamUnavailable:
                        resends += 1
                        await trio.sleep(0.05)  # (a front end backs off too)
                assert ack.seq == i + 1  # (a resend stored before: its duplicate)
        assert resends >= 1
        info = await js.stream_info("R")
        assert (info.state.messages, info.state.last_seq) == (60, 60)
        got = [await js.get_msg("R", seq, direct=True) for seq in range(1, 61)]
        assert [m.payload for m in got if m is not None] == [b"%d" % i for i in range(60)]


async def test_a_topic_stream_s_new_leader_is_heard(tmp_path: Path) -> None:
    require_nats_server()
    elected: list[str] = []
    async with (
        open_nats_servers_async(tmp_path, 3) as servers,
        open_nats(servers[0].url) as client,
    ):
        runs = JetStreamRuns(JetStream(client, timeout=5.0), replicas=3)
        await runs.open_stream("orders.eu")
        await trio.to_thread.run_sync(servers.wait_for_leader_of, stream_name("orders.eu"))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(runs.watch_leaders, elected.append)
            await client.flush()  # (the advisories' subscription is in place)
            # The leader steps down (as when it is killed): another is elected.
            await client.request(f"$JS.API.STREAM.LEADER.STEPDOWN.{stream_name('orders.eu')}", b"")
            await wait_until(lambda: bool(elected), what="the advisory")
            nursery.cancel_scope.cancel()
    assert set(elected) == {"orders.eu"}


@pytest.mark.parametrize(
    ("leader_kept", "reason"), [(True, "unavailable"), (False, "no_responders")]
)
async def test_a_lost_quorum_leaves_a_run_in_flight_and_counts_its_failures(
    tmp_path: Path, leader_kept: bool, reason: str
) -> None:
    """What ``BrokerClusterQuorumLost`` watches, over a real cluster: with two
    of three servers killed, a run stays in flight, not stored, and each send
    that fails is counted by its reason; once they are back, it is stored.
    The stream's leader kept, it holds the run and cannot commit it: its
    resends are refused as "in process" (unavailable); the leader among
    those killed, nothing answers (no responders)."""
    require_nats_server()
    store = LogStore(tmp_path / "cache", LogConfig(term_bytes=4096))
    async with (
        open_nats_servers_async(tmp_path / "nats", 3) as servers,
        open_nats(servers.urls, reconnect_wait_most=0.2) as client,
    ):
        replication = Replication(JetStreamRuns(JetStream(client), timeout=2.0), "w1")
        replicator = replication.replicator
        log = replication.open(store, "t", LogConfig(term_bytes=4096))
        with trio.fail_after(PATIENCE):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(replicator.run)
                log.append_many([b"before"], 1000)
                replicator.ask("t", log)
                await wait_until(lambda: replicator.records_stored == 1, what="the first run")
                leader = await trio.to_thread.run_sync(servers.wait_for_leader_of, stream_name("t"))
                followers = [server for server in servers if server is not leader]
                killed = followers if leader_kept else [leader, followers[0]]
                for server in killed:
                    server.kill()
                log.append_many([b"during"], 2000)
                replicator.ask("t", log)
                await wait_until(
                    lambda: replicator.store_failures[reason] >= 2, what="failed sends"
                )
                during = (replication.runs_in_flight, replicator.records_stored)
                failures = dict(replicator.store_failures)
                for server in killed:
                    server.start()
                await trio.to_thread.run_sync(servers.wait_ready)
                await wait_until(lambda: replicator.records_stored == 2, what="the run stored")
                assert replication.runs_in_flight == 0
                nursery.cancel_scope.cancel()
    log.close()
    assert during == (1, 1)
    assert set(failures) == set(STORE_FAILURES)
    assert failures["refused"] == 0, failures
