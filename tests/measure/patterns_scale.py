"""A pattern subscription over 1,100 topics: what issue 42 asks to show.

``broker serve`` on a fresh data directory. 1,000 topics ``scale.<i>``
and 50 topics ``other.<i>`` (which the pattern must not match) get
``--records`` records each; then a subscriber process subscribes to
``scale.*`` from ``"earliest"`` with a durable cursor (``reconnect`` on),
writing ``<topic> <offset> <index>`` per message to a journal. Once it has
read the backlog, 100 topics ``scale.new<i>`` are made (records each).
Then the subscriber is SIGSTOPped and ``--gigabytes`` (1) GB of 1 KiB
records is published across all 1,100 matching topics, topic after topic;
the broker's ``RssAnon`` is sampled every 0.2 s (growth against the value
just before the stop: goal < 64 MiB). The subscriber is SIGCONTed; while
it catches up the broker is ``kill -9``ed and started again on the same
port and directory (``--kills`` times); the subscriber resumes by itself.

At the end every record of every ``scale.*`` topic must be in the journal
exactly once, in order per topic (``lost``, ``duplicated``, ``reordered``:
goal 0), and none of an ``other.*`` topic (``foreign``: goal 0). Exit 1 if a
goal is missed.

    python tests/measure/patterns_scale.py            # 1 GB, 1 kill
    python tests/measure/patterns_scale.py --gigabytes 0.2 --json
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import TextIO

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from broker.client import open_client
from tests.measure._process import free_port, wait_listening

OLD_TOPICS = 1000
NEW_TOPICS = 100
OTHER_TOPICS = 50
RECORD = 1024


def rss_anon(pid: int) -> int:
    """``RssAnon`` of process ``pid`` in bytes (0 if it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return 0
    return 0


class Broker:
    """``broker serve`` on ``data_dir`` and ``port``, killed and started again."""

    def __init__(self, data_dir: Path, port: int, log: Path) -> None:
        self.data_dir, self.port, self.log = data_dir, port, log
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        command = [sys.executable, "-m", "broker", "--log-level", "WARNING", "serve"]
        command += ["--listen", self.url, "--metrics-listen", "", "--data-dir", str(self.data_dir)]
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=log)
        wait_listening(self.port)

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()


async def publish(url: str, plan: list[tuple[str, int, int]], size: int) -> None:
    """Publish ``count`` records from index ``first`` to each topic of ``plan``, in turn."""
    async with open_client(url, name="scale-pub") as client:
        for topic, first, count in plan:
            for index in range(first, first + count):
                head = b"%s %d " % (topic.encode(), index)
                await client.publish(topic, head + b"x" * max(0, size - len(head)))
        await client.flush()


async def subscribe(url: str, out: TextIO) -> None:
    """The subscriber process: ``scale.*`` from the earliest, cursor ``c``."""
    async with (
        open_client(url, name="scale-sub", reconnect=120.0) as client,
        client.subscribe("scale.*", start="earliest", cursor="c") as subscription,
    ):
        print("ready", flush=True)
        while True:
            batch = await subscription.receive_batch()
            out.write(
                "".join(
                    f"{m.topic} {m.offset} {m.payload.split(b' ', 2)[1].decode()}\n" for m in batch
                )
            )
            out.flush()


def journal_lines(path: Path) -> int:
    try:
        with path.open("rb") as file:
            return sum(1 for _ in file)
    except OSError:
        return 0


def wait_for_lines(path: Path, wanted: int, deadline: float) -> int:
    while time.monotonic() < deadline:
        lines = journal_lines(path)
        if lines >= wanted:
            return lines
        time.sleep(0.2)
    return journal_lines(path)


def run(args: argparse.Namespace) -> dict[str, object]:
    work = Path(tempfile.mkdtemp(prefix="patterns-scale-"))
    broker = Broker(work / "data", free_port(), work / "broker.log")
    broker.start()
    journal = work / "journal"
    results: dict[str, object] = {"records_per_topic_first": args.records}
    expected: dict[str, int] = defaultdict(int)
    try:
        old = [f"scale.{i}" for i in range(OLD_TOPICS)]
        others = [f"other.{i}" for i in range(OTHER_TOPICS)]
        plan = [(t, 0, args.records) for t in old + others]
        trio.run(publish, broker.url, plan, 100)
        for topic in old:
            expected[topic] = args.records
        subscriber = subprocess.Popen(
            [sys.executable, __file__, "--subscriber", broker.url, str(journal)],
            stdout=subprocess.PIPE,
        )
        assert subscriber.stdout is not None
        assert subscriber.stdout.readline().strip() == b"ready"
        started = time.monotonic()
        lines = wait_for_lines(journal, sum(expected.values()), started + args.timeout)
        results["backlog_seconds"] = round(time.monotonic() - started, 2)
        results["backlog_read"] = lines
        new = [f"scale.new{i}" for i in range(NEW_TOPICS)]
        trio.run(publish, broker.url, [(t, 0, args.records) for t in new], 100)
        for topic in new:
            expected[topic] = args.records
        wait_for_lines(journal, sum(expected.values()), time.monotonic() + args.timeout)
        # The stop: 1 GB across the 1,100 topics while the subscriber sleeps.
        matching = old + new
        per_topic = int(args.gigabytes * 2**30 / RECORD / len(matching))
        subscriber.send_signal(signal.SIGSTOP)
        time.sleep(0.5)
        assert broker.process is not None
        pid = broker.process.pid
        base = rss_anon(pid)
        peak = [base]
        stop_sampling = threading.Event()

        def sample() -> None:
            while not stop_sampling.wait(0.2):
                peak[0] = max(peak[0], rss_anon(pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        published = time.monotonic()
        plan = [(t, args.records, per_topic) for t in matching]
        trio.run(publish, broker.url, plan, RECORD)
        results["stopped_publish_seconds"] = round(time.monotonic() - published, 1)
        results["stopped_published_bytes"] = per_topic * RECORD * len(matching)
        stop_sampling.set()
        sampler.join()
        results["rss_anon_before_mib"] = round(base / 2**20, 1)
        results["rss_anon_peak_mib"] = round(peak[0] / 2**20, 1)
        results["rss_anon_growth_mib"] = round((peak[0] - base) / 2**20, 1)
        for topic in matching:
            expected[topic] += per_topic
        subscriber.send_signal(signal.SIGCONT)
        total = sum(expected.values())
        for _ in range(args.kills):
            # Kill once the subscriber is well into the catch-up.
            wait_for_lines(journal, journal_lines(journal) + total // (4 * args.kills), 1e18)
            broker.kill()
            time.sleep(1.0)
            broker.start()
        caught = time.monotonic()
        lines = wait_for_lines(journal, total, time.monotonic() + args.timeout)
        results["catch_up_seconds"] = round(time.monotonic() - caught, 1)
        subscriber.kill()
        subscriber.wait()
    finally:
        if broker.process is not None and broker.process.poll() is None:
            broker.process.kill()
            broker.process.wait()
    seen: dict[str, list[int]] = defaultdict(list)
    foreign = 0
    with journal.open() as file:
        for line in file:
            topic, _offset, index = line.split()
            if not topic.startswith("scale."):
                foreign += 1
            seen[topic].append(int(index))
    lost = duplicated = reordered = 0
    for topic, count in expected.items():
        got = seen.get(topic, [])
        distinct = set(got)
        lost += count - len(distinct & set(range(count)))
        duplicated += len(got) - len(distinct)
        reordered += sum(1 for a, b in itertools.pairwise(got) if b <= a)
    results.update(
        {
            "topics_matched": len(expected),
            "records_expected": sum(expected.values()),
            "records_received": sum(map(len, seen.values())),
            "lost": lost,
            "duplicated": duplicated,
            "reordered": reordered,
            "foreign": foreign,
            "kills": args.kills,
        }
    )
    shutil.rmtree(work, ignore_errors=True)
    return results


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--subscriber":
        with open(sys.argv[3], "w") as out:
            trio.run(subscribe, sys.argv[2], out)
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=20, help="records per topic at first")
    parser.add_argument("--gigabytes", type=float, default=1.0)
    parser.add_argument("--kills", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = run(args)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for key, value in results.items():
            print(f"{key}: {value}")
    goals = (
        results["lost"] == results["duplicated"] == results["reordered"] == results["foreign"] == 0
        and isinstance(results["rss_anon_growth_mib"], float)
        and results["rss_anon_growth_mib"] < 64
    )
    raise SystemExit(0 if goals else 1)


if __name__ == "__main__":
    main()
