"""The topic-log workloads of ``broker bench broker`` (issue 21's "Must show").

Each runs against a broker process that keeps topic logs in a fresh
temporary data directory (default log settings: ``flush = "batch"``), and
is reported beside the memory-only figures of the same run:

- 1->1 and 1->10 with the log on, as ratios of the memory-only rates
  (target >= 0.8), with the broker's CPU per million;
- replay: records published first, then read by a new subscription from
  ``"earliest"``, as a rate and as a ratio of the live 1->1 rate (target >= 1);
- the slow consumer on ONE topic: a subscriber reading at 200 KB/s and one
  flat out; the fast one's rate as a ratio of its rate with no slow
  subscriber (target >= 0.8), loss counted at both by offset (gaps and
  duplicates), the broker's anonymous RSS growth (target < 64 MiB; the
  active term's buffer, in ``RssShmem``, reported beside it) and
  the data directory's disk use (within ``retain_bytes`` plus one term).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from broker.config import BrokerConfig

from ._procs import (
    broker_process,
    cpu_seconds,
    proc_status,
    wait_ready,
    worker,
    worker_result,
)

MiB = 1 << 20
#: The slow subscriber's reading rate (payload bytes per second).
SLOW_READER_BYTES_PER_S = 200_000
#: Payload size of every workload here (the publisher worker's default).
PAYLOAD = 100


@contextmanager
def log_broker(extra: list[str] | None = None) -> Iterator[tuple[str, subprocess.Popen[str], str]]:
    """A broker process keeping topic logs in a fresh temporary directory
    (removed afterwards), started with ``extra`` arguments: ``(url,
    process, data_dir)``."""
    with (
        tempfile.TemporaryDirectory(prefix="broker-bench-log-") as data_dir,
        broker_process(extra, data_dir=data_dir) as (url, process),
    ):
        yield url, process, data_dir


def disk_use(path: str) -> int:
    """Bytes the files under ``path`` occupy on disk (allocated blocks)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):  # deleted by retention meanwhile
                total += os.stat(os.path.join(root, name)).st_blocks * 512
    return total


def throughput(
    memory: dict[str, Any],
    one: dict[str, float],
    fan: dict[str, float],
    cpu_one: float,
    cpu_fan: float,
) -> dict[str, Any]:
    """The figures of 1->1 (``one``) and 1->10 (``fan``) on a log broker
    (``cpu_*``: its CPU seconds per million messages, per million
    deliveries), beside ``memory``: the same run's memory-only figures."""
    return {
        "log_one_to_one_msgs_per_s": one["per_s"],
        "log_one_to_one_ratio": one["per_s"] / memory["one_to_one_msgs_per_s"],
        "log_one_to_one_lost": one["lost"],
        "log_one_to_one_broker_cpu_s_per_million": cpu_one,
        "log_fanout_1_to_10_deliveries_per_s": fan["per_s"],
        "log_fanout_ratio": fan["per_s"] / memory["fanout_1_to_10_deliveries_per_s"],
        "log_fanout_lost": fan["lost"],
        "log_fanout_broker_cpu_s_per_million_deliveries": cpu_fan,
    }


def replay(url: str, count: int, live_one_to_one: float, log_one_to_one: float) -> dict[str, Any]:
    """``count`` records published (and confirmed), then all read by a new
    subscription from ``"earliest"``."""
    pub = worker({"role": "pub", "url": url, "topics": [{"name": "replay"}], "count": count})
    published = worker_result(pub, 600)
    reader = worker(
        {
            "role": "logsub",
            "url": url,
            "topic": "replay",
            "options": {"from": "earliest"},
            "count": count,
            "idle": 30.0,
        }
    )
    wait_ready(reader)
    got = worker_result(reader, 600)
    seconds = max((got["last"] - got["subscribed"]) / 1e9, 1e-9)
    rate = got["received"] / seconds
    return {
        "replay_records": count,
        "replay_publish_msgs_per_s": count / ((published["end"] - published["start"]) / 1e9),
        "replay_records_per_s": rate,
        "replay_ratio": rate / live_one_to_one,
        "replay_ratio_to_log_one_to_one": rate / log_one_to_one,
        "replay_first_offset": got["first_offset"],
        "replay_lost": count - got["received"] + got["gaps"],
        "replay_duplicates": got["duplicates"],
    }


def _fast_rate(got: dict[str, Any]) -> float:
    """Messages per second from the first to the last a subscriber got."""
    seconds: float = max((got["last"] - got["first"]) / 1e9, 1e-9)
    return float(got["received"]) / seconds


def _seconds(published: dict[str, Any]) -> float:
    return max(float(published["end"] - published["start"]) / 1e9, 1e-9)


def _sent_rate(published: dict[str, Any], topic: str) -> float:
    return float(published["sent"][topic]) / _seconds(published)


def _publish_for(url: str, topic: str, duration: float) -> dict[str, Any]:
    pub = worker({"role": "pub", "url": url, "topics": [{"name": topic}], "duration": duration})
    return worker_result(pub, duration * 4 + 300)


def _fast_alone(url: str, topic: str, seconds: float) -> dict[str, Any]:
    """A fast subscriber alone on ``topic`` while a publisher is flat out for ``seconds``."""
    fast = worker({"role": "logsub", "url": url, "idle": 3.0, "topic": topic})
    wait_ready(fast)
    published = _publish_for(url, topic, seconds)
    got = worker_result(fast, seconds * 4 + 300)
    return {
        "rate": _fast_rate(got),
        "publisher_rate": _sent_rate(published, topic),
        "lost": published["sent"][topic] - got["received"] + got["gaps"],
        "duplicates": got["duplicates"],
    }


def shared_slow_consumer(
    url: str, process: subprocess.Popen[str], data_dir: str, duration: float, alone: float
) -> dict[str, Any]:
    """A publisher flat out to one topic ("shared") read by a fast
    subscriber and one reading at 200 KB/s for ``duration`` seconds (then
    catching up flat out, so every record is counted in); the fast
    subscriber's rate is compared with its rate alone on a topic (the mean
    of ``alone`` seconds before and ``alone`` seconds after, so that a
    machine whose load changes meanwhile skews the ratio less)."""
    rss_start = proc_status(process.pid, "RssAnon")
    shmem_start = proc_status(process.pid, "RssShmem")
    cpu0 = cpu_seconds(process.pid)
    before = _fast_alone(url, "alone-before", alone)
    cpu1 = cpu_seconds(process.pid)

    # (RssAnon, RssShmem, disk use): the active term's buffer is an
    # anonymous *shared* map, counted in RssShmem, not in RssAnon.
    samples: list[tuple[int, int, int]] = []
    stop = threading.Event()

    def sample() -> None:
        pid = process.pid
        while not stop.wait(0.25):
            samples.append(
                (proc_status(pid, "RssAnon"), proc_status(pid, "RssShmem"), disk_use(data_dir))
            )

    fast_spec = {"role": "logsub", "url": url, "idle": 3.0, "topic": "shared"}
    # The slow subscriber reads slowly a little longer than the publisher
    # publishes: it is slow all the while the fast one is measured.
    slow = worker(
        {
            **fast_spec,
            "name": "bench-slow",
            "rate_bytes": SLOW_READER_BYTES_PER_S,
            "duration": duration + 3,
        }
    )
    fast = worker({**fast_spec, "name": "bench-fast"})
    wait_ready(slow)
    wait_ready(fast)
    rss_shared_start = proc_status(process.pid, "RssAnon")
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        cpu2 = cpu_seconds(process.pid)
        published = _publish_for(url, "shared", duration)
        fast_got = worker_result(fast, duration * 4 + 300)
        cpu3 = cpu_seconds(process.pid)
        slow_got = worker_result(slow, duration * 4 + 600)
    finally:
        stop.set()
        sampler.join()
    after = _fast_alone(url, "alone-after", alone)
    sent = published["sent"]["shared"]
    slow_rated_s = max((slow_got["rated_last"] - slow_got["first"]) / 1e9, 1e-9)
    settings = BrokerConfig().log_config("shared")
    limit = (settings.retain_bytes or 0) + settings.term_bytes  # (the default has a limit)
    rss_max = max([rss for rss, _shm, _disk in samples] or [rss_shared_start])
    shmem_max = max([shm for _rss, shm, _disk in samples] or [shmem_start])
    both_max = max([rss + shm for rss, shm, _disk in samples] or [rss_start + shmem_start])
    disk_max = max([disk for _rss, _shm, disk in samples] or [0])
    alone_rate = (before["rate"] + after["rate"]) / 2
    lost = sum(sent - got["received"] + got["gaps"] for got in (fast_got, slow_got))
    fast_rate = _fast_rate(fast_got)
    return {
        "log_slow_duration_s": duration,
        "log_slow_fast_alone_msgs_per_s": alone_rate,
        "log_slow_fast_alone_before_msgs_per_s": before["rate"],
        "log_slow_fast_alone_after_msgs_per_s": after["rate"],
        "log_slow_fast_alone_lost": before["lost"] + after["lost"],
        "log_slow_fast_msgs_per_s": fast_rate,
        "log_slow_fast_ratio": fast_rate / alone_rate,
        # Where the time went (a busy machine slows everybody): the publisher's
        # rate and the broker's CPU (cores) alone and with the slow subscriber.
        "log_slow_publisher_alone_msgs_per_s": (before["publisher_rate"] + after["publisher_rate"])
        / 2,
        "log_slow_publisher_msgs_per_s": _sent_rate(published, "shared"),
        "log_slow_broker_cpu_alone": (cpu1 - cpu0) / alone,
        "log_slow_broker_cpu": (cpu3 - cpu2) / _seconds(published),
        "log_slow_slow_reader_cpu_s": slow_got["cpu_s"],
        "log_slow_slow_reader_msgs_per_s": slow_got["rated_received"] / slow_rated_s,
        "log_slow_published": sent,
        "log_slow_fast_received": fast_got["received"],
        "log_slow_slow_received": slow_got["received"],
        "log_slow_lost": lost,
        "log_slow_duplicates": fast_got["duplicates"]
        + slow_got["duplicates"]
        + before["duplicates"]
        + after["duplicates"],
        "log_slow_broker_rss_anon_start_mib": rss_start / MiB,
        "log_slow_broker_rss_anon_max_mib": rss_max / MiB,
        "log_slow_broker_rss_anon_growth_mib": (rss_max - rss_start) / MiB,
        "log_slow_broker_rss_anon_growth_shared_mib": (rss_max - rss_shared_start) / MiB,
        # The active term (RssShmem) included: all the broker's anonymous memory.
        "log_slow_broker_rss_shmem_max_mib": shmem_max / MiB,
        "log_slow_broker_anon_and_shmem_growth_mib": (both_max - rss_start - shmem_start) / MiB,
        "log_slow_disk_max_mib": disk_max / MiB,
        "log_slow_disk_limit_mib": limit / MiB,
        "log_slow_disk_within_limit": disk_max <= limit,
    }


def slow_consumer(slow_seconds: float, progress: Callable[[str], None]) -> dict[str, Any]:
    """:func:`shared_slow_consumer` on a fresh log broker."""
    with log_broker() as (url, process, data_dir):
        alone = min(slow_seconds, 10.0)
        progress(
            f"log: slow consumer on one topic for {slow_seconds:.0f} s "
            f"(and its fast subscriber alone, {alone:.0f} s before and after)"
        )
        return shared_slow_consumer(url, process, data_dir, slow_seconds, alone)
