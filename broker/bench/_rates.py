"""Open-loop latency runs, and what the broker pays per message at fixed
everyday rates: CPU, task steps and sleeping I/O waits (issue 22)."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Callable
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


def latency(
    url: str, rate: float, duration: float, *, mqtt_qos: int | None = None, raw: bool = False
) -> dict[str, float]:
    """One publisher at ``rate`` msg/s (open loop: each payload carries its
    scheduled send time) to one subscriber for ``duration`` seconds: the
    latency percentiles (µs), how many arrived, and how late the sender was.
    The clients are the project's (``open_client``), or with ``raw`` minimal
    clients of the sans-IO protocol (``_raw_worker``); with ``mqtt_qos``,
    minimal MQTT 3.1.1 clients at that QoS, to the MQTT broker at ``url``."""
    if raw:
        sub_spec: dict[str, Any] = {"role": "raw_sub", "timeout": duration + 30}
        pub_spec: dict[str, Any] = {"role": "raw_pub", "topic": "lat", "rate": rate}
    elif mqtt_qos is None:
        sub_spec = {"role": "sub", "latency": True}
        pub_spec = {"role": "pub", "topics": [{"name": "lat", "rate": rate}]}
    else:
        sub_spec = {"role": "mqtt_sub", "qos": mqtt_qos, "timeout": duration + 30}
        pub_spec = {"role": "mqtt_pub", "qos": mqtt_qos, "topic": "lat", "rate": rate}
    sub = worker({**sub_spec, "url": url, "topic": "lat", "count": int(rate * duration)})
    wait_ready(sub)
    pub = worker({**pub_spec, "url": url, "duration": duration})
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


def at_rate(
    url: str,
    pid: int,
    rate: int,
    duration: float,
    *,
    loop_counters: Callable[[], tuple[int, int]] | None = None,
    mqtt_qos: int | None = None,
    raw: bool = False,
) -> dict[str, float]:
    """One :func:`latency` run at ``rate`` against the broker process ``pid``
    serving ``url``: the latency percentiles (``p50_us``, ``p99_us``), how
    many arrived (``received``), and per message the broker's CPU
    (``broker_cpu_us_per_msg``, from ``/proc``), taken over the middle of
    the run (from 1.5 s after the publisher started to half a second before
    it ends: steady state, connections' set-up and close left out); with
    ``loop_counters`` (the broker's task steps and sleeping I/O waits so
    far), those per message too (``task_steps_per_msg``, ``io_waits_per_msg``)."""
    counters = loop_counters or (lambda: (0, 0))
    window: list[tuple[float, float, int, int]] = []

    def sample() -> None:
        time.sleep(1.5)  # the publisher process starts, connects, sends a while
        # (Reading the counters may cost the broker a /stat.json: the
        # window starts after the first read and ends before the second.)
        steps, waits = counters()
        window.append((time.perf_counter(), cpu_seconds(pid), steps, waits))
        time.sleep(max(duration - 2.5, 0.5))
        end, cpu = time.perf_counter(), cpu_seconds(pid)
        steps, waits = counters()
        window.append((end, cpu, steps, waits))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    figures = latency(url, rate, duration, mqtt_qos=mqtt_qos, raw=raw)
    sampler.join()
    (t0, cpu0, steps0, waits0), (t1, cpu1, steps1, waits1) = window
    messages = max(rate * (t1 - t0), 1.0)
    results = {
        "p50_us": figures["p50_us"],
        "p99_us": figures["p99_us"],
        "received": figures["received"],
        "broker_cpu_us_per_msg": (cpu1 - cpu0) / messages * 1e6,
    }
    if loop_counters is not None:
        results["task_steps_per_msg"] = (steps1 - steps0) / messages
        results["io_waits_per_msg"] = (waits1 - waits0) / messages
    return results


def rates_table(
    duration: float, rates: tuple[int, ...] = TABLE_RATES, *, raw: bool = False
) -> dict[str, Any]:
    """At each of ``rates``, on one fresh memory-only broker counting its
    loop (``loop_counters``): :func:`at_rate`'s figures, keyed
    ``rate_{rate}_{figure}`` (with ``raw``, measured with minimal clients)."""
    results: dict[str, Any] = {}
    metrics_port = free_port()
    extra = ["--set", "loop_counters=true", "--metrics-listen", f"127.0.0.1:{metrics_port}"]
    with broker_process(extra) as (url, process):
        for rate in rates:
            figures = at_rate(
                url,
                process.pid,
                rate,
                duration,
                loop_counters=lambda: _loop_counters(metrics_port),
                raw=raw,
            )
            results.update({f"rate_{rate}_{key}": value for key, value in figures.items()})
    return results
