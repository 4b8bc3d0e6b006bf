"""The 1,000 msg/s open-loop latency of ``broker bench broker``, old build
against new, alternated.

Each run starts a memory-only broker process and the bench's open-loop
publisher and subscriber (``broker.bench._worker``) as the bench does, each
process importing the source tree its configuration names (``PYTHONPATH``),
so that the broker and the clients can come from different builds. With
``--warm N`` the broker first serves what the bench runs before its latency
runs, smaller: 1->1 of N messages, 1->10 of N/2 with ``receive_batch()``
and with one ``receive()`` each. Rounds alternate the configurations
(ABBA); each run prints p50 and p99 (us), the broker's CPU per message over
the middle of the run (us) and ``python_loop_10m_s``; the end prints the
medians and, against the first configuration, the paired p50 ratios.

    python tests/measure/latency_builds.py --rounds 10 \
        old=/path/to/old/tree new=. [new-broker=.,/path/to/old/tree]

A configuration is ``NAME=BROKER_TREE[,CLIENT_TREE]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _process import free_port


def _env(tree: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.path.abspath(tree)}


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _python_loop_10m_s() -> float:
    start = time.perf_counter()
    total = 0
    for i in range(10_000_000):
        total += i
    return time.perf_counter() - start


def _worker(tree: str, spec: dict[str, Any]) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "broker.bench._worker", json.dumps(spec)]
    return subprocess.Popen(command, env=_env(tree), stdout=subprocess.PIPE, text=True, cwd="/")


def _ready(process: subprocess.Popen[str]) -> None:
    assert process.stdout is not None
    line = process.stdout.readline()
    if line.strip() != "ready":
        raise RuntimeError(f"subscriber worker failed: {line!r}")


def _result(process: subprocess.Popen[str]) -> dict[str, Any]:
    out, _ = process.communicate(timeout=300)
    if process.returncode:
        raise RuntimeError(f"worker failed with status {process.returncode}")
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def _warm(url: str, tree: str, count: int) -> None:
    """What the bench runs on the broker before its latency runs, smaller."""
    for messages, subscribers, batch in (
        (count, 1, True),
        (count // 2, 10, True),
        (count // 2, 10, False),
    ):
        spec = {"role": "sub", "url": url, "topic": "bench", "count": messages, "batch": batch}
        shares = [subscribers // 2, subscribers - subscribers // 2] if subscribers > 1 else [1]
        subs = [_worker(tree, {**spec, "connections": n}) for n in shares]
        for sub in subs:
            _ready(sub)
        pub = {"role": "pub", "url": url, "topics": [{"name": "bench"}], "count": messages}
        _result(_worker(tree, pub))
        for sub in subs:
            _result(sub)


def one_run(
    broker_tree: str, client_tree: str, rate: float, seconds: float, warm: int
) -> dict[str, float]:
    port = free_port()
    command = [sys.executable, "-m", "broker", "--log-level", "WARNING", "serve"]
    command += [
        "--listen",
        f"127.0.0.1:{port}",
        "--metrics-listen",
        "",
        "--set",
        "memory_only=true",
    ]
    broker = subprocess.Popen(
        command, env=_env(broker_tree), stdout=subprocess.PIPE, text=True, cwd="/"
    )
    try:
        assert broker.stdout is not None
        if "listening" not in broker.stdout.readline():
            raise RuntimeError("broker did not start")
        url = f"127.0.0.1:{port}"
        if warm:
            _warm(url, client_tree, warm)
        sub_spec = {"role": "sub", "latency": True, "url": url, "topic": "lat"}
        sub = _worker(client_tree, {**sub_spec, "count": int(rate * seconds)})
        _ready(sub)
        pub_spec = {"role": "pub", "topics": [{"name": "lat", "rate": rate}], "url": url}
        pub = _worker(client_tree, {**pub_spec, "duration": seconds})
        time.sleep(1.0)  # (the publisher starts and connects: left out of the CPU window)
        t0, cpu0 = time.perf_counter(), _cpu_seconds(broker.pid)
        time.sleep(max(seconds - 1.5, 0.5))
        t1, cpu1 = time.perf_counter(), _cpu_seconds(broker.pid)
        _result(pub)
        latencies = sorted(_result(sub)["subscribers"][0]["latencies"])
    finally:
        broker.terminate()
        broker.wait(10)
        if broker.stdout is not None:
            broker.stdout.close()

    def at(q: float) -> float:
        return float(latencies[min(len(latencies) - 1, int(q * len(latencies)))]) / 1000

    return {
        "p50_us": at(0.5),
        "p99_us": at(0.99),
        "broker_cpu_us_per_msg": (cpu1 - cpu0) / (rate * (t1 - t0)) * 1e6,
        "python_loop_10m_s": _python_loop_10m_s(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("configs", nargs="+", help="NAME=BROKER_TREE[,CLIENT_TREE]")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--warm", type=int, default=0, help="messages of 1->1 first (0: none)")
    args = parser.parse_args()
    configs = []
    for text in args.configs:
        name, _, trees = text.partition("=")
        broker_tree, _, client_tree = trees.partition(",")
        configs.append((name, broker_tree, client_tree or broker_tree))
    runs: dict[str, list[dict[str, float]]] = {name: [] for name, _, _ in configs}
    for index in range(args.rounds):
        for name, broker_tree, client_tree in configs if index % 2 == 0 else configs[::-1]:
            figures = one_run(broker_tree, client_tree, args.rate, args.seconds, args.warm)
            runs[name].append(figures)
            shown = " ".join(
                f"{key} {value:.3f}" if key.startswith("python") else f"{key} {value:.0f}"
                for key, value in figures.items()
            )
            print(f"{index} {name}: {shown}", flush=True)
    first = configs[0][0]
    for name, results in runs.items():
        medians = {key: statistics.median(r[key] for r in results) for key in results[0]}
        print(
            f"{name}: medians " + " ".join(f"{key} {value:.3g}" for key, value in medians.items())
        )
        if name != first:
            ratios = [r["p50_us"] / b["p50_us"] for r, b in zip(results, runs[first], strict=True)]
            worse = sum(ratio > 1 for ratio in ratios)
            median = statistics.median(ratios)
            print(f"  p50 {name}/{first}: median {median:.3f}, higher in {worse} of {len(ratios)}")


if __name__ == "__main__":
    main()
