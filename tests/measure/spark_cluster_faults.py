"""Spark exactly-once across a stream-leader kill and a front-end kill.

Three ``nats-server``s (a JetStream cluster, the topic's stream R3) and a
cluster-mode front end (``broker serve --cluster``) on a data directory. A
Structured Streaming query reads ``--rows`` numbered rows (``b"<i> "``
padded to 100 bytes) from text files, one file a micro-batch
(``--batches``), repartitioned to two tasks, and writes them to one topic
through the broker's Spark sink with ``broker.delivery = "exactly-once"``:
every micro-batch is staged by its tasks and made visible by the driver's
commit, so commits happen all through the job. The files are moved into
the query's input two micro-batches ahead of what it has committed, so the
job never idles, nor runs past a fault while the harness handles it.

The faults, triggered by the topic's stored record count (the front end's
offsets, asked every few milliseconds), never by a sleep:

1. once about ``--leader-at`` of the rows are stored, while a commit routes
   (the stored count is not a whole number of micro-batches), ``kill -9``
   of the stream's leader ``nats-server``; it is started again a seeded
   1-6 s later;
2. once about ``--front-end-at`` of the rows are stored, while a commit
   routes (``--front-end-kill-during staging``: while the tasks stage rows
   and no commit routes), ``kill -9`` of the front end, started again on
   the same data directory (``--new-disk``: a new, empty one) and port
   ``--restart-delay`` later. The tasks' and the driver's clients
   reconnect and resume their sessions (``broker.reconnect``); a query
   that fails anyway is started again from its checkpoint, as a streaming
   job is (``query_runs``).

Then every record of the topic is read back from its first offset and
counted: ``lost`` (rows never stored), ``duplicated`` (rows stored more than
once), ``foreign`` (records that are no row of the job), and where
(``lost_runs``, ``wrong_by_batch``). Prints one JSON line per seed; exit
status 1 if anything was lost or duplicated, a fault did not happen, or the
job did not finish.

    python -m tests.measure.spark_cluster_faults --rows 100000 --seed 1 --seeds 2
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import logging
import random
import re
import shutil
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from broker.client import BlockingClient
from broker.nats._servers import NatsServers, open_nats_servers
from broker.server.storage._jetstream import stream_name

from ..spark.session import local_session
from ._process import free_port
from .crash_duplicates import BrokerProcesses, Tally, payload_of, value_of
from .crash_duplicates import Settings as BrokerSettings

TOPIC = "spark.faults"
PAYLOAD = 100
#: Hang guards (seconds): the whole job, one wait for a fault's trigger.
JOB_GUARD = 900.0
TRIGGER_GUARD = 300.0
#: Seconds between two asks of the topic's stored count.
POLL = 0.005
#: Times the streaming query may be started again from its checkpoint.
QUERY_RUNS = 5
#: Micro-batches of input the query may have beyond what it committed.
AHEAD = 2
#: Micro-batches of input held back until both faults are done.
HELD = 2


@dataclass
class Settings:
    rows: int = 100_000
    #: Micro-batches (one input file each, two tasks).
    batches: int = 20
    seed: int = 1
    #: Fractions of the rows stored before each fault (seeded around them).
    leader_at: float = 0.25
    front_end_at: float = 0.6
    #: When the front end is killed: "commit" (while a commit routes) or
    #: "staging" (while the tasks stage rows, between two commits).
    front_end_kill_during: str = "commit"
    restart_delay: float = 1.0
    #: The front end is started again on a new, empty data directory (a
    #: machine replaced), not on its own.
    new_disk: bool = False
    lease: float = 30.0
    keep: bool = False


@dataclass
class Fault:
    """When one fault hit (seconds from the job's start) and what it did."""

    #: Rows stored (the topic's end) when the trigger fired, and the
    #: micro-batch boundary it was past: a commit was routing if not whole.
    stored_at_trigger: int = -1
    during_commit: bool = False
    at_s: float = -1.0
    #: The stream leader (leader kill) or the front end's pid, before and after.
    before: str = ""
    after: str = ""
    #: Seconds the killed process was down (until started again and ready).
    down_s: float = 0.0
    #: The longest time the topic did not grow from the kill on (until the
    #: next fault, or the job's end): an election, a front end restarting
    #: (and, at most a few seconds, a micro-batch's staging).
    stalled_s: float = 0.0


@dataclass
class Result:
    seed: int
    rows: int
    batches: int
    #: The front end was started again on a new data directory.
    new_disk: bool = False
    read: int = 0
    lost: int = 0
    duplicated: int = 0
    foreign: int = 0
    #: ``[first, last]`` of each run of rows lost or stored twice (the first 50).
    lost_runs: list[list[int]] = field(default_factory=list)
    #: ``[first, last]`` of each range of offsets the topic skips.
    offset_gaps: list[list[int]] = field(default_factory=list)
    #: The topic's first and end offsets.
    offsets: list[int] = field(default_factory=list)
    #: Rows lost or stored twice, per micro-batch (its number: row // rows per batch).
    wrong_by_batch: dict[str, int] = field(default_factory=dict)
    #: Seconds from the query's first start to its end (all runs).
    job_s: float = 0.0
    #: Times the streaming query was started (1: it never failed).
    query_runs: int = 0
    leader_kill: Fault = field(default_factory=Fault)
    front_end_kill: Fault = field(default_factory=Fault)
    #: From the restarted front end: staged bytes and commits it restored
    #: from its journal (cut off by the kill), and commits answered
    #: "duplicate" (the driver's commit sent again).
    staged_bytes_at_start: int = -1
    commits_completed_at_start: int = -1
    duplicate_commits: int = -1
    #: Staged batches a commit read from the cluster's staging stream (those
    #: staged before a front end on a new disk: not held there).
    staged_batches_read: int = -1
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)
    query_errors: list[str] = field(default_factory=list)
    front_end_log: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (
            not (self.lost or self.duplicated or self.foreign or self.errors)
            and self.read == self.rows
            and self.leader_kill.before != ""
            and self.leader_kill.after not in ("", self.leader_kill.before)
            and self.front_end_kill.after not in ("", self.front_end_kill.before)
        )


def spark_session() -> Any:
    """A local Spark session (two cores, four attempts per task) with the
    broker's data source registered."""
    return local_session("spark-cluster-faults", attempts=4)


class Feed:
    """The job's input: one text file of consecutive rows per micro-batch,
    written aside and moved into the source directory (atomically) by a
    thread, ``AHEAD`` micro-batches ahead of what the query has committed
    (its checkpoint's commit log), so that the job is never idle but never
    runs past a fault: the harness pauses the feed while it handles one,
    and the last ``HELD`` files wait until both faults are done."""

    def __init__(self, directory: Path, rows: int, batches: int) -> None:
        self.source = directory / "input"
        self.checkpoint = directory / "checkpoint"
        aside = directory / "input-aside"
        self.source.mkdir(parents=True)
        aside.mkdir(parents=True)
        self.per_batch = -(-rows // batches)
        self.files: list[Path] = []
        for index in range(batches):
            first = index * self.per_batch
            values = range(first, min(rows, first + self.per_batch))
            path = aside / f"part-{index:05d}.txt"
            path.write_text("".join(payload_of(v, PAYLOAD).decode() + "\n" for v in values))
            self.files.append(path)
        self.released = 0
        self.paused = threading.Event()
        self.faults_done = threading.Event()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="feed", daemon=True)
        self.thread.start()

    def committed(self, batch: int) -> bool:
        """The query has committed micro-batch ``batch`` (its checkpoint says so)."""
        return (self.checkpoint / "commits" / str(batch)).exists()

    def all_committed(self) -> bool:
        return self.committed(len(self.files) - 1)

    def _run(self) -> None:
        for index, path in enumerate(self.files):
            while not self.stopping.is_set():
                if (
                    not self.paused.is_set()
                    and (index < AHEAD or self.committed(index - AHEAD))
                    and (index < len(self.files) - HELD or self.faults_done.is_set())
                ):
                    break
                time.sleep(0.01)
            if self.stopping.is_set():
                return
            path.rename(self.source / path.name)
            self.released = index + 1

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(30)


def describe(error: BaseException) -> str:
    """An exception in a few lines (a Java one without its stack frames)."""
    text = str(error)
    if hasattr(error, "java_exception"):  # (py4j's: the message is in the Java object)
        text = f"{text} {error.java_exception}"
    lines = [line.strip() for line in text.splitlines()]
    kept = [line for line in lines if line and not line.startswith("at ")]
    return " | ".join(kept[:4])[:600]


class Job:
    """The streaming query (one file a micro-batch, two tasks each), in a
    thread, until every file is committed: started again from its checkpoint
    when it fails (at most ``QUERY_RUNS`` times), as a streaming job is."""

    def __init__(self, spark: Any, feed: Feed, address: str) -> None:
        self.spark = spark
        self.feed = feed
        self.address = address
        self.runs = 0
        self.errors: list[str] = []
        self.finished = threading.Event()
        self.succeeded = False
        self.started = 0.0
        self.ended = 0.0
        self.query: Any = None
        self.stopping = False
        self.thread = threading.Thread(target=self._run, name="spark-job", daemon=True)

    def start(self) -> None:
        self.started = time.monotonic()
        self.thread.start()

    def _start_query(self) -> Any:
        # (The data source registered in this session is looked up in the
        # JVM thread's active session: make it this one in this thread.)
        self.spark._get_j_spark_session_class(self.spark._jvm).setActiveSession(
            self.spark._jsparkSession
        )
        reader = self.spark.readStream.format("text").option("maxFilesPerTrigger", 1)
        stream = reader.load(str(self.feed.source)).repartition(2)
        return (
            stream.writeStream.format("broker")
            .option("broker.servers", self.address)
            .option("topic", TOPIC)
            .option("broker.delivery", "exactly-once")
            .option("broker.reconnect", "120")
            .option("broker.timeout", "120")
            .option("checkpointLocation", str(self.feed.checkpoint))
            .start()
        )

    def _run(self) -> None:
        deadline = time.monotonic() + JOB_GUARD
        try:
            while self.runs < QUERY_RUNS and not self.stopping:
                self.runs += 1
                self.query = query = self._start_query()
                while query.isActive and not self.feed.all_committed():
                    if time.monotonic() > deadline:
                        self.errors.append(f"run {self.runs}: not done after {JOB_GUARD:g} s")
                        query.stop()
                        return
                    try:
                        query.awaitTermination(0.05)
                    except Exception:  # (it failed: said below, and started again)
                        break
                if self.feed.all_committed():
                    self.succeeded = True
                    query.stop()
                    return
                exception = query.exception()
                what = describe(exception) if exception is not None else "it stopped"
                self.errors.append(f"run {self.runs}: {what}")
        except Exception as error:
            self.errors.append(f"job: {describe(error)}")
        finally:
            self.ended = time.monotonic()
            self.finished.set()

    def stop(self) -> None:
        self.stopping = True
        query = self.query
        if query is not None and query.isActive:
            with contextlib.suppress(Exception):
                query.stop()
        self.thread.join(60)


class FrontEnd(BrokerProcesses):
    """The cluster-mode front end of ``crash_duplicates`` (same data
    directory and port across restarts), logging at INFO (it says which
    commits it completes at start), with a metrics endpoint."""

    def __init__(self, servers: NatsServers, work: Path, lease: float, restart: float) -> None:
        settings = BrokerSettings(
            cluster=",".join(servers.urls), cluster_replicas=3, lease=lease, restart_delay=restart
        )
        super().__init__(settings, work)
        self.metrics_port = free_port()

    def command(self) -> list[str]:
        command = super().command()
        command[command.index("--log-level") + 1] = "INFO"
        return command

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def metric(self, name: str, **labels: str) -> int:
        """A counter of the running front end (0 if it has none yet)."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as answer:
            text = answer.read().decode()
        total = 0.0
        for line in text.splitlines():
            if not line.startswith(name):
                continue
            head, _, value = line.rpartition(" ")
            if head.split("{")[0] == name and all(f'{k}="{v}"' in head for k, v in labels.items()):
                total += float(value)
        return int(total)

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""


class Stored:
    """The topic's stored record count, asked of the front end every few
    milliseconds by a thread (a client made again whenever the front end
    went away); keeps when the count grew."""

    def __init__(self, front: FrontEnd) -> None:
        self.front = front
        self.client: BlockingClient | None = None
        self.latest = -1
        #: (monotonic time, count) each time the count grew.
        self.growth: list[tuple[float, int]] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="stored-count", daemon=True)
        self.thread.start()

    def _ask(self) -> int | None:
        try:
            if self.client is None:
                self.client = BlockingClient(self.front.url, name="faults-offsets")
            _, end = self.client.offsets([TOPIC], timeout=10).get(TOPIC, (1, 1))
            return end - 1
        except Exception:
            self._close()
            return None

    def _run(self) -> None:
        while not self.stopping.is_set():
            count = self._ask()
            if count is not None and count > self.latest:
                self.latest = count
                self.growth.append((time.monotonic(), count))
            self.stopping.wait(POLL if count is not None else 0.1)
        self._close()

    def _close(self) -> None:
        if self.client is not None:
            with contextlib.suppress(Exception):
                self.client.close(flush=False, timeout=1)
            self.client = None

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(30)

    def longest_stall(self, since: float, until: float) -> float:
        """The longest time without growth between ``since`` and ``until``."""
        times = [since] + [t for t, _ in self.growth if since < t < until] + [until]
        return max(b - a for a, b in itertools.pairwise(times))


def wait_trigger(
    stored: Stored,
    job: Job,
    low: int,
    high: int,
    per_batch: int,
    staging: Callable[[], bool] | None = None,
) -> int:
    """Wait until the topic holds at least ``low`` records while a commit is
    routing (a count that is not a whole number of micro-batches), or with
    ``staging`` (a :class:`Staging`), while the tasks stage rows and no
    commit routes (a whole number); or ``high``
    records whatever. Returns the count seen (-1: the job ended first, or
    the guard ran out)."""
    deadline = time.monotonic() + TRIGGER_GUARD
    while time.monotonic() < deadline and not job.finished.is_set():
        count = stored.latest
        halfway = staging is not None and staging()  # (it watches all along)
        if count >= high:
            return count
        if count >= low:
            if staging is None and count % per_batch:
                return count
            if halfway and not count % per_batch and stored.latest == count:
                return count
        time.sleep(POLL if staging is not None else POLL / 5)
    return -1


class Staging:
    """Watches a micro-batch's write tasks (its stage of two tasks, after the
    repartition) in Spark's status tracker, and the front end's state
    journal: called, whether the tasks are staging rows now: their stage
    runs, none of its tasks has finished (so the micro-batch's commit has
    not begun), and the journal (where the front end keeps staged rows
    before it confirms them) grew by ``least`` bytes since the stage began.
    (The tracker's count of running tasks stays 0 for short tasks: the
    stage's presence counts.)"""

    def __init__(self, spark: Any, journal: Path, least: int) -> None:
        self.tracker = spark.sparkContext.statusTracker()
        self.journal = journal
        self.least = least
        #: The journal's size when each write stage was first seen running.
        self.began: dict[int, int] = {}

    def size(self) -> int:
        try:
            return self.journal.stat().st_size
        except OSError:
            return 0

    def __call__(self) -> bool:
        staging = False
        active = set(self.tracker.getActiveStageIds())
        for stage in [stage for stage in self.began if stage not in active]:
            del self.began[stage]
        for stage in active:
            info = self.tracker.getStageInfo(stage)
            if info is None or info.numTasks != 2:
                continue
            began = self.began.setdefault(stage, self.size())
            if not info.numCompletedTasks and self.size() - began >= self.least:
                staging = True
        return staging


def runs_of(values: Iterable[int], most: int = 50) -> list[list[int]]:
    """``[first, last]`` of each run of consecutive ``values`` (the first ``most``)."""
    runs: list[list[int]] = []
    for value in values:
        if runs and runs[-1][1] + 1 == value:
            runs[-1][1] = value
        elif len(runs) < most:
            runs.append([value, value])
        else:
            break
    return runs


def read_back(address: str, result: Result, per_batch: int) -> None:
    """Every record of the topic from its first offset, counted into ``result``."""
    tally = Tally()
    foreign = 0
    with BlockingClient(address, name="faults-reader", reconnect=60) as client:
        first, end = client.offsets([TOPIC], timeout=60).get(TOPIC, (1, 1))
        result.offsets = [first, end]
        if end > first:
            with client.subscribe(TOPIC, start="earliest") as subscription:
                last = first - 1
                while last < end - 1:
                    for message in subscription.receive_batch(4096, timeout=60):
                        offset = message.offset if message.offset is not None else last + 1
                        if offset > last + 1:
                            result.offset_gaps.append([last + 1, offset - 1])
                        last = offset
                        try:
                            value = value_of(message.payload)
                        except ValueError:
                            foreign += 1
                            continue
                        if message.payload != payload_of(value, PAYLOAD) or value >= result.rows:
                            foreign += 1
                            continue
                        tally.take(value, message.offset)
    result.read = tally.received
    result.lost = tally.missing_below(result.rows)
    wrong = [v for v in range(result.rows) if tally.seen[v : v + 1] != b"\x01"]
    result.lost_runs = runs_of(wrong)
    for value in wrong:
        batch = str(value // per_batch)
        result.wrong_by_batch[batch] = result.wrong_by_batch.get(batch, 0) + 1
    result.duplicated = tally.extra
    result.foreign = foreign


def run(settings: Settings, directory: Path, spark: Any = None) -> Result:
    """One run in ``directory`` (servers, front end, input, checkpoint);
    ``spark``: a session to use (None: one made here and stopped at the end).
    Never raises for what the servers, the broker or Spark do (``errors``)."""
    rng = random.Random(settings.seed)
    result = Result(settings.seed, settings.rows, settings.batches, settings.new_disk)
    started = time.monotonic()
    own_spark = spark is None
    job: Job | None = None
    with open_nats_servers(
        directory / "nats", 3, system_account=True, app_jsz_import=True
    ) as servers:
        front = FrontEnd(servers, directory, settings.lease, settings.restart_delay)
        stored: Stored | None = None
        feed: Feed | None = None
        try:
            front.start()
            stored = Stored(front)
            feed = Feed(directory, settings.rows, settings.batches)
            per_batch = feed.per_batch
            reachable = (settings.batches - HELD) * per_batch
            if spark is None:
                spark = spark_session()
            job = Job(spark, feed, front.url)
            job.start()

            def batches_near(fraction: float) -> int:
                whole = max(1, min(settings.batches - 3, round(fraction * settings.batches)))
                return rng.randint(max(1, whole - 1), whole + 1) * per_batch

            # 1. The stream's leader.
            low = batches_near(settings.leader_at)
            fault = result.leader_kill
            count = wait_trigger(stored, job, low, min(reachable, low + 2 * per_batch), per_batch)
            leader_killed = front_end_killed = 0.0
            if count < 0:
                result.errors.append(f"leader kill: the job ended before {low} rows were stored")
            else:
                leader = servers.leader_of(stream_name(TOPIC))
                if leader is None:
                    result.errors.append("leader kill: the stream had no leader")
                else:
                    feed.paused.set()  # (the job does not run past the fault meanwhile)
                    leader.kill()
                    leader_killed = time.monotonic()
                    fault.stored_at_trigger = count
                    fault.during_commit = bool(count % per_batch)
                    fault.at_s = round(leader_killed - job.started, 2)
                    fault.before = leader.name
                    fault.after = servers.wait_for_leader_of(stream_name(TOPIC)).name
                    time.sleep(rng.uniform(1.0, 6.0))
                    leader.restart()
                    servers.wait_ready()
                    fault.down_s = round(time.monotonic() - leader_killed, 2)
                    feed.paused.clear()

            # 2. The front end.
            low = min(reachable, max(batches_near(settings.front_end_at), count + 2 * per_batch))
            fault = result.front_end_kill
            staging = None
            if settings.front_end_kill_during == "staging":
                journal = front.data / "cluster" / "state.journal"
                staging = Staging(spark, journal, per_batch * PAYLOAD // 5)
            high = min(reachable, low + 3 * per_batch)
            count = wait_trigger(stored, job, low, high, per_batch, staging)
            if count < 0:
                result.errors.append(f"front-end kill: the job ended before {low} rows")
            else:
                fault.before = str(front.pid)
                killed_pid = front.kill()
                front_end_killed = time.monotonic()
                fault.stored_at_trigger = count
                fault.during_commit = bool(count % per_batch)
                fault.at_s = round(front_end_killed - job.started, 2)
                if settings.new_disk:  # (its disk lost with it: a new, empty one)
                    front.data = directory / "data-new"
                front.back(killed_pid)
                fault.after = str(front.pid)
                fault.down_s = round(time.monotonic() - front_end_killed, 2)
            feed.faults_done.set()

            if not job.finished.wait(JOB_GUARD):
                result.errors.append(f"the job did not end within {JOB_GUARD:g} s")
            elif not job.succeeded:
                result.errors.append("the streaming query failed every run")
            stored.stop()
            ended = job.ended or time.monotonic()
            if leader_killed:
                until = front_end_killed or ended
                result.leader_kill.stalled_s = round(stored.longest_stall(leader_killed, until), 2)
            if front_end_killed:
                stall = stored.longest_stall(front_end_killed, ended)
                result.front_end_kill.stalled_s = round(stall, 2)
            read_back(front.url, result, per_batch)
            found = re.findall(r"(\d+) commits to complete", front.log_text())
            result.commits_completed_at_start = int(found[-1]) if found else 0
            found = re.findall(r"batches staged \((\d+) bytes\)", front.log_text())
            result.staged_bytes_at_start = int(found[-1]) if found else 0
            result.duplicate_commits = front.metric(
                "broker_staging_outcomes_total", outcome="duplicate"
            )
            result.staged_batches_read = front.metric("broker_cluster_staged_batches_read_total")
        except Exception as error:
            result.errors.append(f"harness: {error!r}"[:600])
        finally:
            if stored is not None:
                stored.stop()
            if feed is not None:
                feed.stop()
            if job is not None:
                job.stop()
                result.query_runs = job.runs
                result.query_errors = job.errors
                result.job_s = round((job.ended or time.monotonic()) - job.started, 1)
            if own_spark and spark is not None:
                spark.stop()
            front.stop()
            result.front_end_log = [
                line
                for line in front.log_text().splitlines()
                if re.search(r"WARNING|ERROR|CRITICAL|commits to complete", line)
            ][:30]
    result.seconds = round(time.monotonic() - started, 1)
    return result


def main(argv: list[str] | None = None) -> int:
    assert __doc__ is not None
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--batches", type=int, default=20, help="micro-batches (two tasks each)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--seeds", type=int, default=1, help="runs, from --seed on")
    parser.add_argument("--leader-at", type=float, default=0.25)
    parser.add_argument("--front-end-at", type=float, default=0.6)
    parser.add_argument(
        "--front-end-kill-during",
        choices=("commit", "staging"),
        default="commit",
        help="kill the front end while a commit routes, or while tasks stage rows",
    )
    parser.add_argument("--restart-delay", type=float, default=1.0)
    parser.add_argument(
        "--new-disk",
        action="store_true",
        help="start the killed front end again on a new, empty data directory",
    )
    parser.add_argument("--keep", action="store_true", help="keep the run's directory")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("broker.client").setLevel(logging.ERROR)
    spark = spark_session()
    failed = 0
    try:
        for seed in range(args.seed, args.seed + args.seeds):
            settings = Settings(
                rows=args.rows,
                batches=args.batches,
                seed=seed,
                leader_at=args.leader_at,
                front_end_at=args.front_end_at,
                front_end_kill_during=args.front_end_kill_during,
                restart_delay=args.restart_delay,
                new_disk=args.new_disk,
                keep=args.keep,
            )
            directory = Path(tempfile.mkdtemp(prefix=f"spark-faults-{seed}-"))
            try:
                result = run(settings, directory, spark)
            finally:
                if args.keep:
                    print(f"kept {directory}", file=sys.stderr)
                else:
                    shutil.rmtree(directory, ignore_errors=True)
            failed += not result.ok
            print(json.dumps({"ok": result.ok, **asdict(result)}), flush=True)
    finally:
        spark.stop()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
