"""End-to-end broker benchmarks: a real broker process and client processes.

Workloads (see shared BENCHMARKS.md): 1->1 throughput, 1->10 fan-out,
open-loop latency at fixed rates, and the slow consumer (one publisher
connection flat out on a topic whose only subscriber consumes at 1% of the
1->1 rate, plus a second topic on the same connection at a fixed rate with a
fast subscriber); and the topic-log workloads (``_log_workloads``). The
broker runs in its own process so that its peak RSS
(``VmHWM``) and RSS over time can be read from ``/proc``.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

from . import _log_workloads as log_workloads
from ._log_workloads import log_broker
from ._procs import (
    broker_process,
    cpu_seconds,
    median_runs,
    paired_median_runs,
    percentiles,
    proc_status,
    wait_ready,
    worker,
    worker_result,
)
from ._rates import latency, rates_table
from ._yardstick import python_loop_10m_s


def _slow_consumer(
    url: str, broker: subprocess.Popen[str], slow_rate: float, fast_rate: float, duration: float
) -> dict[str, Any]:
    # Both subscribers outlive the publisher: a subscriber that left early
    # would free the publisher's slow channel and flatter its rate.
    slow = worker(
        {
            "role": "sub",
            "url": url,
            "topic": "slow",
            "rate": slow_rate,
            "duration": duration + 5,
            # Then whatever is still queued, to count every message in.
            "drain_idle": 2.0,
        }
    )
    fast = worker(
        {"role": "sub", "url": url, "topic": "fast", "latency": True, "duration": duration + 5}
    )
    wait_ready(slow)
    wait_ready(fast)
    rss_start = proc_status(broker.pid, "VmRSS")
    samples: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.25):
            samples.append(proc_status(broker.pid, "VmRSS"))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    pub = worker(
        {
            "role": "pub",
            "url": url,
            "topics": [{"name": "slow"}, {"name": "fast", "rate": fast_rate}],
            "duration": duration,
        }
    )
    slow_result = worker_result(slow, duration + 120)["subscribers"][0]
    published = worker_result(pub, duration + 120)
    fast_result = worker_result(fast, duration + 120)["subscribers"][0]
    stop.set()
    sampler.join()
    slow_seconds = max((slow_result["last"] - slow_result["first"]) / 1e9, 1e-9)
    slow_published = published["sent"].get("slow", 0)
    # Steady state: the second half of the publisher's run, while the slow
    # subscriber is still consuming. The first moments fill the buffers the
    # guarantees allow (about a megabyte), at full speed, by design.
    timeline = published["timelines"].get("slow", [])
    half = published["start"] + duration * 1e9 / 2
    steady = [(t, n) for t, n in timeline if half <= t <= slow_result["last"]]
    if len(steady) >= 2:
        steady_rate = (steady[-1][1] - steady[0][1]) / ((steady[-1][0] - steady[0][0]) / 1e9)
    else:
        steady_rate = 0.0
    # Whatever the slow subscriber did not consume is still queued (reliable),
    # never dropped: it would be delivered as the subscriber goes on.
    return {
        "duration_s": duration,
        "broker_rss_start_mib": rss_start / 2**20,
        "broker_rss_max_mib": max(samples or [rss_start]) / 2**20,
        "broker_rss_growth_mib": (max(samples or [rss_start]) - rss_start) / 2**20,
        "slow_subscriber_rate": slow_result["received"] / slow_seconds,
        "slow_publisher_rate_steady": steady_rate,
        "slow_publisher_rate_overall": slow_published / duration,
        "slow_published": slow_published,
        "slow_received": slow_result["received"] + slow_result["drained"],
        "lost": slow_result["gaps"] + fast_result["gaps"],
        "fast_rate": fast_rate,
        "fast_received": fast_result["received"],
        **{f"fast_{k}": v for k, v in percentiles(fast_result["latencies"]).items()},
        "fast_send_late_p99_us": percentiles(published["lateness"].get("fast", []))["p99_us"],
    }


def _per_million(cpu: list[float], before: list[float], messages: int) -> list[float]:
    """CPU seconds per million messages of each broker, from two readings."""
    return [(now - then) / messages * 1e6 for now, then in zip(cpu, before, strict=True)]


def run(
    quick: bool = False,
    progress: Callable[[str], None] = lambda _step: None,
    *,
    log_only: bool = False,
    **options: Any,
) -> dict[str, Any]:
    """Run every workload against fresh broker processes; returns the figures.
    ``progress`` is told, in a few words, which workload starts. With
    ``log_only``, only the topic-log workloads and the memory-only 1->1 and
    1->10 they are compared with."""
    started = time.perf_counter()
    count = 20_000 if quick else 200_000
    runs = 1 if quick else 3
    slow_duration = 3.0 if quick else float(options.get("slow_seconds", 60))
    replay_count = 100_000 if quick else 1_000_000
    results: dict[str, Any] = {
        "python_loop_10m_s": python_loop_10m_s(),
        # How the throughput runs' subscribers take their messages.
        "throughput_subscribers_call": "receive_batch",
    }
    with broker_process() as (url, broker), log_broker() as (log_url, log_process, _):
        # The memory-only broker and the one with topic logs take turns, so
        # that their ratios compare like with like on a busy machine.
        urls = [url, log_url]
        pids = [broker.pid, log_process.pid]
        t0 = time.perf_counter()
        progress(f"1->1 throughput, memory-only and log in turn, {runs} x {count:,} messages")
        cpu0 = [cpu_seconds(pid) for pid in pids]
        one, log_one = paired_median_runs(urls, runs, count, 1)
        cpu1 = [cpu_seconds(pid) for pid in pids]
        progress(f"1->10 fan-out, memory-only and log in turn, {runs} x {count // 2:,} messages")
        fan, log_fan = paired_median_runs(urls, runs, count // 2, 10)
        cpu2 = [cpu_seconds(pid) for pid in pids]
        one_cpu = _per_million(cpu1, cpu0, count * runs)
        fan_cpu = _per_million(cpu2, cpu1, count // 2 * 10 * runs)
        results["one_to_one_msgs_per_s"] = one["per_s"]
        results["one_to_one_lost"] = one["lost"]
        results["one_to_one_broker_cpu_s_per_million"] = one_cpu[0]
        results["one_to_one_publisher_cpu"] = one["publisher_cpu"]
        results["one_to_one_subscriber_cpu"] = one["subscriber_cpu"]
        results["fanout_1_to_10_deliveries_per_s"] = fan["per_s"]
        results["fanout_broker_cpu_s_per_million_deliveries"] = fan_cpu[0]
        results["fanout_subscriber_cpu"] = fan["subscriber_cpu"]
        results["fanout_subscriber_processes"] = fan["subscriber_processes"]
        results["fanout_lost"] = fan["lost"]
        results.update(log_workloads.throughput(results, log_one, log_fan, one_cpu[1], fan_cpu[1]))
        top = one["per_s"]
        if not log_only:
            # The same with every message taken by its own receive() call.
            progress("1->10 fan-out with one receive() per message")
            each = median_runs(url, runs, count // 2, 10, batch=False)
            results["fanout_receive_each_deliveries_per_s"] = each["per_s"]
            results["fanout_receive_each_subscriber_cpu"] = each["subscriber_cpu"]
            results["fanout_receive_each_lost"] = each["lost"]
            for rate in (1_000, 5_000, 20_000, int(top * 0.8)):
                progress(f"open-loop latency at {rate:,} msg/s")
                figures = latency(url, rate, 1.0 if quick else 3.0)
                for key, value in figures.items():
                    if key != "rate":
                        results[f"latency_{rate}_{key}"] = value
        results["bench_seconds_so_far"] = time.perf_counter() - t0
        results["broker_peak_rss_mib"] = proc_status(broker.pid, "VmHWM") / 2**20
        progress(f"log: replay of {replay_count:,} records from earliest")
        results.update(
            log_workloads.replay(log_url, replay_count, top, results["log_one_to_one_msgs_per_s"])
        )
        # (Its peak RSS counts the log's terms mapped from their files.)
        results["log_broker_peak_rss_mib"] = proc_status(log_process.pid, "VmHWM") / 2**20
        results["log_broker_rss_anon_mib"] = proc_status(log_process.pid, "RssAnon") / 2**20
        results["log_broker_rss_shmem_mib"] = proc_status(log_process.pid, "RssShmem") / 2**20
    if not log_only:
        progress("per message at 100, 1,000 and 10,000 msg/s: CPU, task steps, I/O waits")
        results.update(rates_table(3.0 if quick else 5.0))
        with broker_process() as (url, broker):
            progress(f"slow consumer for {slow_duration:.0f} s, then its backlog")
            slow = _slow_consumer(url, broker, max(top * 0.01, 50), 1_000, slow_duration)
            results.update(
                {f"slow_{k}" if not k.startswith("slow") else k: v for k, v in slow.items()}
            )
            results["slow_broker_peak_rss_mib"] = proc_status(broker.pid, "VmHWM") / 2**20
    results.update(log_workloads.slow_consumer(slow_duration, progress))
    results["bench_seconds"] = time.perf_counter() - started
    return results
