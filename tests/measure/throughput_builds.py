"""``broker bench broker``'s 1->1, 1->10 and 1,000 msg/s workloads, build
against build, alternated in many short phases.

A full ``broker bench broker`` run takes four minutes and gives each figure
as the median of three runs, whose spread on a shared 2-core machine
(±6%) is wider than the differences between two builds worth finding. This
runs the same workloads in phases of about fifteen seconds, each in a
fresh process that imports one build's own bench (``PYTHONPATH``: its
brokers, its clients, its ``fan`` and ``rates_table``), the builds taking
turns (ABBA), so that many phases of each can be pooled:

- ``1to1``: a memory-only broker and a topic-log broker, as the bench
  starts them, each given three 1->1 runs of 200,000 messages in turn;
- ``1to10``: the same with 100,000 messages to ten subscribers;
- ``rate1k``: the bench's 1,000 msg/s row (``rates_table``) twice, each on
  a fresh broker: broker CPU per message, p50, task steps per message.

Each phase prints one JSON line (its medians, the broker CPU per message
from ``/proc``, ``python_loop_10m_s``); the end prints, per figure, each
build's median over its phases and its ratio to the first build's.

    python tests/measure/throughput_builds.py --rounds 8 --workload 1to1 \\
        old=/path/to/old/tree new=.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from typing import Any

#: What a phase runs, in the build's own process (its bench's functions).
_PHASE = r"""
import json, statistics, sys
workload = sys.argv[1]
from broker.bench._yardstick import python_loop_10m_s
out = {"python_loop_10m_s": python_loop_10m_s()}
if workload == "rate1k":
    from broker.bench._rates import rates_table
    runs = [rates_table(5.0, (1_000,)) for _ in range(2)]
    for key in ("broker_cpu_us_per_msg", "p50_us", "task_steps_per_msg"):
        out[f"rate1k_{key}"] = statistics.median(r[f"rate_1000_{key}"] for r in runs)
else:
    from broker.bench._procs import broker_process, cpu_seconds, fan
    from broker.bench._log_workloads import log_broker
    subscribers = 1 if workload == "1to1" else 10
    count = 200_000 if workload == "1to1" else 100_000
    figures = {}
    with broker_process() as (url, mem), log_broker() as (log_url, log, _):
        kinds = [("mem", url, mem.pid), ("log", log_url, log.pid)]
        for round_ in range(3):
            for kind, at, pid in kinds if round_ % 2 == 0 else kinds[::-1]:
                before = cpu_seconds(pid)
                rate = fan(at, count, subscribers)["per_s"]
                cpu = (cpu_seconds(pid) - before) / (count * subscribers) * 1e6
                figures.setdefault(f"{kind}_per_s", []).append(rate)
                figures.setdefault(f"{kind}_broker_cpu_us", []).append(cpu)
    out.update({k: statistics.median(v) for k, v in figures.items()})
print(json.dumps(out))
"""


def phase(tree: str, workload: str) -> dict[str, float]:
    """One phase of ``workload`` with the build in ``tree``: its medians."""
    env = {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
    done = subprocess.run(
        [sys.executable, "-c", _PHASE, workload],
        env=env,
        cwd=os.path.abspath(tree),
        stdout=subprocess.PIPE,
        text=True,
        check=True,
        timeout=900,
    )
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("builds", nargs="+", help="NAME=TREE (the first is the yardstick)")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--workload", choices=["1to1", "1to10", "rate1k"], default="1to1")
    args = parser.parse_args()
    if bad := [spec for spec in args.builds if "=" not in spec]:
        parser.error(f"a build is NAME=TREE, not {bad[0]!r}")
    builds = [tuple(spec.split("=", 1)) for spec in args.builds]
    phases: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in builds}
    for round_ in range(args.rounds):
        for name, tree in builds if round_ % 2 == 0 else builds[::-1]:
            result = phase(tree, args.workload)
            phases[name].append(result)
            print(json.dumps({"build": name, "round": round_, **result}), flush=True)
    first = builds[0][0]
    for key in phases[first][0]:
        medians = {name: statistics.median(p[key] for p in runs) for name, runs in phases.items()}
        shown = "; ".join(
            f"{name} {value:.4g} ({value / medians[first]:.3f})" for name, value in medians.items()
        )
        print(f"{key}: {shown}")


if __name__ == "__main__":
    main()
