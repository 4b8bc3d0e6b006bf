"""``broker bench patterns``: one pattern subscriber over many topics beside
a plain subscriber of one topic.

One broker process with topic logs in a fresh data directory; one
publisher process and one subscriber process per workload, each in its
own process (the machine's cores shared as they would be). The reader
subscribes first; then the publisher publishes ``count`` records of 100
bytes flat out, concurrently with the reading. A rate is ``count`` over
the time from the publisher's start to the reader's last message.

- ``plain``: 1 publisher -> 1 reliable subscriber of one topic;
- ``pattern``: 1 publisher round-robin over ``TOPICS`` topics
  (``pat.0`` ... ``pat.99``) -> one reliable subscriber of ``pat.*``;
  its deliveries are numbered by the pattern, so the reader checks them
  as consecutive (no gap, no duplicate) as the plain one checks offsets;
- ``many``: the same, read by one client with a plain reliable
  subscription per topic (what a pattern replaces);
- ``publish_only``: the same round-robin publisher with no subscriber:
  what publishing to 100 topics from one connection costs by itself;
- ``pattern_ratio``: pattern / plain (the issue's target: >= 0.7), and
  ``pattern_of_publish_only``: pattern / publish_only (what reading them
  all through one pattern subscription leaves of the publisher's rate),
  ``pattern_of_many``: pattern / many;
- the broker's CPU seconds per message of each (``/proc/PID/stat``),
  beside ``python_loop_10m_s``.

The four workloads run in turn, ``rounds`` times (default 3), each round on
topics of its own: a figure is the median of the rounds', a ratio the
median of the rounds' ratios (each from workloads a few seconds apart), so
that one slow moment of a shared machine does not make the result;
``pattern_ratios`` lists every round's. Losses and duplicates are summed
over the rounds; ``*_received`` is the fewest any round received.

The broker runs with a ``connection_budget`` that funds the publisher's
100 topics at once (``TOPICS x (max_frame + 64)`` plus the bind channels,
as docs/operations.md advises for a client that writes to many topics): at
the default (63 topics at once) a round robin over 100 rebinds a topic on
every publish and runs at under a thousand messages a second.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from ._log_workloads import log_broker
from ._procs import cpu_seconds, proc_status, wait_ready, worker, worker_result
from ._yardstick import python_loop_10m_s
from .groups import plain_run

#: Topics the pattern subscriber reads.
TOPICS = 100
#: The broker's connection_budget: the publisher's TOPICS channels funded at once.
CONNECTION_BUDGET = 8 * 1024 * 1024


def _round_robin(
    url: str, prefix: str, count: int, topics: int, reader: dict[str, Any] | None
) -> dict[str, Any]:
    """``count`` records published round-robin over ``topics`` topics
    (``<prefix>.0`` ...) by one publisher process, while a ``reader``
    worker (its spec; None: nobody) reads them; the figures."""
    reading = None
    if reader is not None:
        reading = worker({**reader, "url": url, "options": {"from": "earliest"}, "count": count})
        wait_ready(reading)
    names = [{"name": f"{prefix}.{index}"} for index in range(topics)]
    pub = worker({"role": "pub", "url": url, "topics": names, "count": count, "round_robin": True})
    published = worker_result(pub, 900)
    publisher_seconds = max((published["end"] - published["start"]) / 1e9, 1e-9)
    if reading is None:
        return {"msgs_per_s": count / publisher_seconds, "seconds": publisher_seconds}
    got = worker_result(reading, 900)
    seconds = max((got["last"] - published["start"]) / 1e9, 1e-9)
    return {
        "msgs_per_s": got["received"] / seconds,
        "seconds": seconds,
        "received": got["received"],
        "lost": count - got["received"] + got["gaps"],
        "duplicates": got["duplicates"],
        "publisher_msgs_per_s": count / publisher_seconds,
        "subscriber_cpu_s": got["cpu_s"],
    }


def pattern_run(url: str, prefix: str, count: int, topics: int = TOPICS) -> dict[str, Any]:
    """``count`` records published round-robin over ``topics`` topics while
    one subscriber of ``<prefix>.*`` reads them (see the module)."""
    reader = {"role": "logsub", "topic": f"{prefix}.*", "idle": 60.0}
    return _round_robin(url, prefix, count, topics, reader)


def many_run(url: str, prefix: str, count: int, topics: int = TOPICS) -> dict[str, Any]:
    """The same, read by one client with a plain reliable subscription per
    topic (what a pattern replaces)."""
    names = [f"{prefix}.{index}" for index in range(topics)]
    return _round_robin(url, prefix, count, topics, {"role": "logsubs", "topics": names})


def publish_only_run(url: str, prefix: str, count: int, topics: int = TOPICS) -> dict[str, Any]:
    """The same publisher, read by nobody."""
    return _round_robin(url, prefix, count, topics, None)


#: Rounds of the four workloads (see the module).
ROUNDS = 3
#: Figures summed over the rounds rather than taken at their median.
_SUMMED = ("lost", "duplicates")


def run(
    quick: bool = False,
    progress: Callable[[str], None] = lambda _step: None,
    *,
    count: int | None = None,
    rounds: int | None = None,
    **_options: Any,
) -> dict[str, Any]:
    """The four workloads against one fresh log broker, ``rounds`` times in
    turn; returns the figures (flat, as the other suites'). ``count``:
    records per workload (default 200,000; ``quick``, 20,000); ``rounds``:
    default 3 (``quick``, 1)."""
    started = time.perf_counter()
    count = count or (20_000 if quick else 200_000)
    rounds = rounds or (1 if quick else ROUNDS)
    results: dict[str, Any] = {
        "python_loop_10m_s": python_loop_10m_s(),
        "records": count,
        "payload_bytes": 100,
        "topics": TOPICS,
        "rounds": rounds,
        "published": "concurrently with the reading",
        "connection_budget": CONNECTION_BUDGET,
    }
    #: (figures' key, topics' prefix, what it is, how it runs)
    workloads: list[tuple[str, str, str, Callable[[str, str, int], dict[str, Any]]]] = [
        ("plain", "plain", "plain reliable 1->1 on one log topic", plain_run),
        (
            "pattern",
            "pat",
            f"1 publisher round-robin over {TOPICS} topics -> 'pat<round>.*'",
            pattern_run,
        ),
        ("many", "many", f"the same, read by {TOPICS} plain subscriptions of one client", many_run),
        (
            "publish_only",
            "alone",
            f"the same publisher, {TOPICS} topics, nobody reading",
            publish_only_run,
        ),
    ]
    per_round: list[dict[str, Any]] = []
    with log_broker(["--set", f"connection_budget={CONNECTION_BUDGET}"]) as (
        url,
        process,
        _data_dir,
    ):
        pid = process.pid
        for round_ in range(rounds):
            figures: dict[str, Any] = {}
            for key, prefix, what, workload in workloads:
                progress(f"round {round_ + 1} of {rounds}: {what}, {count:,} records")
                before = cpu_seconds(pid)
                got = workload(url, f"{prefix}{round_}", count)
                figures[f"{key}_broker_cpu_s_per_msg"] = (cpu_seconds(pid) - before) / count
                figures.update({f"{key}_{k}": v for k, v in got.items()})
            figures["pattern_ratio"] = figures["pattern_msgs_per_s"] / figures["plain_msgs_per_s"]
            figures["pattern_of_publish_only"] = (
                figures["pattern_msgs_per_s"] / figures["publish_only_msgs_per_s"]
            )
            figures["pattern_of_many"] = figures["pattern_msgs_per_s"] / figures["many_msgs_per_s"]
            per_round.append(figures)
        results["broker_rss_anon_mib"] = proc_status(pid, "RssAnon") / 2**20
    for key in per_round[0]:
        values = [figures[key] for figures in per_round]
        if key.endswith(_SUMMED):
            results[key] = sum(values)
        elif key.endswith("_received"):
            results[key] = min(values)
        else:
            results[key] = statistics.median(values)
    results["pattern_ratios"] = [figures["pattern_ratio"] for figures in per_round]
    results["bench_seconds"] = time.perf_counter() - started
    return results


def table(result: dict[str, Any]) -> list[str]:
    """The figures as lines of a table."""
    lines = [
        f"python_loop_10m_s {result['python_loop_10m_s']:.2f}; {result['records']:,} records "
        f"of {result['payload_bytes']} B per workload, published concurrently; "
        f"median of {result['rounds']} rounds",
        f"{'workload':<26} {'msg/s':>10} {'broker us/msg':>14} {'received':>9} "
        f"{'lost':>5} {'dups':>5}",
    ]
    topics = result["topics"]
    for key, name in (
        ("plain", "plain 1->1"),
        ("pattern", f"pattern over {topics}"),
        ("many", f"{topics} plain subscriptions"),
    ):
        lines.append(
            f"{name:<26} {result[key + '_msgs_per_s']:>10,.0f} "
            f"{result[key + '_broker_cpu_s_per_msg'] * 1e6:>14.2f} "
            f"{result[key + '_received']:>9,} {result[key + '_lost']:>5} "
            f"{result[key + '_duplicates']:>5}"
        )
    lines.append(
        f"{'publish only, ' + str(result['topics']) + ' topics':<26} "
        f"{result['publish_only_msgs_per_s']:>10,.0f} "
        f"{result['publish_only_broker_cpu_s_per_msg'] * 1e6:>14.2f}"
    )
    rounds = ", ".join(f"{ratio:.2f}" for ratio in result["pattern_ratios"])
    lines.append(
        f"pattern / plain: {result['pattern_ratio']:.2f} (goal >= 0.7; rounds: {rounds}); "
        f"pattern / publish only: {result['pattern_of_publish_only']:.2f}; "
        f"pattern / {result['topics']} subscriptions: {result['pattern_of_many']:.2f}"
    )
    return lines
