"""The client against a JetStream cluster of three nats-servers (the
launcher of ``broker/nats/_servers.py``): the servers INFO names learned,
an R3 stream, and publishes resent through a kill of the stream's leader
stored once each, in order."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from broker.nats import JetStream, JetStreamUnavailable, StreamConfig, open_nats
from broker.nats._servers import open_nats_servers_async
from broker.server.storage._jetstream import JetStreamRuns, stream_name

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
