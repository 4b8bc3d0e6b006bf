"""End-to-end broker benchmarks: a real broker process and client processes.

Workloads (see shared BENCHMARKS.md): 1->1 throughput, 1->10 fan-out,
open-loop latency at fixed rates, and the slow consumer (one publisher
connection flat out on a topic whose only subscriber consumes at 1% of the
1->1 rate, plus a second topic on the same connection at a fixed rate with a
fast subscriber). The broker runs in its own process so that its peak RSS
(``VmHWM``) and RSS over time can be read from ``/proc``.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ._yardstick import python_loop_10m_s


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _proc_status(pid: int, field: str) -> int:
    """A ``/proc/PID/status`` memory field in bytes (0 if unavailable)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _cpu_seconds(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


@contextmanager
def _broker_process(extra: list[str] | None = None) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    port = _free_port()
    command = [sys.executable, "-m", "broker", "--log-level", "WARNING", "serve"]
    command += ["--listen", f"127.0.0.1:{port}", "--metrics-listen", "", *(extra or [])]
    if "--data-dir" not in command and "--memory-only" not in command:
        # Never the shared default data directory: a broker of another run may hold it.
        command.append("--memory-only")
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if "listening" not in line:
            raise RuntimeError(f"broker did not start: {line!r}")
        yield f"127.0.0.1:{port}", process
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()


def _worker(spec: dict[str, Any]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "broker.bench._worker", json.dumps(spec)],
        stdout=subprocess.PIPE,
        text=True,
    )


def _wait_ready(process: subprocess.Popen[str]) -> None:
    assert process.stdout is not None
    line = process.stdout.readline()
    if line.strip() != "ready":
        raise RuntimeError(f"subscriber worker failed: {line!r}")


def _result(process: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
    try:
        out, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        raise RuntimeError("benchmark worker timed out") from None
    if process.returncode:
        raise RuntimeError(f"benchmark worker failed with status {process.returncode}")
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def _percentiles(latencies_ns: list[int]) -> dict[str, float]:
    if not latencies_ns:
        return {"p50_us": 0.0, "p99_us": 0.0, "p999_us": 0.0, "max_us": 0.0}
    ordered = sorted(latencies_ns)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1000

    return {"p50_us": at(0.5), "p99_us": at(0.99), "p999_us": at(0.999), "max_us": at(1.0)}


def _subscriber_processes(subscribers: int) -> list[int]:
    """How many subscriber connections each subscriber process holds: the
    subscribers spread over as many processes as there are cores (a single
    Python process reading ten connections would measure itself, not the
    broker)."""
    processes = max(1, min(subscribers, os.cpu_count() or 1))
    return [
        subscribers // processes + (1 if i < subscribers % processes else 0)
        for i in range(processes)
    ]


def _fan(url: str, count: int, subscribers: int, batch: bool = True) -> dict[str, float]:
    """``count`` messages published to ``subscribers`` subscriptions, which
    take them with ``receive_batch()`` (``batch``) or one ``receive()`` each."""
    spec = {"role": "sub", "url": url, "topic": "bench", "count": count, "batch": batch}
    subs = [_worker({**spec, "connections": n}) for n in _subscriber_processes(subscribers)]
    for sub in subs:
        _wait_ready(sub)
    pub = _worker({"role": "pub", "url": url, "topics": [{"name": "bench"}], "count": count})
    published = _result(pub, 300)
    results = [_result(sub, 300) for sub in subs]
    received_all = {"cpu_s": sum(r["cpu_s"] for r in results)}
    received = [one for r in results for one in r["subscribers"]]
    last = max(r["last"] for r in received)
    seconds = (last - published["start"]) / 1e9
    total = sum(r["received"] for r in received)
    lost = count * subscribers - total + sum(r["gaps"] for r in received)
    return {
        "per_s": total / seconds,
        "seconds": seconds,
        "lost": lost,
        "publisher_cpu": published["cpu_s"] / seconds,
        "subscriber_cpu": received_all["cpu_s"] / seconds,
        "subscriber_processes": len(subs),
    }


def _median_runs(
    url: str, runs: int, count: int, subscribers: int, batch: bool = True
) -> dict[str, float]:
    results = [_fan(url, count, subscribers, batch) for _ in range(runs)]
    median = statistics.median(r["per_s"] for r in results)
    middle = min(results, key=lambda r: abs(r["per_s"] - median))
    return {
        "per_s": median,
        "lost": sum(r["lost"] for r in results),
        "runs": runs,
        # CPU cores each client process kept busy in the median run.
        "publisher_cpu": middle["publisher_cpu"],
        "subscriber_cpu": middle["subscriber_cpu"],
        "subscriber_processes": middle["subscriber_processes"],
    }


def _latency(url: str, rate: float, duration: float) -> dict[str, float]:
    sub = _worker(
        {"role": "sub", "url": url, "topic": "lat", "count": int(rate * duration), "latency": True}
    )
    _wait_ready(sub)
    pub = _worker(
        {"role": "pub", "url": url, "topics": [{"name": "lat", "rate": rate}], "duration": duration}
    )
    published = _result(pub, duration + 60)
    received = _result(sub, duration + 60)["subscribers"][0]
    return {
        "rate": rate,
        **_percentiles(received["latencies"]),
        "received": received["received"],
        "send_late_p99_us": _percentiles(published["lateness"].get("lat", []))["p99_us"],
    }


def _slow_consumer(
    url: str, broker: subprocess.Popen[str], slow_rate: float, fast_rate: float, duration: float
) -> dict[str, Any]:
    # Both subscribers outlive the publisher: a subscriber that left early
    # would free the publisher's slow channel and flatter its rate.
    slow = _worker(
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
    fast = _worker(
        {"role": "sub", "url": url, "topic": "fast", "latency": True, "duration": duration + 5}
    )
    _wait_ready(slow)
    _wait_ready(fast)
    rss_start = _proc_status(broker.pid, "VmRSS")
    samples: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.25):
            samples.append(_proc_status(broker.pid, "VmRSS"))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    pub = _worker(
        {
            "role": "pub",
            "url": url,
            "topics": [{"name": "slow"}, {"name": "fast", "rate": fast_rate}],
            "duration": duration,
        }
    )
    slow_result = _result(slow, duration + 120)["subscribers"][0]
    published = _result(pub, duration + 120)
    fast_result = _result(fast, duration + 120)["subscribers"][0]
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
        **{f"fast_{k}": v for k, v in _percentiles(fast_result["latencies"]).items()},
        "fast_send_late_p99_us": _percentiles(published["lateness"].get("fast", []))["p99_us"],
    }


def run(
    quick: bool = False, progress: Callable[[str], None] = lambda _step: None, **options: Any
) -> dict[str, Any]:
    """Run every workload against a fresh broker process; returns the figures.
    ``progress`` is told, in a few words, which workload starts."""
    count = 20_000 if quick else 200_000
    runs = 1 if quick else 3
    slow_duration = 3.0 if quick else float(options.get("slow_seconds", 60))
    results: dict[str, Any] = {
        "python_loop_10m_s": python_loop_10m_s(),
        # How the throughput runs' subscribers take their messages.
        "throughput_subscribers_call": "receive_batch",
    }
    with _broker_process() as (url, broker):
        cpu0 = _cpu_seconds(broker.pid)
        t0 = time.perf_counter()
        progress(f"1->1 throughput, {runs} x {count:,} messages")
        one = _median_runs(url, runs, count, 1)
        cpu1 = _cpu_seconds(broker.pid)
        results["one_to_one_msgs_per_s"] = one["per_s"]
        results["one_to_one_lost"] = one["lost"]
        results["one_to_one_broker_cpu_s_per_million"] = (cpu1 - cpu0) / (count * runs) * 1e6
        results["one_to_one_publisher_cpu"] = one["publisher_cpu"]
        results["one_to_one_subscriber_cpu"] = one["subscriber_cpu"]
        cpu1 = _cpu_seconds(broker.pid)
        progress(f"1->10 fan-out, {runs} x {count // 2:,} messages")
        fan = _median_runs(url, runs, count // 2, 10)
        cpu2 = _cpu_seconds(broker.pid)
        results["fanout_1_to_10_deliveries_per_s"] = fan["per_s"]
        results["fanout_broker_cpu_s_per_million_deliveries"] = (
            (cpu2 - cpu1) / (count // 2 * 10 * runs) * 1e6
        )
        results["fanout_subscriber_cpu"] = fan["subscriber_cpu"]
        results["fanout_subscriber_processes"] = fan["subscriber_processes"]
        results["fanout_lost"] = fan["lost"]
        # The same with every message taken by its own receive() call.
        progress("1->10 fan-out with one receive() per message")
        each = _median_runs(url, runs, count // 2, 10, batch=False)
        results["fanout_receive_each_deliveries_per_s"] = each["per_s"]
        results["fanout_receive_each_subscriber_cpu"] = each["subscriber_cpu"]
        results["fanout_receive_each_lost"] = each["lost"]
        top = one["per_s"]
        for rate in (1_000, 5_000, 20_000, int(top * 0.8)):
            progress(f"open-loop latency at {rate:,} msg/s")
            figures = _latency(url, rate, 1.0 if quick else 3.0)
            for key, value in figures.items():
                if key != "rate":
                    results[f"latency_{rate}_{key}"] = value
        results["bench_seconds_so_far"] = time.perf_counter() - t0
        results["broker_peak_rss_mib"] = _proc_status(broker.pid, "VmHWM") / 2**20
    with _broker_process() as (url, broker):
        progress(f"slow consumer for {slow_duration:.0f} s, then its backlog")
        slow = _slow_consumer(url, broker, max(top * 0.01, 50), 1_000, slow_duration)
        results.update({f"slow_{k}" if not k.startswith("slow") else k: v for k, v in slow.items()})
        results["slow_broker_peak_rss_mib"] = _proc_status(broker.pid, "VmHWM") / 2**20
    return results
