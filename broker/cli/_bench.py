"""``broker bench``: the project's own benchmarks, as a table or JSON."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from ._common import Subparsers, add_command

#: Benchmark suites: name -> (module, help). Imported lazily so that
#: ``broker --help`` stays fast and needs nothing beyond the core dependencies.
BENCH_SUITES: dict[str, tuple[str, str]] = {
    "actors": ("broker.bench.actors", "loaned sends through actor mailboxes"),
    "protocol": ("broker.bench.protocol", "frame encode/decode and the sans-IO connection"),
    "broker": (
        "broker.bench.broker",
        "a real broker process: 1->1, 1->10, latency, slow consumer; "
        "with topic logs: 1->1, 1->10, replay, slow consumer on one topic",
    ),
    "peers": (
        "broker.bench.peers",
        "this broker beside Mosquitto (QoS 1 and 0) and two minimal relays (the trio and "
        "Python floors) "
        "at 100, 1k and 10k msg/s, same run, same open-loop method (needs mosquitto; "
        "not run by default)",
    ),
    "mqtt": (
        "broker.bench.mqtt",
        "the MQTT listener beside Mosquitto, same MQTT clients: QoS 1 1->1 and 1->10 "
        "flat out, p50/p99 and broker CPU at 1k msg/s, a 200 KB/s slow consumer beside a "
        "fast one (loss, rate, RssAnon) (needs mosquitto; not run by default)",
    ),
    "groups": (
        "broker.bench.groups",
        "consumer groups on a log broker: plain 1->1 beside groups of 1, 2 and 4 members "
        "(rate, split, exactly-once check, broker CPU per message)",
    ),
    "patterns": (
        "broker.bench.patterns",
        "a pattern subscriber over 100 topics (one publisher round-robin) beside plain "
        "1->1 on a log broker (rate, loss check, broker CPU per message)",
    ),
    "workers": (
        "broker.bench.workers",
        "--workers 2 beside one process: messages per worker CPU-second with clients "
        "at each topic's owner and with every message forwarded (not run by default)",
    ),
    "cluster": (
        "broker.bench.cluster",
        "a cluster-mode front end over 3 nats-servers beside a standalone log broker: "
        "1->1, 1->10 per broker CPU-second, confirm and delivery latency at 1k msg/s "
        "(needs nats-server; not run by default)",
    ),
}

#: What ``broker bench`` without a suite runs: every suite that needs no
#: other software (``peers`` and ``mqtt`` need mosquitto, ``cluster`` nats-server; they
#: are asked for by name) and is not a comparison of deployments
#: (``workers``, asked for by name).
DEFAULT_SUITES = [
    suite for suite in BENCH_SUITES if suite not in ("peers", "mqtt", "workers", "cluster")
]

EXAMPLES = """
  broker bench                                  # all but peers, mqtt, workers, cluster
  broker bench actors protocol --quick          # short runs of two suites
  broker bench broker --json > bench.json       # progress on the terminal, JSON on stdout
  broker bench broker --log-only --quick        # topic-log workloads (and their baselines)
  broker bench peers                            # beside Mosquitto at 100, 1k, 10k msg/s
  broker bench mqtt                             # the MQTT listener beside Mosquitto
  broker bench mqtt --slow-consumer             # only its slow-consumer workload
  broker bench workers                          # --workers 2 (direct, forwarded) beside one process
  broker bench groups --quick                   # consumer groups of 1, 2, 4 beside plain 1->1
  broker bench patterns                         # 'pat.*' over 100 topics beside plain 1->1
  broker bench cluster                          # a front end over JetStream beside standalone
"""


def add_parser(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "bench",
        help="run the project's benchmarks",
        description="Run benchmark suites and print their figures (a table, or JSON). "
        "On a terminal, progress goes to stderr; stdout is only the result.",
        examples=EXAMPLES,
    )
    parser.add_argument(
        "suites",
        nargs="*",
        # (Checked in run: Python 3.11's argparse refuses an empty list
        # against choices for nargs="*".)
        metavar="{" + ",".join(sorted(BENCH_SUITES)) + "}",
        help="which suites to run (default: all but peers, mqtt, workers and cluster); "
        + "; ".join(f"{k}: {v[1]}" for k, v in BENCH_SUITES.items()),
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--quick", action="store_true", help="short runs (for smoke tests)")
    parser.add_argument(
        "--log-only",
        action="store_true",
        help="broker suite: only the topic-log workloads and the memory-only 1->1 and 1->10 "
        "they are compared with",
    )
    parser.add_argument(
        "--slow-consumer",
        action="store_true",
        help="mqtt suite: only the slow-consumer workload (a 200 KB/s subscriber beside a "
        "fast one, on both brokers)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import importlib

    unknown = [suite for suite in args.suites if suite not in BENCH_SUITES]
    if unknown:
        print(
            f"broker bench: unknown suite {unknown[0]!r} (choose from {', '.join(BENCH_SUITES)})",
            file=sys.stderr,
        )
        return 2

    # Progress goes to a terminal's stderr only: stdout stays the result.
    def progress(step: str) -> None:
        print(f"  {step}...", file=sys.stderr, flush=True)

    on_terminal = sys.stderr.isatty()
    results: dict[str, Any] = {}
    tables: dict[str, Callable[[dict[str, Any]], list[str]]] = {}
    status = 0
    suites = args.suites or DEFAULT_SUITES
    for number, suite in enumerate(suites, 1):
        module = importlib.import_module(BENCH_SUITES[suite][0])
        # A suite that needs other software says so in one line, and is left out.
        why_not: str | None = getattr(module, "unavailable", lambda: None)()
        if why_not:
            print(why_not, file=sys.stderr)
            status = 1
            continue
        bench: Callable[..., dict[str, Any]] = module.run
        if hasattr(module, "table"):
            tables[suite] = module.table
        if on_terminal:
            print(f"[{number}/{len(suites)}] {suite}: {BENCH_SUITES[suite][1]}", file=sys.stderr)
        extra: dict[str, Any] = {"log_only": True} if suite == "broker" and args.log_only else {}
        if suite == "mqtt" and args.slow_consumer:
            extra["slow_consumer_only"] = True
        progressing = ("broker", "peers", "mqtt", "workers", "groups", "patterns", "cluster")
        if suite in progressing and on_terminal:
            extra["progress"] = progress
        results[suite] = bench(quick=args.quick, **extra)
    if not results:
        return status
    if args.json:
        json.dump(results, sys.stdout, indent=2)
        print()
    else:
        for suite, result in results.items():
            print(f"== {suite}")
            if suite in tables:
                print("\n".join(f"  {line}" for line in tables[suite](result)))
                continue
            width = max(len(k) for k in result)
            for key, value in result.items():
                shown = f"{value:,.0f}" if isinstance(value, float) and value > 100 else value
                print(f"  {key:<{width}}  {shown}")
    return status
