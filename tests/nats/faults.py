"""Seeded fault schedules for cluster mode: a front end over three
``nats-server``s, a publisher flushing batches of numbered records, and one
fault at a seeded moment; then every record is read back and checked:
nothing confirmed is missing, nothing is stored twice, every publisher's
records are in order.

The faults (``FAULTS``):

- ``leader-kill``: ``kill -9`` of the topic's stream leader, restarted a
  few seconds later;
- ``leader-pause``: the stream leader stopped (SIGSTOP) for 10 s;
- ``two-down``: two of the three servers (the leader one of them) killed,
  restarted 5 s later: no quorum meanwhile;
- ``all-restart``: all three servers killed and restarted;
- ``front-end-kill``: ``kill -9`` of the front end, another started on an
  empty data directory at another address; the publisher's client
  reconnects there and resumes its session (kept in the cluster), sending
  again what the broker did not have: nothing is stored twice.
- ``front-end-failover``: two front ends share the topics; ``kill -9`` of
  the one the publisher is connected to: its client resumes its session
  on the other, which takes over the dead one's topics after it falls
  silent (2 s).

Run many seeds outside CI (a soak)::

    python -m tests.nats.faults --seeds 50 --first-seed 1 [--fault leader-kill]

``tests/nats/test_fault_schedules.py`` runs one seed of each in CI.

Throughout a schedule each front end's ``/stat.json`` is sampled every
0.1 s (``hop_debt.py``): each hop's most debt (the publishing connection
and its channel, a link to the topic's owner, the runs and records on their
way to the stream) against its watermark plus one run; a hop over its
bound fails the schedule. ``--batch`` sets the records between flushes:
the default 500 (about 130 KB of debt) stays far below a channel's
watermark (1 MiB); 5,000 takes the channel to it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import trio

from broker.client import open_client
from broker.nats._servers import NatsServers, open_nats_servers
from broker.server.storage._jetstream import stream_name

from .hop_debt import HOPS, Hop, HopDebt, sample

FAULTS = (
    "leader-kill",
    "leader-pause",
    "two-down",
    "all-restart",
    "front-end-kill",
    "front-end-failover",
)
TOPIC = "faults"
#: The publisher's client name (its connection's ``client`` in ``/stat.json``).
PUBLISHER = "faults-pub"
BATCH = 500
PAYLOAD = 100
#: Hang guard of one schedule (seconds).
DEADLINE = 300.0
#: Seconds the publisher's client keeps trying to reconnect and resume.
RECONNECT = 120.0


def rss_anon_mib(pid: int) -> float:
    """``RssAnon`` of process ``pid`` (MiB; 0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def payload(number: int) -> bytes:
    return b"%010d" % number + b"." * (PAYLOAD - 10)


@dataclass
class Outcome:
    """What one schedule did and what came back."""

    seed: int
    fault: str
    published: int = 0
    confirmed: int = 0
    read: int = 0
    lost: int = 0
    duplicated: int = 0
    out_of_order: int = 0
    #: Reconnects on which the front end did not know the publisher's session.
    sessions_lost: int = 0
    #: The longest time without a confirm from the fault on (seconds): how
    #: long publishing stalled (an election, a new front end).
    stalled_s: float = 0.0
    seconds: float = 0.0
    #: The front end's RssAnon: its most above what it was once the first
    #: batch was confirmed (MiB; 0 if it could not be read).
    rss_anon_growth_mib: float = 0.0
    #: Each hop's most debt and its bound (see ``hop_debt.py``).
    hops: dict[str, Hop] = field(default_factory=dict)
    #: ``/stat.json`` documents sampled, and requests that failed.
    stat_samples: int = 0
    stat_failed: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def exceeded(self) -> list[str]:
        """The hops whose debt went over their bound."""
        return [name for name, hop in self.hops.items() if hop.exceeded]

    @property
    def ok(self) -> bool:
        return not (
            self.lost or self.duplicated or self.out_of_order or self.sessions_lost or self.exceeded
        )


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class FrontEnd:
    """A ``broker serve --cluster`` process, replaceable by another."""

    def __init__(self, servers: NatsServers, directory: Path) -> None:
        self.servers = servers
        self.directory = directory
        self.count = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.address = ""
        #: Where its ``/stat.json`` is (a fixed port: a front end serving
        #: afresh serves its metrics again on the same address).
        self.metrics_port = 0

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> str:
        self.count += 1
        data_dir = self.directory / f"front-end-{self.count}"
        log = self.directory / "front-end.log"
        port = free_port()
        command = [sys.executable, "-m", "broker", "--log-level", "WARNING", "serve"]
        command += ["--listen", "127.0.0.1:0", "--metrics-listen", f"127.0.0.1:{port}"]
        command += ["--data-dir", str(data_dir), "--cluster", ",".join(self.servers.urls)]
        with open(log, "ab") as errors:
            process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=errors)
        assert process.stdout is not None
        line = process.stdout.readline().decode()
        metrics = process.stdout.readline().decode()
        if "listening on" not in line or "metrics on" not in metrics:
            process.kill()
            process.wait()
            raise RuntimeError(
                f"front end did not start: {line!r} {metrics!r}: {log.read_text()[-2000:]}"
            )
        self.process = process
        self.address = line.split("listening on", 1)[1].strip()
        self.metrics_port = port
        return self.address

    def kill(self) -> None:
        if self.process is not None:
            if self.process.poll() is None:
                os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait()
            if self.process.stdout is not None:
                self.process.stdout.close()

    def stop(self) -> None:
        if self.process is not None:
            if self.process.poll() is None:
                self.process.kill()
            self.process.wait()
            if self.process.stdout is not None:
                self.process.stdout.close()


@contextmanager
def front_end(servers: NatsServers, directory: Path) -> Iterator[FrontEnd]:
    front = FrontEnd(servers, directory)
    front.start()
    try:
        yield front
    finally:
        front.stop()


class Publisher:
    """Publishes numbered records in flushed batches until told to stop;
    what a flush returned for is confirmed. One client with one session
    throughout: if its connection is lost it connects again (to wherever
    the front end listens then, as behind a Kubernetes Service) and resumes
    its session, sending again what the broker did not have."""

    def __init__(self, front: FrontEnd, *others: FrontEnd, batch: int = BATCH) -> None:
        self.front = front
        #: Records published between two flushes.
        self.batch = batch
        #: Front ends behind the same "Service": the first alive is used.
        self.fronts = (front, *others)
        self.published = 0
        self.confirmed = 0
        #: Times the front end did not know the session on a reconnect.
        self.sessions_lost = 0
        #: When each batch was confirmed (trio time).
        self.confirm_times: list[float] = []
        self.stop = trio.Event()
        #: Set once it stopped (its last batch confirmed, its client closed).
        self.finished = trio.Event()
        self._confirmed = trio.Event()

    async def wait_confirmed(self, count: int) -> None:
        """Until at least ``count`` records are confirmed."""
        while self.confirmed < count:
            await self._confirmed.wait()
            self._confirmed = trio.Event()

    async def _connect(self) -> trio.abc.Stream:
        live = [f for f in self.fronts if f.process is not None and f.process.poll() is None]
        host, port = (live or [self.front])[0].address.rsplit(":", 1)
        return await trio.open_tcp_stream(host, int(port))

    def _lost(self) -> None:
        self.sessions_lost += 1

    async def run(self) -> None:
        try:
            await self._run()
        finally:
            self.finished.set()

    async def _run(self) -> None:
        batch = self.batch
        async with open_client(
            self.front.address,
            name=PUBLISHER,
            reconnect=RECONNECT,
            open_stream=self._connect,
            on_session_lost=self._lost,
        ) as client:
            while not self.stop.is_set():
                first = self.confirmed
                for number in range(first, first + batch):
                    await client.publish(TOPIC, payload(number))
                self.published = max(self.published, first + batch)
                await client.flush()
                self.confirmed = first + batch
                self.confirm_times.append(trio.current_time())
                self._confirmed.set()


async def read_back(address: str) -> list[bytes]:
    """Every record of the topic from the first, up to an end marker."""
    async with open_client(address, name="faults-reader") as client:
        await client.publish(TOPIC, b"end")
        await client.flush()
        got: list[bytes] = []
        async with client.subscribe(TOPIC, options={"from": "earliest"}) as subscription:
            async for message in subscription:
                if message.payload == b"end":
                    return got
                got.append(message.payload)
    return got


async def _thread(function: object, *args: object) -> object:
    return await trio.to_thread.run_sync(function, *args)  # type: ignore[arg-type]


async def inject(fault: str, servers: NatsServers, front: FrontEnd, rng: random.Random) -> None:
    if fault == "front-end-failover":
        front.kill()  # (the other goes on: nothing to wait for)
        return
    """Do ``fault`` and undo it (servers restarted and ready again)."""
    leader = await trio.to_thread.run_sync(servers.wait_for_leader_of, stream_name(TOPIC))
    if fault == "leader-kill":
        leader.kill()
        await trio.sleep(rng.uniform(1.0, 6.0))
        await trio.to_thread.run_sync(leader.restart)
    elif fault == "leader-pause":
        leader.pause()
        await trio.sleep(10.0)
        leader.resume()
    elif fault == "two-down":
        others = [server for server in servers if server is not leader]
        down = [leader, rng.choice(others)]
        for server in down:
            server.kill()
        await trio.sleep(5.0)
        for server in down:
            await trio.to_thread.run_sync(server.restart)
    elif fault == "all-restart":
        for server in servers:
            server.kill()
        await trio.sleep(rng.uniform(0.2, 2.0))
        for server in servers:
            server.start()
    elif fault == "front-end-kill":
        front.kill()
        await trio.to_thread.run_sync(front.start)
    else:
        raise ValueError(f"no fault {fault!r}: one of {', '.join(FAULTS)}")
    await trio.to_thread.run_sync(servers.wait_ready)


async def run_schedule(
    seed: int, fault: str, directory: Path, min_records: int = 100_000, batch: int = BATCH
) -> Outcome:
    """One schedule: a cluster and a front end of its own in ``directory``;
    publishing (flushing every ``batch`` records) goes on after the fault
    until ``min_records`` are confirmed; each hop's debt sampled throughout."""
    rng = random.Random(seed)
    outcome = Outcome(seed, fault)
    started = time.monotonic()
    with (
        open_nats_servers(
            directory / "nats", 3, system_account=True, app_jsz_import=True
        ) as servers,
        ExitStack() as stack,
    ):
        front = stack.enter_context(front_end(servers, directory))
        others = []
        if fault == "front-end-failover":
            (directory / "other").mkdir()
            others.append(stack.enter_context(front_end(servers, directory / "other")))
        publisher = Publisher(front, *others, batch=batch)
        fronts = [front, *others]
        debt = HopDebt(TOPIC, PUBLISHER, payload(0))
        sampling = trio.CancelScope()

        async def sample_debt() -> None:
            with sampling:
                await sample(debt, lambda: [f.metrics_port for f in fronts if f.alive])

        with trio.fail_after(DEADLINE):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(sample_debt)
                nursery.start_soon(publisher.run)
                await publisher.wait_confirmed(batch)  # (the stream exists)
                assert front.process is not None
                baseline = {"pid": front.process.pid, "rss": rss_anon_mib(front.process.pid)}

                watching = trio.CancelScope()

                async def watch_memory() -> None:
                    with watching:
                        while True:
                            process = front.process
                            if process is not None and process.pid == baseline["pid"]:
                                grown = rss_anon_mib(process.pid) - baseline["rss"]
                                outcome.rss_anon_growth_mib = max(
                                    outcome.rss_anon_growth_mib, grown
                                )
                            await trio.sleep(0.2)

                nursery.start_soon(watch_memory)
                await trio.sleep(rng.uniform(1.0, 4.0))
                fault_at = trio.current_time()
                await inject(fault, servers, front, rng)
                await publisher.wait_confirmed(publisher.confirmed + 2 * batch)
                await trio.sleep(rng.uniform(1.0, 3.0))
                await publisher.wait_confirmed(min_records)
                publisher.stop.set()
                watching.cancel()
                await publisher.finished.wait()
                # (Samples with nothing left to send, past the metrics'
                # 1 s cache: what each front end held from the start.)
                await trio.sleep(1.5)
                sampling.cancel()
            times = publisher.confirm_times
            before = [t for t in times if t <= fault_at][-1:]
            after = [t for t in times if t > fault_at]
            outcome.stalled_s = max(
                (b - a for a, b in zip(before + after, after, strict=False)), default=0.0
            )
            got = await read_back((others or [front])[0].address)
    outcome.hops = debt.hops()
    outcome.stat_samples = debt.taken
    outcome.stat_failed = debt.failed
    if debt.unknown_epochs:
        outcome.notes.append(
            f"records not stored unknown for {debt.unknown_epochs} restored broker(s)"
        )
    outcome.published = publisher.published
    outcome.confirmed = publisher.confirmed
    outcome.sessions_lost = publisher.sessions_lost
    outcome.read = len(got)
    numbers = [int(record[:10]) for record in got]
    seen: set[int] = set()
    last = -1
    for number in numbers:
        if number in seen:
            outcome.duplicated += 1
            continue
        seen.add(number)
        if number < last:
            outcome.out_of_order += 1
        last = max(last, number)
    outcome.lost = sum(1 for number in range(publisher.confirmed) if number not in seen)
    bad = [record for record in got if record != payload(int(record[:10]))]
    if bad:
        outcome.notes.append(f"{len(bad)} records with foreign bytes")
        outcome.duplicated += len(bad)
    outcome.seconds = time.monotonic() - started
    return outcome


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=10, help="schedules to run")
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("--fault", choices=FAULTS, help="only this fault (default: in turn)")
    parser.add_argument(
        "--records", type=int, default=100_000, help="least records confirmed per schedule"
    )
    parser.add_argument(
        "--batch", type=int, default=BATCH, help="records the publisher sends between flushes"
    )
    args = parser.parse_args(argv)
    failed = 0
    totals = {"confirmed": 0, "read": 0, "lost": 0, "duplicated": 0, "sessions_lost": 0}
    hops = {name: HopSummary() for name in HOPS}
    for index in range(args.seeds):
        seed = args.first_seed + index
        fault = args.fault or FAULTS[seed % len(FAULTS)]
        with tempfile.TemporaryDirectory(prefix=f"faults-{seed}-") as directory:
            outcome = trio.run(run_schedule, seed, fault, Path(directory), args.records, args.batch)
        failed += not outcome.ok
        for key in totals:
            totals[key] += getattr(outcome, key)
        for name, hop in outcome.hops.items():
            hops[name].add(hop)
        print(json.dumps({**asdict(outcome), "exceeded": outcome.exceeded}), flush=True)
    summary = {name: asdict(hop) for name, hop in hops.items()}
    print(
        json.dumps({"schedules": args.seeds, "failed": failed, **totals, "hops": summary}),
        flush=True,
    )
    return 1 if failed else 0


@dataclass
class HopSummary:
    """One hop over several schedules."""

    #: The most seen in any schedule, and the largest bound.
    most: int = 0
    bound: int | None = None
    #: Schedules that sampled it (it had something in it), and that exceeded it.
    schedules: int = 0
    exceeded: int = 0

    def add(self, hop: Hop) -> None:
        if not hop.samples:
            return
        self.schedules += 1
        self.exceeded += hop.exceeded
        self.most = max(self.most, hop.most)
        if hop.bound is not None:
            self.bound = hop.bound if self.bound is None else max(self.bound, hop.bound)


if __name__ == "__main__":
    sys.exit(main())
