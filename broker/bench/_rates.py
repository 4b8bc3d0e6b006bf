"""Open-loop latency runs, and what the broker pays per message at fixed
everyday rates: CPU, task steps and sleeping I/O waits (issue 22)."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from typing import Any

from ._procs import (
    broker_process,
    cpu_seconds,
    free_port,
    percentiles,
    wait_ready,
    worker,
    worker_result,
)

#: The everyday rates of the per-rate table (msg/s).
TABLE_RATES = (100, 1_000, 10_000)


def latency(url: str, rate: float, duration: float) -> dict[str, float]:
    """One publisher at ``rate`` msg/s (open loop: each payload carries its
    scheduled send time) to one subscriber for ``duration`` seconds: the
    latency percentiles (µs), how many arrived, and how late the sender was."""
    sub = worker(
        {"role": "sub", "url": url, "topic": "lat", "count": int(rate * duration), "latency": True}
    )
    wait_ready(sub)
    pub = worker(
        {"role": "pub", "url": url, "topics": [{"name": "lat", "rate": rate}], "duration": duration}
    )
    published = worker_result(pub, duration + 60)
    received = worker_result(sub, duration + 60)["subscribers"][0]
    return {
        "rate": rate,
        **percentiles(received["latencies"]),
        "received": received["received"],
        "send_late_p99_us": percentiles(published["lateness"].get("lat", []))["p99_us"],
    }


def _loop_counters(metrics_port: int) -> tuple[int, int]:
    """The broker's task steps and sleeping I/O waits so far (from ``/stat.json``)."""
    url = f"http://127.0.0.1:{metrics_port}/stat.json"
    with urllib.request.urlopen(url, timeout=30) as response:
        loop = json.load(response)["broker"]["loop"]
    return int(loop["task_steps"]), int(loop["io_waits"])


def rates_table(duration: float, rates: tuple[int, ...] = TABLE_RATES) -> dict[str, Any]:
    """At each of ``rates``, on a fresh memory-only broker counting its loop
    (``loop_counters``): latency percentiles, and per message the broker's
    CPU (µs), task steps and sleeping I/O waits, taken over the middle of
    the run (from a second after the publisher started to half a second
    before it ends: steady state, connections' set-up and close left out)."""
    results: dict[str, Any] = {}
    metrics_port = free_port()
    extra = ["--set", "loop_counters=true", "--metrics-listen", f"127.0.0.1:{metrics_port}"]
    with broker_process(extra) as (url, process):
        for rate in rates:
            window: list[tuple[float, float, int, int]] = []

            def sample(
                pid: int = process.pid, window: list[tuple[float, float, int, int]] = window
            ) -> None:
                time.sleep(1.5)  # the publisher process starts, connects, sends a while
                # (Reading the counters costs the broker a /stat.json: the
                # window starts after the first read and ends before the second.)
                steps, waits = _loop_counters(metrics_port)
                window.append((time.perf_counter(), cpu_seconds(pid), steps, waits))
                time.sleep(max(duration - 2.5, 0.5))
                end, cpu = time.perf_counter(), cpu_seconds(pid)
                steps, waits = _loop_counters(metrics_port)
                window.append((end, cpu, steps, waits))

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            figures = latency(url, rate, duration)
            sampler.join()
            (t0, cpu0, steps0, waits0), (t1, cpu1, steps1, waits1) = window
            messages = max(rate * (t1 - t0), 1.0)
            prefix = f"rate_{rate}"
            results[f"{prefix}_p50_us"] = figures["p50_us"]
            results[f"{prefix}_p99_us"] = figures["p99_us"]
            results[f"{prefix}_received"] = figures["received"]
            results[f"{prefix}_broker_cpu_us_per_msg"] = (cpu1 - cpu0) / messages * 1e6
            results[f"{prefix}_task_steps_per_msg"] = (steps1 - steps0) / messages
            results[f"{prefix}_io_waits_per_msg"] = (waits1 - waits0) / messages
    return results
