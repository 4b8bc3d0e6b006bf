"""Count messages lost, duplicated or reordered across ``kill -9`` of the broker (issue 46).

Each run starts ``broker serve`` on a fresh data directory (``--workers N``:
a supervisor and N workers), a reliable subscriber that reads the topic from
its first record, paced to ``--sub-rate`` messages a second (15,000; by a
clock schedule, in chunks), and a publisher that publishes consecutive
integers (``b"<i> "`` padded to ``--payload`` bytes) to the same topic as
fast as it can. Both are of the ``--client`` kind (``async``: ``open_client``
in one trio run; ``blocking``: ``BlockingClient`` in two threads), with
``reconnect`` (30 s) and the broker's ``lease`` at 30 s. Then ``--kills``
times, once traffic flows (both clients made progress since the last start,
and on a single broker both reconnected),
it waits a random 0.3-1.5 s and sends SIGKILL: to the broker, started again
on the same data directory and port ``--restart-delay`` (1 s) later, or,
with ``--workers``, to the worker that owns the topic, which the supervisor
starts again by itself.

After the last kill the publisher stops and flushes (everything it published
is then confirmed), the subscriber's pacing is lifted, and the subscriber
reads up to the end of the topic's log. At the subscriber it counts ``lost``
(confirmed values never received), ``duplicated`` (values received more than
once; ``redelivered``: deliveries of a log offset not past the one before,
the same record again rather than a value stored twice), ``reordered``
(values lower than one received before, duplicates not counted); then a
fresh client reads the log from its first record: ``log_duplicates`` (values
stored more than once) and ``log_missing`` (confirmed values not stored).
The clients' resume statistics are printed too. Exit status 1 if anything
was lost, duplicated or reordered (at the subscriber or in the log), or if a
client raised or the run stalled.

    python tests/measure/crash_duplicates.py --client async --kills 20
    python tests/measure/crash_duplicates.py --client blocking --kills 20
    python tests/measure/crash_duplicates.py --client async --workers 2 --kills 10
    python tests/measure/crash_duplicates.py --client blocking --kills 3 --json
    python tests/measure/crash_duplicates.py --cluster nats://127.0.0.1:4222,... --kills 10

With ``--cluster`` the broker is a cluster-mode front end over those NATS
servers (restarted on the same data directory: its sessions survive, its
records are in the streams).
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import trio

from broker.client import BlockingClient, open_client
from broker.protocol import owner_id

try:
    from ._process import free_port, wait_listening
except ImportError:  # run as a script: tests/measure is sys.path[0]
    from _process import free_port, wait_listening  # type: ignore[no-redef,import-not-found]

TOPIC = "crash"
#: Values one duplicate-run record may cover before a new one starts (report size).
MAX_RUNS = 200
#: Seconds the pacer may fall behind its schedule before it starts a new one
#: (no burst to catch up after the broker was down).
PACE_SLACK = 0.05
#: Messages the subscriber takes at most at once (and the pacer's chunk).
CHUNK = 150
#: Statistics keys printed per client (``duplicates_dropped`` where the clients have it).
STAT_KEYS = ("resumes", "frames_resent_on_resume", "sessions_lost", "duplicates_dropped")
#: After a kill, traffic "flows" once the publisher published this many more
#: messages (more than the guarantees it may hold from before the kill)...
FLOW_PUBLISHED = 3000
#: ... and the subscriber received this many more.
FLOW_RECEIVED = 100
#: Hang guards (seconds): a broker or worker coming up, traffic flowing again
#: after a kill, the publisher's final flush, the subscriber going quiet at the end.
UP_GUARD = 60.0
FLOW_GUARD = 90.0
FLUSH_GUARD = 90.0
SETTLE = 20.0


@dataclass
class Settings:
    """One run's parameters (the command's options)."""

    client: str = "async"
    kills: int = 20
    workers: int = 1
    min_delay: float = 0.3
    max_delay: float = 1.5
    restart_delay: float = 1.0
    sub_rate: float = 15_000.0
    pub_rate: float = 0.0  # 0: flat out
    payload: int = 100
    reconnect: float = 30.0
    lease: float = 30.0
    seed: int | None = None
    keep: bool = False
    quiet: bool = False
    #: Cluster mode: the NATS servers' URLs (``--cluster``); "": a standalone broker.
    cluster: str = ""
    cluster_replicas: int = 3


@dataclass
class Result:
    """What one run came to."""

    client: str
    workers: int
    kills: int = 0
    published: int = 0
    confirmed: int = 0
    received: int = 0
    lost: int = 0
    duplicated: int = 0
    extra_deliveries: int = 0
    reordered: int = 0
    #: Deliveries whose log offset was not past the one before (the same record
    #: again), as opposed to a value stored twice.
    redelivered: int = 0
    unconfirmed_received: int = 0
    log_records: int = 0
    log_duplicates: int = 0
    log_missing: int = 0
    log_reordered: int = 0
    seconds: float = 0.0
    seed: int = 0
    publisher: dict[str, int] = field(default_factory=dict)
    subscriber: dict[str, int] = field(default_factory=dict)
    #: ``[first, last, kill]`` of each run of consecutive values delivered
    #: again at the subscriber (stored again in the log), ``kill`` the number
    #: of the kill they were published before.
    duplicate_runs: list[list[int]] = field(default_factory=list)
    log_duplicate_runs: list[list[int]] = field(default_factory=list)
    #: Values stored more than once, per kill (from the log; index 0: kill 1).
    log_duplicates_per_kill: list[int] = field(default_factory=list)
    #: Where the clients were connected (``--workers``): ``{"pub": "w1 (owner)", ...}``.
    placement: dict[str, str] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    broker_log: list[str] = field(default_factory=list)

    @property
    def bad(self) -> bool:
        """Anything lost, duplicated or reordered, or the run did not complete."""
        counts = (self.lost, self.duplicated, self.reordered, self.log_duplicates, self.log_missing)
        return any(counts) or bool(self.errors)


def payload_of(value: int, size: int) -> bytes:
    head = b"%d " % value
    return head + b"." * max(0, size - len(head))


def value_of(payload: bytes) -> int:
    return int(payload[: payload.index(b" ")])


class Tally:
    """Values as they arrive: distinct, repeated, out of order.

    ``seen[v]`` is 0 (never), 1 (once) or 2 (more than once)."""

    def __init__(self) -> None:
        self.seen = bytearray()
        self.received = 0
        self.distinct = 0
        self.duplicated = 0  # values received more than once
        self.extra = 0  # deliveries beyond the first of their value
        self.reordered = 0
        self.highest = -1
        self.last_offset = -1
        self.offset_repeats = 0  # deliveries of an offset not past the one before
        self.runs: list[list[int]] = []

    def take(self, value: int, offset: int | None) -> None:
        self.received += 1
        if offset is not None:
            if offset <= self.last_offset:
                self.offset_repeats += 1
            self.last_offset = offset
        seen = self.seen
        if value >= len(seen):
            seen.extend(bytes(value - len(seen) + 65536))
        if seen[value]:
            self.extra += 1
            if seen[value] == 1:
                self.duplicated += 1
                seen[value] = 2
            last = self.runs[-1] if self.runs else None
            if last is not None and last[1] + 1 == value:
                last[1] = value
            elif len(self.runs) < MAX_RUNS:
                self.runs.append([value, value])
            return
        seen[value] = 1
        self.distinct += 1
        if value < self.highest:
            self.reordered += 1
        else:
            self.highest = value

    def missing_below(self, count: int) -> int:
        """How many of ``0 .. count - 1`` never arrived."""
        head = self.seen[:count]
        return count - len(head) + head.count(0)


class Pacer:
    """At most ``rate`` a second, by a schedule on the monotonic clock
    (0: no pacing). ``delay(n)`` is how long to sleep after ``n`` more."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.next: float | None = None

    def delay(self, count: int) -> float:
        if self.rate <= 0:
            return 0.0
        now = time.monotonic()
        if self.next is None or self.next < now - PACE_SLACK:
            self.next = now
        self.next += count / self.rate
        return max(0.0, self.next - now)


class Shared:
    """What the client threads and the kill loop share (plain attributes
    under the GIL; each is written by one thread)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.tally = Tally()
        self.published = 0
        self.kills = 0
        #: ``published`` at each kill (the values of kill k are below its point).
        self.kill_points: list[int] = []
        self.subscribed = threading.Event()
        self.stop_publishing = False
        self.publisher_done = threading.Event()
        self.subscriber_done = threading.Event()
        self.paced = True
        self.log_end: int | None = None  # the topic's end offset once publishing stopped
        self.abort = False
        self.pub_stats: dict[str, int] = {}
        self.sub_stats: dict[str, int] = {}
        self.errors: list[str] = []
        self.cancel: Callable[[], None] | None = None

    def failed(self, role: str, error: BaseException) -> None:
        self.errors.append(
            f"{role} raised after {self.kills} kills: {type(error).__name__}: {error}"
        )

    def finished_reading(self) -> bool:
        end = self.log_end
        return end is not None and self.tally.last_offset >= end - 1

    def resumed(self) -> int:
        """Reconnections both clients completed (resumed or not), the lesser."""
        counts = [
            s.get("resumes", 0) + s.get("sessions_lost", 0)
            for s in (self.pub_stats, self.sub_stats)
        ]
        return min(counts)


# ---------------------------------------------------------------- clients


async def async_clients(url: str, shared: Shared) -> None:
    """A publisher and a paced subscriber, trio clients, until told to stop."""
    settings = shared.settings
    subscribed = trio.Event()  # (then the publisher starts)

    async def publisher() -> None:
        try:
            async with open_client(url, name="crash-pub", reconnect=settings.reconnect) as client:
                pacer = Pacer(settings.pub_rate)
                value = 0
                while not shared.stop_publishing:
                    await client.publish(TOPIC, payload_of(value, settings.payload))
                    value += 1
                    shared.published = value
                    if value % 1000 == 0:
                        shared.pub_stats = client.statistics()
                    if settings.pub_rate and value % 100 == 0:
                        await trio.sleep(pacer.delay(100))
                with trio.fail_after(FLUSH_GUARD):
                    await client.flush()
                shared.pub_stats = client.statistics()
        except Exception as error:
            shared.failed("publisher", error)
        finally:
            shared.publisher_done.set()

    async def subscriber() -> None:
        tally = shared.tally
        try:
            async with (
                open_client(url, name="crash-sub", reconnect=settings.reconnect) as client,
                client.subscribe(TOPIC, start="earliest") as subscription,
            ):
                shared.subscribed.set()
                subscribed.set()
                pacer = Pacer(settings.sub_rate)
                quiet_since = time.monotonic()
                while not shared.abort:
                    batch = []
                    with trio.move_on_after(0.5):
                        batch = await subscription.receive_batch(CHUNK)
                    now = time.monotonic()
                    if batch:
                        quiet_since = now
                        for message in batch:
                            tally.take(value_of(message.payload), message.offset)
                        shared.sub_stats = client.statistics()
                    if shared.finished_reading():
                        break
                    if shared.publisher_done.is_set() and now - quiet_since > SETTLE:
                        break
                    if shared.paced and batch:
                        await trio.sleep(pacer.delay(len(batch)))
                shared.sub_stats = client.statistics()
        except Exception as error:
            shared.failed("subscriber", error)
        finally:
            shared.subscribed.set()
            shared.subscriber_done.set()
            subscribed.set()

    async with trio.open_nursery() as nursery:
        token = trio.lowlevel.current_trio_token()
        shared.cancel = lambda: trio.from_thread.run_sync(
            nursery.cancel_scope.cancel, trio_token=token
        )
        nursery.start_soon(subscriber)
        await subscribed.wait()
        nursery.start_soon(publisher)


def blocking_publisher(url: str, shared: Shared) -> None:
    settings = shared.settings
    try:
        with BlockingClient(url, name="crash-pub", reconnect=settings.reconnect) as client:
            pacer = Pacer(settings.pub_rate)
            value = 0
            while not shared.stop_publishing and not shared.abort:
                try:
                    client.publish(TOPIC, payload_of(value, settings.payload), timeout=5)
                except TimeoutError:
                    continue  # (nothing published: try again, unless told to stop)
                value += 1
                shared.published = value
                if value % 1000 == 0:
                    shared.pub_stats = client.statistics()
                if settings.pub_rate and value % 100 == 0:
                    time.sleep(pacer.delay(100))
            client.flush(timeout=FLUSH_GUARD)
            shared.pub_stats = client.statistics()
    except Exception as error:
        shared.failed("publisher", error)
    finally:
        shared.publisher_done.set()


def blocking_subscriber(url: str, shared: Shared) -> None:
    settings = shared.settings
    tally = shared.tally
    try:
        with BlockingClient(url, name="crash-sub", reconnect=settings.reconnect) as client:
            subscription = client.subscribe(TOPIC, start="earliest", timeout=UP_GUARD)
            shared.subscribed.set()
            pacer = Pacer(settings.sub_rate)
            quiet_since = time.monotonic()
            while not shared.abort:
                try:
                    batch = subscription.receive_batch(CHUNK, timeout=0.5)
                except TimeoutError:
                    batch = []
                now = time.monotonic()
                if batch:
                    quiet_since = now
                    for message in batch:
                        tally.take(value_of(message.payload), message.offset)
                    shared.sub_stats = client.statistics()
                if shared.finished_reading():
                    break
                if shared.publisher_done.is_set() and now - quiet_since > SETTLE:
                    break
                if shared.paced and batch:
                    time.sleep(pacer.delay(len(batch)))
            subscription.close()
            shared.sub_stats = client.statistics()
    except Exception as error:
        shared.failed("subscriber", error)
    finally:
        shared.subscribed.set()
        shared.subscriber_done.set()


def start_clients(url: str, shared: Shared) -> list[threading.Thread]:
    """The publisher and the subscriber, running (daemon threads: a client
    that hangs does not keep the script alive)."""
    if shared.settings.client == "async":

        def run_trio() -> None:
            try:
                trio.run(async_clients, url, shared)
            except BaseException as error:  # what the run is about: report it
                shared.failed("trio clients", error)
                shared.publisher_done.set()
                shared.subscriber_done.set()
                shared.subscribed.set()

        threads = [threading.Thread(target=run_trio, name="trio-clients", daemon=True)]
    else:

        def publish_after_subscribed() -> None:
            if shared.subscribed.wait(UP_GUARD):
                blocking_publisher(url, shared)
            else:
                shared.publisher_done.set()

        threads = [
            threading.Thread(target=blocking_subscriber, args=(url, shared), daemon=True),
            threading.Thread(target=publish_after_subscribed, daemon=True),
        ]
    for thread in threads:
        thread.start()
    return threads


# ---------------------------------------------------------------- the broker


def pid_is_ours(pid: int, marker: bytes) -> bool:
    """Process ``pid`` exists and its command line contains ``marker``
    (so that a pid reused by another program is never signalled)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return marker in cmdline.read()
    except OSError:
        return False


class BrokerProcesses:
    """``broker serve`` (one process, or a supervisor and its workers) on a
    data directory; kills the process that holds the topic."""

    def __init__(self, settings: Settings, work: Path) -> None:
        self.settings = settings
        self.data = work / "data"
        self.log_path = work / "broker.log"
        self.port = free_port()
        self.metrics_port = free_port() if settings.workers > 1 else 0
        self.process: subprocess.Popen[bytes] | None = None
        self.worker_pids: set[int] = set()

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        metrics = f"127.0.0.1:{self.metrics_port}" if self.metrics_port else ""
        command = [sys.executable, "-m", "broker", "--log-level", "WARNING", "serve"]
        command += ["--listen", self.url, "--metrics-listen", metrics]
        command += ["--data-dir", str(self.data), "--set", f"lease={self.settings.lease:g}"]
        if self.settings.workers > 1:
            command += ["--workers", str(self.settings.workers)]
        if self.settings.cluster:
            command += ["--cluster", self.settings.cluster]
            command += ["--set", f"cluster_replicas={self.settings.cluster_replicas}"]
        return command

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.command(), stdout=log, stderr=log, stdin=subprocess.DEVNULL
            )
        if self.settings.workers > 1:
            self.workers_up()
        wait_listening(self.port)

    def stat(self) -> dict[str, Any]:
        url = f"http://127.0.0.1:{self.metrics_port}/stat.json"
        with urllib.request.urlopen(url, timeout=10) as answer:
            document: dict[str, Any] = json.load(answer)
        return document

    def workers_up(self, not_pid: int | None = None) -> list[dict[str, Any]]:
        """The workers, once every one is up (and the owner's pid is not ``not_pid``)."""
        deadline = time.monotonic() + UP_GUARD
        while True:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"the supervisor ended (status {self.process.returncode})")
            with contextlib.suppress(OSError, ValueError, KeyError):
                workers: list[dict[str, Any]] = self.stat()["workers"]
                for worker in workers:
                    if worker.get("pid"):
                        self.worker_pids.add(worker["pid"])
                if (
                    len(workers) == self.settings.workers
                    and all(w["up"] for w in workers)
                    and self.owner(workers)["pid"] != not_pid
                ):
                    return workers
            if time.monotonic() > deadline:
                raise TimeoutError(f"the workers were not all up within {UP_GUARD:g} s")
            time.sleep(0.1)

    @staticmethod
    def owner(workers: list[dict[str, Any]]) -> dict[str, Any]:
        owner = owner_id(TOPIC, [w["id"] for w in workers])
        return next(w for w in workers if w["id"] == owner)

    def owner_url(self) -> str:
        """Where the topic's log can be read and its offsets asked (the owner's direct address)."""
        if self.settings.workers == 1:
            return self.url
        address: str = self.owner(self.workers_up())["direct"]
        return address

    def placement(self) -> dict[str, str]:
        """Which worker each client's connection is at (``--workers``; the
        supervisor's document may be a second old: asked until both show)."""
        if self.settings.workers == 1:
            return {}
        where: dict[str, str] = {}
        deadline = time.monotonic() + 5
        while len(where) < 2 and time.monotonic() < deadline:
            document = self.stat()
            owner = self.owner(document["workers"])["id"]
            for connection in document["connections"]:
                name = connection.get("client", "")
                if name.startswith("crash-"):
                    worker = connection.get("worker", "?")
                    where[name[6:]] = worker + (" (owner)" if worker == owner else "")
            time.sleep(0.2)
        return where

    def kill(self) -> int:
        """SIGKILL the process that holds the topic (the broker, or the
        topic's owner among the workers); the pid killed."""
        assert self.process is not None
        if self.settings.workers == 1:
            pid = self.process.pid
            os.kill(pid, signal.SIGKILL)
            self.process.wait(UP_GUARD)
            return pid
        pid = int(self.owner(self.workers_up())["pid"])
        os.kill(pid, signal.SIGKILL)
        return pid

    def back(self, killed: int) -> None:
        """Have the killed process back: the single broker started again here
        on the same data directory and port, ``restart_delay`` later; a worker
        started again by its supervisor, waited for."""
        if self.settings.workers == 1:
            time.sleep(self.settings.restart_delay)
            self.start()
        else:
            self.workers_up(not_pid=killed)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL by pid whatever is left (the workers too)."""
        process = self.process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(30)
        for pid in self.worker_pids:
            if pid_is_ours(pid, b"broker.workers"):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def log_lines(self) -> list[str]:
        """The broker's log lines at WARNING or above, but for its banner."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return []
        return [line for line in text.splitlines() if line and not line.startswith(BANNER)]


BANNER = ("broker listening on", "metrics on", "2 workers", "3 workers", "4 workers")


# ---------------------------------------------------------------- reading the log


async def log_end(url: str) -> int:
    """The offset the topic's next record will get (asked of its owner)."""
    with trio.fail_after(UP_GUARD):
        async with open_client(url, name="crash-offsets") as client:
            first_end = (await client.offsets([TOPIC])).get(TOPIC, (0, 0))
    return first_end[1]


async def read_log(url: str, end: int, tally: Tally, guard: float) -> None:
    """Every record of the topic's log before offset ``end``, into ``tally``
    (TooSlowError after ``guard`` seconds)."""
    with trio.fail_after(guard):
        async with (
            open_client(url, name="crash-log") as client,
            client.subscribe(TOPIC, start="earliest") as subscription,
        ):
            while tally.last_offset < end - 1:
                for message in await subscription.receive_batch(4096):
                    tally.take(value_of(message.payload), message.offset)


# ---------------------------------------------------------------- a run


def with_kills(runs: list[list[int]], kill_points: list[int]) -> list[list[int]]:
    """``[first, last]`` runs of values as ``[first, last, kill]``: the kill
    whose point follows ``first`` (``len(kill_points) + 1``: after the last)."""
    return [[first, last, bisect.bisect_right(kill_points, first) + 1] for first, last in runs]


def say(settings: Settings, text: str) -> None:
    if not settings.quiet:
        print(text, flush=True)


def wait_for(condition: Callable[[], bool], guard: float, shared: Shared) -> bool:
    """Poll ``condition`` until it holds (True) or ``guard`` seconds pass or
    a client fails (False)."""
    deadline = time.monotonic() + guard
    while not condition():
        if shared.errors or time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def flowing(shared: Shared, kills: int) -> Callable[[], bool]:
    """Traffic flows since the ``kills``-th kill: both clients made progress
    (and, on a single broker, both reconnected that many times)."""
    published, received = shared.published, shared.tally.received
    single = shared.settings.workers == 1

    def check() -> bool:
        return (
            shared.published >= published + FLOW_PUBLISHED
            and shared.tally.received >= received + FLOW_RECEIVED
            and (not single or shared.resumed() >= kills)
        )

    return check


def measure(settings: Settings, base: Path | None = None) -> Result:
    """One run: start, kill ``settings.kills`` times under traffic, count.
    Its data directory and broker log are in a new directory in ``base``
    (None: the system's temporary directory), removed at the end unless
    ``settings.keep``. Never raises for what the broker or the clients do
    (``Result.errors`` says it); never waits without a bound."""
    seed = settings.seed if settings.seed is not None else random.randrange(2**32)
    rng = random.Random(seed)
    result = Result(settings.client, settings.workers, seed=seed)
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="crash-duplicates-", dir=base))
    broker = BrokerProcesses(settings, work)
    shared = Shared(settings)
    threads: list[threading.Thread] = []
    try:
        broker.start()
        threads = start_clients(broker.url, shared)
        if not wait_for(flowing(shared, 0), FLOW_GUARD, shared):
            shared.errors.append("traffic never flowed after the start")
        else:
            result.placement = broker.placement()
        for number in range(1, settings.kills + 1):
            if shared.errors:
                break
            time.sleep(rng.uniform(settings.min_delay, settings.max_delay))
            received = shared.tally.received
            killed_at = time.monotonic()
            pid = broker.kill()
            shared.kill_points.append(shared.published)
            shared.kills = number
            broker.back(pid)
            began = time.monotonic()
            if not wait_for(flowing(shared, number), FLOW_GUARD, shared):
                if not shared.errors:
                    shared.errors.append(
                        f"traffic did not flow again within {FLOW_GUARD:g} s after kill"
                        f" {number} (published {shared.published}, received"
                        f" {shared.tally.received}, client stats {shared.pub_stats}"
                        f" {shared.sub_stats})"
                    )
                break
            say(
                settings,
                f"  kill {number:2d}: pid {pid} at published {shared.kill_points[-1]},"
                f" received {received};"
                f" back {began - killed_at:.1f} s later, traffic flowing"
                f" {time.monotonic() - began:.1f} s after that",
            )
        result.kills = shared.kills
        shared.stop_publishing = True
        if not shared.publisher_done.wait(FLUSH_GUARD + UP_GUARD):
            shared.errors.append("the publisher did not finish (flush) in time")
        shared.paced = False
        if broker.process is not None and broker.process.poll() is None:
            try:
                shared.log_end = trio.run(log_end, broker.owner_url())
            except Exception as error:
                shared.failed("offsets", error)
        if not shared.subscriber_done.wait(SETTLE + FLOW_GUARD + shared.published / 20_000):
            shared.errors.append(
                f"the subscriber did not reach the log's end ({shared.log_end}) in time"
                f" (last offset {shared.tally.last_offset})"
            )
        shared.abort = True
        for thread in threads:
            thread.join(UP_GUARD)
            if thread.is_alive():
                shared.errors.append(f"client thread {thread.name} did not end")
        tally = shared.tally
        result.published = shared.published
        result.confirmed = shared.pub_stats.get("confirmed", 0)
        result.received = tally.received
        result.lost = tally.missing_below(result.confirmed)
        result.duplicated = tally.duplicated
        result.extra_deliveries = tally.extra
        result.reordered = tally.reordered
        result.redelivered = tally.offset_repeats
        result.unconfirmed_received = tally.distinct - (result.confirmed - result.lost)
        result.duplicate_runs = with_kills(tally.runs, shared.kill_points)
        result.publisher = {k: shared.pub_stats[k] for k in STAT_KEYS if k in shared.pub_stats}
        result.subscriber = {k: shared.sub_stats[k] for k in STAT_KEYS if k in shared.sub_stats}
        if shared.log_end is not None:
            stored = Tally()
            try:
                guard = FLOW_GUARD + shared.log_end / 20_000
                trio.run(read_log, broker.owner_url(), shared.log_end, stored, guard)
            except Exception as error:
                shared.failed("log reader", error)
            result.log_records = stored.received
            result.log_duplicates = stored.duplicated
            result.log_missing = stored.missing_below(result.confirmed)
            result.log_reordered = stored.reordered
            result.log_duplicate_runs = with_kills(stored.runs, shared.kill_points)
            per_kill = [0] * (len(shared.kill_points) + 1)
            for first, last, kill in result.log_duplicate_runs:
                per_kill[kill - 1] += last - first + 1
            result.log_duplicates_per_kill = per_kill[: len(shared.kill_points)]
    except Exception as error:
        shared.failed("harness", error)
    finally:
        shared.stop_publishing = shared.abort = True
        if shared.cancel is not None:
            with contextlib.suppress(Exception):
                shared.cancel()
        broker.stop()
        result.broker_log = broker.log_lines()
        if settings.keep:
            say(settings, f"  kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    result.errors = list(shared.errors)
    result.seconds = round(time.monotonic() - started, 1)
    return result


# ---------------------------------------------------------------- output

COLUMNS = (
    "kills", "published", "confirmed", "received", "lost", "duplicated", "reordered",
    "log_duplicates", "log_missing",
)  # fmt: skip


def summary(number: int, result: Result) -> str:
    line = (
        f"run {number}: {result.client}, workers {result.workers}, kills {result.kills},"
        f" published {result.published}, confirmed {result.confirmed}, received"
        f" {result.received}: lost {result.lost}, duplicated {result.duplicated}"
        f" ({result.extra_deliveries} deliveries, {result.redelivered} of an offset again),"
        f" reordered {result.reordered},"
        f" unconfirmed received {result.unconfirmed_received}; log: {result.log_records}"
        f" records, duplicates {result.log_duplicates}, missing {result.log_missing};"
        f" pub {result.publisher}, sub {result.subscriber}; {result.seconds:.0f} s,"
        f" seed {result.seed}"
    )
    if result.placement:
        line += f"; at {result.placement}"
    return line


def table(results: list[Result]) -> str:
    rows = [["run", "client", *COLUMNS]]
    for number, result in enumerate(results, 1):
        rows.append([str(number), result.client, *(str(getattr(result, c)) for c in COLUMNS)])
    if len(results) > 1:
        totals = [str(sum(getattr(r, c) for r in results)) for c in COLUMNS]
        rows.append(["all", "", *totals])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in rows
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--client", choices=("async", "blocking"), default="async")
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--sub-rate", type=float, default=15_000.0, help="messages/s (0: unpaced)")
    parser.add_argument("--pub-rate", type=float, default=0.0, help="messages/s (0: flat out)")
    parser.add_argument("--payload", type=int, default=100, help="bytes per message")
    parser.add_argument("--min-delay", type=float, default=0.3)
    parser.add_argument("--max-delay", type=float, default=1.5)
    parser.add_argument("--restart-delay", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the data directory and log")
    parser.add_argument("--json", action="store_true", help="print the results as JSON only")
    parser.add_argument("--verbose", action="store_true", help="show the clients' log lines")
    parser.add_argument(
        "--cluster", default="", help="cluster mode: the NATS servers (nats://HOST:PORT,...)"
    )
    parser.add_argument("--cluster-replicas", type=int, default=3)
    args = parser.parse_args()
    if not args.verbose:  # (two lines per kill saying they reconnect)
        logging.getLogger("broker.client").setLevel(logging.ERROR)
    results = []
    for number in range(1, args.runs + 1):
        settings = Settings(
            client=args.client,
            kills=args.kills,
            workers=args.workers,
            min_delay=args.min_delay,
            max_delay=args.max_delay,
            restart_delay=args.restart_delay,
            sub_rate=args.sub_rate,
            pub_rate=args.pub_rate,
            payload=args.payload,
            seed=None if args.seed is None else args.seed + number - 1,
            keep=args.keep,
            quiet=args.json,
            cluster=args.cluster,
            cluster_replicas=args.cluster_replicas,
        )
        result = measure(settings)
        results.append(result)
        if not args.json:
            print(summary(number, result), flush=True)
            for error in result.errors:
                print(f"  error: {error}")
            for line in result.broker_log[:10]:
                print(f"  broker: {line}")
            if result.log_duplicate_runs:
                runs = result.log_duplicate_runs
                print(f"  stored twice [first, last, kill]: {runs[:10]}{' ...' * (len(runs) > 10)}")
                print(f"  stored twice per kill: {result.log_duplicates_per_kill}")
    if args.json:
        print(json.dumps([asdict(r) for r in results], indent=1))
    else:
        print(table(results))
    sys.exit(1 if any(r.bad for r in results) else 0)


if __name__ == "__main__":
    main()
