"""``flush = "always"``: what one topic fsyncing every append does to the
other clients of the broker.

One broker (its own process, a fresh data directory on this machine's
disk) with ``[[topics]] pattern = "sync.*", flush = "always"``; one
publisher publishing 100-byte records to ``sync.t`` flat out; a probe
client publishing to ``probe`` (a batch topic) and waiting for its own
delivery every 5 ms, a round trip through the broker's event loop. The
probe's round trips are taken for ``--seconds`` while the publisher runs
(p50, p99, max), and the publisher's confirmed rate and the broker's
fsyncs beside them. Run it against two builds (``PYTHONPATH=<checkout>``)
to compare: before, every fsync ran on the event loop inside the topic's
turn; now they run in a worker thread and a publish is confirmed once
its record is durable.

This machine's disk acknowledges an fsync in about 0.06 ms (a virtual
disk with a write-back cache); ``--fsync-ms N`` runs the broker with every
``fdatasync`` taking N ms more (a sleep before it, in whatever thread calls
it), as a disk that really writes (an SSD: 0.5-2 ms; a network volume or a
spinning disk: more).

    python tests/measure/flush_always_stall.py --seconds 10
    python tests/measure/flush_always_stall.py --seconds 10 --fsync-ms 2
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from broker.client import open_client
from tests.measure._process import free_port, wait_listening

#: ``python -c`` of a broker whose every fdatasync first sleeps FSYNC_MS.
SLOW_FSYNC = """\
import os, runpy, sys, time
delay = float(sys.argv.pop(1)) / 1000
real = os.fdatasync
def slow(fd):
    time.sleep(delay)
    real(fd)
os.fdatasync = slow
sys.argv[0] = "broker"
runpy.run_module("broker", run_name="__main__")
"""

CONFIG = """\
[[topics]]
pattern = "sync.*"
flush = "always"
"""


async def measure(url: str, seconds: float) -> dict[str, object]:
    results: dict[str, object] = {}
    async with (
        open_client(url, name="probe") as probe,
        probe.subscribe("probe") as deliveries,
        open_client(url, name="sync-publisher") as publisher,
    ):
        latencies: list[float] = []
        published = 0
        stop = trio.Event()

        async def publishing() -> None:
            nonlocal published
            payload = b"x" * 100
            while not stop.is_set():
                await publisher.publish("sync.t", payload)
                published += 1

        async def probing() -> None:
            while not stop.is_set():
                sent = time.perf_counter()
                await probe.publish("probe", b"p")
                await deliveries.receive()
                latencies.append(time.perf_counter() - sent)
                await trio.sleep(0.005)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(probing)
            await trio.sleep(1.0)
            idle = list(latencies)
            latencies.clear()
            nursery.start_soon(publishing)
            started = time.perf_counter()
            await trio.sleep(seconds)
            stop.set()
        await publisher.flush()
        elapsed = time.perf_counter() - started
        ordered = sorted(latencies)
        results["probe_round_trips"] = len(ordered)
        results["probe_p50_ms_idle"] = round(statistics.median(idle) * 1000, 2)
        results["probe_p50_ms"] = round(statistics.median(ordered) * 1000, 2)
        results["probe_p99_ms"] = round(ordered[int(len(ordered) * 0.99) - 1] * 1000, 2)
        results["probe_max_ms"] = round(ordered[-1] * 1000, 2)
        results["sync_topic_confirmed_per_s"] = round(published / elapsed)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--fsync-ms", type=float, default=0.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="flush-always-", dir=Path.home()))
    (work / "broker.toml").write_text(CONFIG)
    port = free_port()
    command = [sys.executable, "-m", "broker"]
    if args.fsync_ms:
        command = [sys.executable, "-c", SLOW_FSYNC, str(args.fsync_ms)]
    command += ["--log-level", "WARNING", "serve"]
    command += ["--listen", f"127.0.0.1:{port}", "--metrics-listen", ""]
    command += ["--config", str(work / "broker.toml"), "--data-dir", str(work / "data")]
    broker = subprocess.Popen(command)
    try:
        wait_listening(port)
        results = {"fsync_ms_added": args.fsync_ms}
        results.update(trio.run(measure, f"127.0.0.1:{port}", args.seconds))
    finally:
        broker.kill()
        broker.wait()
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for key, value in results.items():
            print(f"{key}: {value}")


if __name__ == "__main__":
    main()
