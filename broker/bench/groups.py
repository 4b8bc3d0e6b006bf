"""``broker bench groups``: consumer groups beside a plain reliable subscriber.

One broker process with topic logs in a fresh data directory; one
publisher process; each member (and the plain subscriber) in its own
process, so that the machine's cores are shared as they would be. Each
workload has its own topic; its readers subscribe from ``"earliest"``
first, then the publisher publishes ``count`` records of 100 bytes flat
out *concurrently* with their reading (a live rate, as ``broker bench
broker``'s 1->1). A rate is ``count`` over the time from the publisher's
start to the last reader's last message.

- ``plain``: 1 publisher -> 1 plain reliable subscriber;
- ``group_<n>`` for n = 1, 2, 4: 1 publisher -> a group of n members, each
  acking every message; the members stop together once they have acked
  ``count`` distinct offsets between them (each shares its count through a
  file, see ``_group_worker``). Per member: its count; the split as the
  largest deviation of a member's share from an even share (percent); and
  the exactly-once check: distinct offsets seen == published, duplicates
  (offsets delivered more than once) == 0, and offsets outside 1..count == 0;
- ``group_1_ratio``: group of 1 / plain (target >= 0.8);
- the broker's CPU seconds per message of each workload (``/proc/PID/stat``),
  beside ``python_loop_10m_s``.
"""

from __future__ import annotations

import tempfile
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from ._log_workloads import log_broker
from ._procs import cpu_seconds, proc_status, wait_ready, worker, worker_result
from ._yardstick import python_loop_10m_s

#: Group sizes measured.
SIZES = (1, 2, 4)
#: Each member's ``max_outstanding``.
MAX_OUTSTANDING = 1000


def plain_run(url: str, topic: str, count: int) -> dict[str, Any]:
    """1 publisher -> 1 plain reliable subscriber from ``"earliest"`` on
    ``topic``, ``count`` records published while it reads."""
    reader = worker(
        {
            "role": "logsub",
            "url": url,
            "topic": topic,
            "options": {"from": "earliest"},
            "count": count,
            "idle": 60.0,
        }
    )
    wait_ready(reader)
    pub = worker({"role": "pub", "url": url, "topics": [{"name": topic}], "count": count})
    published = worker_result(pub, 900)
    got = worker_result(reader, 900)
    seconds = max((got["last"] - published["start"]) / 1e9, 1e-9)
    return {
        "msgs_per_s": got["received"] / seconds,
        "seconds": seconds,
        "received": got["received"],
        "lost": count - got["received"] + got["gaps"],
        "duplicates": got["duplicates"],
        "publisher_msgs_per_s": count / max((published["end"] - published["start"]) / 1e9, 1e-9),
    }


def group_run(
    url: str, topic: str, count: int, members: int, *, group: str = "bench"
) -> dict[str, Any]:
    """``count`` records published to ``topic`` while a group of ``members``
    member processes reads it from ``"earliest"``; see the module."""
    with tempfile.TemporaryDirectory(prefix="broker-bench-group-") as shared:
        spec = {
            "role": "member",
            "url": url,
            "topic": topic,
            "group": group,
            "count": count,
            "shared": shared,
            "max_outstanding": MAX_OUTSTANDING,
        }
        procs = [worker({**spec, "index": index}) for index in range(members)]
        for proc in procs:
            wait_ready(proc)
        pub = worker({"role": "pub", "url": url, "topics": [{"name": topic}], "count": count})
        published = worker_result(pub, 900)
        results = [worker_result(proc, 900) for proc in procs]
    seen: Counter[int] = Counter()
    for result in results:
        seen.update(result["offsets"])
    last = max(r["last"] for r in results)
    seconds = max((last - published["start"]) / 1e9, 1e-9)
    counts = [r["received"] for r in results]
    even = count / members
    return {
        "msgs_per_s": sum(counts) / seconds,
        "seconds": seconds,
        "member_counts": counts,
        "split_max_deviation_pct": max(abs(c - even) for c in counts) / even * 100,
        "split_min_pct_of_even": min(counts) / even * 100,
        "split_max_pct_of_even": max(counts) / even * 100,
        "distinct_offsets": len(seen),
        "published": count,
        "duplicates": sum(n - 1 for n in seen.values()),
        "outside_range": sum(1 for o in seen if not 1 <= o <= count),
        "redelivered": sum(r["redelivered"] for r in results),
        "exactly_once": len(seen) == count
        and all(n == 1 for n in seen.values())
        and all(1 <= o <= count for o in seen),
        "publisher_msgs_per_s": count / max((published["end"] - published["start"]) / 1e9, 1e-9),
        "member_cpu_s": [r["cpu_s"] for r in results],
    }


def run(
    quick: bool = False,
    progress: Callable[[str], None] = lambda _step: None,
    *,
    count: int | None = None,
    **_options: Any,
) -> dict[str, Any]:
    """Every workload of the module against one fresh log broker; returns
    the figures (flat, as the other suites'). ``count``: records per
    workload (default 200,000; ``quick``, 20,000)."""
    started = time.perf_counter()
    count = count or (20_000 if quick else 200_000)
    results: dict[str, Any] = {
        "python_loop_10m_s": python_loop_10m_s(),
        "records": count,
        "payload_bytes": 100,
        "published": "concurrently with the reading",
        "max_outstanding": MAX_OUTSTANDING,
    }
    with log_broker() as (url, process, _data_dir):
        pid = process.pid
        progress(f"plain reliable 1->1 on a log topic, {count:,} records")
        before = cpu_seconds(pid)
        plain = plain_run(url, "plain", count)
        results["plain_broker_cpu_s_per_msg"] = (cpu_seconds(pid) - before) / count
        results.update({f"plain_{k}": v for k, v in plain.items()})
        for members in SIZES:
            progress(f"a group of {members}, {count:,} records")
            before = cpu_seconds(pid)
            figures = group_run(url, f"group-{members}", count, members)
            results[f"group_{members}_broker_cpu_s_per_msg"] = (cpu_seconds(pid) - before) / count
            results.update({f"group_{members}_{k}": v for k, v in figures.items()})
        results["group_1_ratio"] = results["group_1_msgs_per_s"] / results["plain_msgs_per_s"]
        results["broker_rss_anon_mib"] = proc_status(pid, "RssAnon") / 2**20
        results["broker_peak_rss_mib"] = proc_status(pid, "VmHWM") / 2**20
    results["exactly_once"] = all(results[f"group_{n}_exactly_once"] for n in SIZES)
    results["bench_seconds"] = time.perf_counter() - started
    return results


def table(result: dict[str, Any]) -> list[str]:
    """The figures as lines of a table."""
    lines = [
        f"python_loop_10m_s {result['python_loop_10m_s']:.2f}; {result['records']:,} records "
        f"of {result['payload_bytes']} B per workload, published concurrently",
        f"{'workload':<10} {'msg/s':>10} {'broker us/msg':>14} {'split dev %':>12} "
        f"{'distinct':>9} {'dups':>5}  per member",
        f"{'plain 1->1':<10} {result['plain_msgs_per_s']:>10,.0f} "
        f"{result['plain_broker_cpu_s_per_msg'] * 1e6:>14.2f} {'':>12} "
        f"{result['plain_received']:>9,} {result['plain_duplicates']:>5}",
    ]
    for n in SIZES:
        key = f"group_{n}"
        lines.append(
            f"{f'group of {n}':<10} {result[key + '_msgs_per_s']:>10,.0f} "
            f"{result[key + '_broker_cpu_s_per_msg'] * 1e6:>14.2f} "
            f"{result[key + '_split_max_deviation_pct']:>12.1f} "
            f"{result[key + '_distinct_offsets']:>9,} {result[key + '_duplicates']:>5}  "
            + ", ".join(f"{c:,}" for c in result[key + "_member_counts"])
        )
    lines.append(
        f"group of 1 / plain: {result['group_1_ratio']:.2f} (goal >= 0.8); "
        f"exactly once: {'yes' if result['exactly_once'] else 'NO'}"
    )
    return lines
