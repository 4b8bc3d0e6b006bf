"""``broker serve --cluster`` over three real ``nats-server``s: a front end
that is ``kill -9``ed, its data directory lost, and replaced by another
loses nothing it confirmed; a stream leader ``kill -9``ed mid-publish
loses nothing confirmed either (publishes wait for the election, then go
on); and a cluster that does not sync every write is refused with one
line unless the operator says ``--cluster-unsafe-sync``.

Every process is started on free loopback ports and stopped by PID.
Deadlines are hang guards only: nothing waits for a time to pass, so a
busy machine makes this slower, never wrong.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import trio

from broker.client import ConnectionLost, open_client
from broker.errors import BrokerError
from broker.nats._servers import NatsServers, open_nats_servers
from broker.server.storage._jetstream import stream_name

from .raw import require_nats_server

#: Hang guard of every step (seconds).
DEADLINE = 120.0
BATCH = 200
PAYLOAD = 64

pytestmark = pytest.mark.slow


def payload(number: int) -> bytes:
    return b"%010d" % number + b"." * (PAYLOAD - 10)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServers]:
    """Three servers, every write synced, the JSZ ping imported into the
    application account (what the front end's start-up check asks)."""
    require_nats_server()
    directory = tmp_path_factory.mktemp("nats")
    with open_nats_servers(directory, 3, system_account=True, app_jsz_import=True) as servers:
        yield servers


@contextmanager
def front_end(
    servers: NatsServers, data_dir: Path, log: Path, *extra: str
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """A ``broker serve --cluster`` process: ``(process, address)``; killed
    afterwards if still running."""
    command = [sys.executable, "-m", "broker", "--log-level", "INFO", "serve"]
    command += ["--listen", "127.0.0.1:0", "--metrics-listen", "", "--data-dir", str(data_dir)]
    command += ["--cluster", ",".join(servers.urls), *extra]
    with open(log, "ab") as errors:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=errors)
    try:
        assert process.stdout is not None
        line = process.stdout.readline().decode()
        if "listening on" not in line:
            process.kill()
            raise AssertionError(f"front end did not start: {line!r}; {log.read_text()[-3000:]}")
        yield process, line.split("listening on", 1)[1].strip()
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(DEADLINE)
        if process.stdout is not None:
            process.stdout.close()


async def publish(
    address: str, topic: str, first: int, count: int, confirmed_so_far: trio.Event | None = None
) -> int:
    """Publish ``count`` records from number ``first``, a flush per batch;
    how many were confirmed when the connection was lost (or all).
    ``confirmed_so_far`` is set once half of them are confirmed."""
    confirmed = 0
    try:
        async with open_client(address, name="pub") as client:
            while confirmed < count:
                batch = min(BATCH, count - confirmed)
                for number in range(first + confirmed, first + confirmed + batch):
                    await client.publish(topic, payload(number))
                await client.flush()
                confirmed += batch
                if confirmed_so_far is not None and confirmed >= count // 2:
                    confirmed_so_far.set()
    except ConnectionLost:
        pass
    return confirmed


async def read_all(address: str, topic: str, count: int) -> list[tuple[int, bytes]]:
    got: list[tuple[int, bytes]] = []
    async with (
        open_client(address, name="reader") as client,
        client.subscribe(topic, options={"from": "earliest"}) as subscription,
    ):
        async for message in subscription:
            got.append((message.seq, message.payload))
            if len(got) == count:
                break
    return got


async def test_a_front_end_killed_with_its_disk_loses_nothing_confirmed(
    cluster: NatsServers, tmp_path: Path
) -> None:
    log = tmp_path / "front-end.log"
    first_dir, second_dir = tmp_path / "a", tmp_path / "b"
    with trio.fail_after(DEADLINE):
        with front_end(cluster, first_dir, log) as (process, address):
            confirmed = await publish(address, "orders", 0, 3_000)
            assert confirmed == 3_000
            os.kill(process.pid, signal.SIGKILL)
            await trio.to_thread.run_sync(process.wait)
        shutil.rmtree(first_dir)  # (the machine is gone, its disk with it)
        with front_end(cluster, second_dir, log) as (_process, address):
            assert await publish(address, "orders", 3_000, 500) == 500
            got = await read_all(address, "orders", 3_500)
    assert [seq for seq, _ in got] == list(range(1, 3_501))
    assert [data for _, data in got] == [payload(n) for n in range(3_500)]
    assert "restored from their streams" in log.read_text()


async def test_a_stream_leader_killed_mid_publish_loses_nothing_confirmed(
    cluster: NatsServers, tmp_path: Path
) -> None:
    log = tmp_path / "front-end.log"
    topic = "leader.kill"
    with trio.fail_after(DEADLINE * 2):
        with front_end(cluster, tmp_path / "a", log) as (_process, address):
            assert await publish(address, topic, 0, 400) == 400
            leader = await trio.to_thread.run_sync(cluster.wait_for_leader_of, stream_name(topic))
            confirmed = 400
            halfway = trio.Event()
            async with trio.open_nursery() as nursery:

                async def go_on() -> None:
                    nonlocal confirmed
                    confirmed += await publish(address, topic, 400, 4_000, halfway)

                nursery.start_soon(go_on)
                await halfway.wait()
                leader.kill()  # (mid-publish: the other half is on its way)
                killed = trio.current_time()
            stalled = trio.current_time() - killed
            assert confirmed == 4_400  # (publishes waited for the new leader)
            await trio.to_thread.run_sync(leader.restart)
            got = await read_all(address, topic, 4_400)
    assert [data for _, data in got] == [payload(n) for n in range(4_400)]
    assert [seq for seq, _ in got] == list(range(1, 4_401))
    print(f"publishes done {stalled:.1f} s after the stream leader was killed")


def test_a_cluster_that_does_not_sync_every_write_is_refused(tmp_path: Path) -> None:
    require_nats_server()
    with open_nats_servers(
        tmp_path / "nats", 1, sync_always=False, system_account=True, app_jsz_import=True
    ) as servers:
        command = [sys.executable, "-m", "broker", "--log-level", "WARNING", "serve"]
        command += ["--listen", "127.0.0.1:0"]
        command += ["--metrics-listen", "", "--data-dir", str(tmp_path / "d")]
        command += ["--cluster", servers.urls[0]]
        refused = subprocess.run(command, capture_output=True, timeout=DEADLINE, check=False)
        assert refused.returncode == 1
        lines = refused.stderr.decode().strip().splitlines()
        assert len(lines) == 1, lines
        assert "sync" in lines[0] and "--cluster-unsafe-sync" in lines[0]
        # (One server cannot hold the default three replicas: said in the same line.)
        assert "cluster_replicas is 3 but the JetStream cluster has 1 server" in lines[0]
        unsafe = ("--cluster-unsafe-sync", "--set", "cluster_replicas=1")
        with front_end(servers, tmp_path / "d", tmp_path / "log", *unsafe) as (process, _):
            assert process.poll() is None


async def test_records_up_to_the_servers_max_payload_go_through(
    cluster: NatsServers, tmp_path: Path
) -> None:
    """A record travels whole in one NATS message: the front end lowers
    max_message to what the servers' max_payload (1 MB by default) holds
    and says so; a larger publish is refused before it is sent."""
    log = tmp_path / "front-end.log"
    large = b"L" * 900_000
    with trio.fail_after(DEADLINE), front_end(cluster, tmp_path / "a", log) as (_p, address):
        async with open_client(address, name="large") as client:
            await client.publish("large", large)
            await client.flush()
            with pytest.raises(BrokerError, match=r"max_message|larger"):
                await client.publish("large", b"X" * 2_000_000)
        assert await read_all(address, "large", 1) == [(1, large)]
    assert "limited to" in log.read_text() and "max_payload" in log.read_text()
