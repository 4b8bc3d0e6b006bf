"""``broker topics ls`` on a broker with 10,000 topics on disk: how long the
answer takes, and whether other clients notice.

The topics (``ls.<i>``, ``--records`` records each) are written straight
into a fresh data directory with the log's own API, then ``broker serve``
starts on it (no topic is open). A probe client publishes to a topic and
waits for its own delivery every 5 ms (a round trip through the broker's
event loop); its slowest round trip during the listing, against its
slowest before, is the stall (goal <= 50 ms). The listing is asked with
``client.admin("topics")`` (all pages; the answer time, goal <= 1 s) and
with the ``broker topics ls`` command (its wall time, Python's start-up
included). It reads the data directory in a thread: each topic's
directory listing, its files' sizes and its checkpoint; no log is opened
(the broker's open-file count is printed before and after).

    python tests/measure/topics_listing.py              # 10,000 topics
    python tests/measure/topics_listing.py --topics 2000 --json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from broker.client import open_client
from broker.log import LogConfig, LogStore
from broker.protocol.frames import encode_deliver_tail
from tests.measure._process import free_port, wait_listening


def make_topics(data_dir: Path, topics: int, records: int) -> float:
    """Write ``topics`` topic logs of ``records`` records; seconds taken."""
    started = time.perf_counter()
    store = LogStore(data_dir, LogConfig(term_bytes=1 << 20))
    now = int(time.time() * 1000)
    for index in range(topics):
        log = store.topic(f"ls.{index}", LogConfig(term_bytes=1 << 20), now)
        # (A record is what a Publish carries: see encode_deliver_tail.)
        log.append_many([encode_deliver_tail(b"r%d" % n, None, None) for n in range(records)], now)
        log.flush()
        log.close()
    store.close()
    return time.perf_counter() - started


def open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def measure(url: str, pid: int) -> dict[str, object]:
    results: dict[str, object] = {}
    async with (
        open_client(url, name="probe") as probe,
        probe.subscribe("probe") as deliveries,
        open_client(url, name="admin") as admin,
    ):
        latencies: list[tuple[float, float]] = []
        stop = trio.Event()

        async def probing() -> None:
            while not stop.is_set():
                sent = time.perf_counter()
                await probe.publish("probe", b"p")
                await deliveries.receive()
                latencies.append((sent, time.perf_counter() - sent))
                await trio.sleep(0.005)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(probing)
            await trio.sleep(2.0)
            results["open_files_before"] = open_files(pid)
            asked = time.perf_counter()
            rows = await admin.admin("topics")
            answered = time.perf_counter()
            results["open_files_after"] = open_files(pid)
            results["topics_listed"] = len(rows)
            results["answer_seconds"] = round(answered - asked, 3)
            command = time.perf_counter()
            out = await trio.run_process(
                [sys.executable, "-m", "broker", "topics", "ls", "--broker", url],
                capture_stdout=True,
            )
            results["command_seconds"] = round(time.perf_counter() - command, 3)
            results["command_lines"] = len(out.stdout.splitlines())
            await trio.sleep(1.0)
            stop.set()
        before = [lat for sent, lat in latencies if sent < asked - 0.2]
        during = [lat for sent, lat in latencies if asked - 0.01 <= sent <= answered]
        results["probe_max_ms_before"] = round(max(before) * 1000, 1)
        results["probe_max_ms_during_answer"] = round(max(during, default=0.0) * 1000, 1)
        results["probe_samples_during_answer"] = len(during)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topics", type=int, default=10_000)
    parser.add_argument("--records", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="topics-listing-"))
    port = free_port()
    results: dict[str, object] = {"topics": args.topics}
    results["made_seconds"] = round(make_topics(work / "data", args.topics, args.records), 1)
    command = [sys.executable, "-m", "broker", "--log-level", "WARNING", "serve"]
    command += ["--listen", f"127.0.0.1:{port}", "--metrics-listen", "", "--data-dir"]
    broker = subprocess.Popen([*command, str(work / "data")])
    try:
        wait_listening(port)
        results.update(trio.run(measure, f"127.0.0.1:{port}", broker.pid))
    finally:
        broker.kill()
        broker.wait()
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for key, value in results.items():
            print(f"{key}: {value}")
    ok = (
        isinstance(results["answer_seconds"], float)
        and results["answer_seconds"] <= 1.0
        and isinstance(results["probe_max_ms_during_answer"], float)
        and results["probe_max_ms_during_answer"] <= 50
    )
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
