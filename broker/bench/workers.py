"""``broker bench workers``: what a message costs the workers of a
multi-worker broker, with clients that reach each topic's owner directly and
with every message forwarded between workers, beside one process.

Machines differ in cores, so wall-clock scaling is not the measure here:
each configuration moves the same messages over the same ``TOPICS`` topics
(at least 4 per worker), and the figure is **messages per worker
CPU-second** (delivered messages over the CPU time every worker process
used in the run, read from ``/proc``). The configurations, run in turn
``rounds`` times (medians):

- ``one``: ``broker serve`` (one process);
- ``direct``: ``--workers 2``; each topic's publisher and subscriber connect
  to its owner's direct address (what the cluster clients do);
- ``public``: ``--workers 2``; every client connects to the public address
  and lands on either worker (the kernel's choice): what clients that do
  not use the membership get; about three quarters of the messages cross
  a worker boundary one way or both;
- ``forwarded``: ``--workers 2``; each topic's publisher and subscriber
  connect to the *other* worker, so every publish is forwarded to the owner
  and every delivery forwarded back: the worst case.

Each topic gets one subscriber process; two publisher processes (one per
worker's share of the topics) publish flat out. Memory-only brokers, so the
disk does not enter the figure.

Then the slow-consumer workload across workers (:func:`slow_consumer`):
its two topics on different workers, every client at the other worker.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from broker.config import BrokerConfig
from broker.protocol import owner_id

from ._procs import (
    cpu_seconds,
    free_port,
    proc_status,
    spawn,
    stop,
    wait_ready,
    worker,
    worker_result,
)
from ._yardstick import python_loop_10m_s

#: Topics of every configuration (4 per worker of the two-worker broker).
TOPICS = [f"bench-{i}" for i in range(8)]
WORKER_IDS = ["w0", "w1"]
CONFIGURATIONS = ("one", "direct", "public", "forwarded")


@contextmanager
def _broker(
    workers: int, *, metrics: bool = False
) -> Iterator[tuple[dict[str, str], list[int], str, str]]:
    """A memory-only broker of ``workers`` processes: per worker id its
    direct URL (one process: every id maps to its address), the pids whose
    CPU counts, the base URL of its metrics endpoint ("" without) and its
    public URL."""
    port = free_port()
    command = [sys.executable, "-m", "broker", "--log-level", "WARNING", "serve"]
    command += ["--listen", f"127.0.0.1:{port}"]
    command += ["--metrics-listen", "127.0.0.1:0" if metrics else ""]
    command += ["--set", "memory_only=true", "--workers", str(workers)]
    process: subprocess.Popen[str] = spawn(command, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if "listening" not in line:
            raise RuntimeError(f"broker did not start: {line!r}")
        base = ""
        if metrics:
            base = process.stdout.readline().split()[-1].removesuffix("/metrics")
        urls = dict.fromkeys(WORKER_IDS, f"127.0.0.1:{port}")
        pids = [process.pid]
        if workers > 1:
            # "2 workers, direct: w0 on HOST:PORT, w1 on HOST:PORT"
            _, _, directs = process.stdout.readline().partition("direct: ")
            for entry in directs.split(", "):
                worker_id, _, address = entry.split()
                urls[worker_id] = address
            pids = _children(process.pid)
        yield urls, pids, base, f"127.0.0.1:{port}"
    finally:
        stop(process)


def _children(pid: int) -> list[int]:
    """The child processes of ``pid`` (of any of its threads: the supervisor
    starts its workers from a thread)."""
    found: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as children:
            found += [int(child) for child in children.read().split()]
    return found


def _round(configuration: str, per_topic: int) -> dict[str, float]:
    """One run of ``configuration``: messages per worker CPU-second and more."""
    with _broker(1 if configuration == "one" else 2) as (urls, pids, _, public):
        owners = {topic: owner_id(topic, WORKER_IDS) for topic in TOPICS}
        if configuration == "forwarded":
            reach = {t: "w1" if owner == "w0" else "w0" for t, owner in owners.items()}
        else:
            reach = owners
        if configuration == "public":
            urls = dict.fromkeys(WORKER_IDS, public)
        subscribers = []
        for topic in TOPICS:
            sub = worker(
                {"role": "sub", "url": urls[reach[topic]], "topic": topic, "count": per_topic}
            )
            wait_ready(sub)
            subscribers.append(sub)
        cpu0 = sum(cpu_seconds(pid) for pid in pids)
        started = time.perf_counter()
        publishers = [
            worker(
                {
                    "role": "pub",
                    "url": urls[via],
                    "count": per_topic,
                    "topics": [{"name": t} for t in TOPICS if reach[t] == via],
                }
            )
            for via in WORKER_IDS
            if any(reach[t] == via for t in TOPICS)
        ]
        for publisher in publishers:
            worker_result(publisher, 600)
        received = sum(
            sum(s["received"] for s in worker_result(sub, 600)["subscribers"])
            for sub in subscribers
        )
        elapsed = time.perf_counter() - started
        cpu = sum(cpu_seconds(pid) for pid in pids) - cpu0
    return {
        "msgs_per_worker_cpu_s": received / cpu if cpu else 0.0,
        "msgs_per_s": received / elapsed,
        "worker_cpu_s": cpu,
        "lost": len(TOPICS) * per_topic - received,
    }


def run(
    quick: bool = False,
    progress: Callable[[str], None] = lambda _step: None,
    *,
    rounds: int | None = None,
    per_topic: int | None = None,
    **_options: Any,
) -> dict[str, Any]:
    """Every configuration in turn, ``rounds`` times; medians and the ratios
    ``direct``, ``public`` and ``forwarded`` over ``one`` (targets: direct
    >= 0.9; through forwarding >= 0.55), also per round and their median."""
    rounds = rounds or (1 if quick else 3)
    per_topic = per_topic or (5_000 if quick else 50_000)
    slow_seconds = 3.0 if quick else 30.0
    results: dict[str, Any] = {"python_loop_10m_s": python_loop_10m_s(), "topics": len(TOPICS)}
    runs: dict[str, list[dict[str, float]]] = {c: [] for c in CONFIGURATIONS}
    for number in range(rounds):
        for configuration in CONFIGURATIONS:
            progress(f"round {number + 1}/{rounds}: {configuration}, {per_topic:,} per topic")
            runs[configuration].append(_round(configuration, per_topic))
    for configuration, figures in runs.items():
        for key in figures[0]:
            results[f"{configuration}_{key}"] = statistics.median(f[key] for f in figures)
        results[f"{configuration}_msgs_per_worker_cpu_s_runs"] = [
            round(f["msgs_per_worker_cpu_s"]) for f in figures
        ]
    progress(f"slow consumer across workers for {slow_seconds:.0f} s")
    for key, value in slow_consumer(slow_seconds).items():
        results[f"slow_consumer_{key}"] = value
    one = results["one_msgs_per_worker_cpu_s"]
    for configuration in ("direct", "public", "forwarded"):
        mine = results[f"{configuration}_msgs_per_worker_cpu_s"]
        results[f"ratio_{configuration}_to_one"] = mine / one if one else 0.0
        # Each round's ratio (its runs back to back): a drift of the
        # machine's speed over the whole run weighs less on these.
        per_round = [
            theirs["msgs_per_worker_cpu_s"] / ours["msgs_per_worker_cpu_s"]
            for ours, theirs in zip(runs["one"], runs[configuration], strict=True)
            if ours["msgs_per_worker_cpu_s"]
        ]
        results[f"ratio_{configuration}_to_one_rounds"] = [round(r, 3) for r in per_round]
        results[f"ratio_{configuration}_to_one_median_of_rounds"] = (
            statistics.median(per_round) if per_round else 0.0
        )
    return results


def _owned_by(worker_id: str, stem: str) -> str:
    """The first topic ``stem-N`` that ``worker_id`` owns."""
    return next(
        f"{stem}-{n}" for n in range(1000) if owner_id(f"{stem}-{n}", WORKER_IDS) == worker_id
    )


def _hop_debts(base: str, peaks: dict[str, float]) -> None:
    """Fold the largest debt of every connection and channel account in the
    merged ``/stat.json`` into ``peaks`` (per kind: connection, channel)."""
    with urllib.request.urlopen(base + "/stat.json", timeout=10) as answer:
        document = json.load(answer)
    for connection in document.get("connections", []):
        account = connection["account"]
        peaks["connection"] = max(peaks["connection"], account["debt"], account["peak_debt"])
        for channel in connection.get("channels", []):
            channel_account = channel.get("account") or {}
            debt = max(channel_account.get("debt", 0), channel_account.get("peak_debt", 0))
            peaks["channel"] = max(peaks["channel"], debt)


def slow_consumer(
    duration: float, slow_rate: float = 200.0, fast_rate: float = 1_000.0
) -> dict[str, Any]:
    """The slow-consumer workload across workers: topic ``slow`` owned by
    w0, ``fast`` by w1, and every client at the other worker, so that every
    message crosses a forwarding hop (the slow one two). One publisher
    publishes flat out to ``slow`` (held to its subscriber's rate) and at
    ``fast_rate`` to ``fast``. Reported: each worker's ``RssAnon`` growth,
    the largest debt of any connection and channel account seen in the
    merged ``/stat.json`` during the run beside their watermarks, loss."""
    slow_topic, fast_topic = _owned_by("w0", "slow"), _owned_by("w1", "fast")
    with _broker(2, metrics=True) as (urls, pids, base, _):
        slow = worker(
            {
                "role": "sub",
                "url": urls["w1"],
                "topic": slow_topic,
                "rate": slow_rate,
                "duration": duration + 5,
                "drain_idle": 2.0,
            }
        )
        fast = worker(
            {"role": "sub", "url": urls["w0"], "topic": fast_topic, "duration": duration + 5}
        )
        wait_ready(slow)
        wait_ready(fast)
        rss_start = {pid: proc_status(pid, "RssAnon") for pid in pids}
        rss_max = dict(rss_start)
        peaks = {"connection": 0.0, "channel": 0.0}
        publisher = worker(
            {
                "role": "pub",
                "url": urls["w1"],
                "topics": [{"name": slow_topic}, {"name": fast_topic, "rate": fast_rate}],
                "duration": duration,
            }
        )
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.5):
                for pid in pids:
                    rss_max[pid] = max(rss_max[pid], proc_status(pid, "RssAnon"))
                _hop_debts(base, peaks)

        # (Sampled beside, not by polling the publisher: its result is
        # larger than a pipe holds, so it ends only once it is read.)
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            published = worker_result(publisher, duration + 120)
        finally:
            done.set()
            sampler.join()
        slow_result = worker_result(slow, duration + 120)["subscribers"][0]
        fast_result = worker_result(fast, duration + 120)["subscribers"][0]
    config = BrokerConfig()
    sent = published["sent"]
    return {
        "duration_s": duration,
        "worker_rss_anon_growth_mib": [(rss_max[p] - rss_start[p]) / 2**20 for p in pids],
        "max_connection_debt": peaks["connection"],
        "connection_high_watermark": config.connection_high_watermark,
        "max_channel_debt": peaks["channel"],
        "channel_high_watermark": config.channel_high_watermark,
        "slow_published": sent.get(slow_topic, 0),
        "slow_received": slow_result["received"] + slow_result["drained"],
        "fast_published": sent.get(fast_topic, 0),
        "fast_received": fast_result["received"],
        "lost": slow_result["gaps"] + fast_result["gaps"],
    }
