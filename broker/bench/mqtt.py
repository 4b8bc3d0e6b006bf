"""``broker bench mqtt``: this broker's MQTT listener beside Mosquitto, in
one run, with the same MQTT clients (issue 45's measured must-shows).

The brokers: this one as a user runs it with MQTT, ``broker serve
--mqtt-listen`` with topic logs in a fresh data directory (every setting
its default: ``flush = "batch"``, so a PUBACK means the record is written
to its log file, fsynced within a second); and Mosquitto (the
``mosquitto`` executable, on ``PATH`` or in ``/usr/sbin``) as
``broker bench peers`` runs it: no persistence, logging off and
``max_queued_messages 0`` (it drops no QoS 1 message for a subscriber that
falls behind), everything else its default. The clients: the bench's own
MQTT 3.1.1 clients (raw sockets, ``_mqtt``; ``_mqtt_load`` and
``_mqtt_worker``), 100-byte payloads, every subscription at QoS 1.

Workloads, each broker in turn (the order swapped from one round to the
next, so that a change in the machine's load weighs on both alike):

- ``one_to_one``: one publisher flat out at QoS 1 with at most ``WINDOW``
  PUBLISHes unacknowledged (this broker's Receive Maximum), to one
  subscriber; the rate is the messages over the time from the publisher's
  start to the subscriber's last message; the median of ``rounds``.
- ``fanout``: the same to ``FANOUT`` subscribers (spread over as many
  processes as there are cores): deliveries a second.
- ``rate_1000``: one publisher at 1,000 msg/s, open loop (each payload
  carries its *scheduled* send time), to one subscriber: p50/p99 latency
  and the broker's CPU per message over the middle of the run (``peers``'
  method, :func:`~._rates.at_rate`).

Every figure comes with the broker's CPU per message (``/proc``: utime +
stime over the workload) and the clients' CPU (cores they kept busy: on a
2-core machine the clients may limit the faster broker). Ratios are this
broker's figure over Mosquitto's (``ratio_*``) and over the trio floor's
(``ratio_floor_*``). For reference the same workloads run on ``peers``'
two floors (``floors``, on by default): minimal MQTT relays in trio
(``trio_floor``: one task per connection, one write per packet) and in
plain Python (``python_floor``: one epoll thread), which show what any
broker built on those costs at the least.

``slow_consumer`` (``--slow-consumer``: only this one): one publisher flat
out at QoS 1 for ``duration`` s, one subscriber reading its socket at
200 KB/s and one flat out, the same topic; then, once the publisher is
done, the slow one reads flat out what is left (until it has every
message, or nothing came for a few seconds). Reported per broker: messages
each subscriber lost (published and never received), the fast one's rate
while the publisher published beside its rate alone (the same run without
the slow subscriber, just before), and the broker's ``RssAnon`` growth
(its peak over the run minus its value before the publisher started; in
the run alone too: with topic logs, the active term of each topic's log is
anonymous memory, up to ``term_bytes``, whoever reads it). On
a fresh process of each broker: this one, Mosquitto with its default
``max_queued_messages`` (1,000: it drops what is past it), and Mosquitto
without that limit (``max_queued_messages 0``: it keeps everything, in
memory).
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._mqtt_load import write_release
from ._procs import (
    broker_process,
    cpu_seconds,
    free_port,
    proc_status,
    subscriber_processes,
    wait_ready,
    worker,
    worker_result,
)
from ._rates import at_rate
from ._yardstick import python_loop_10m_s
from .peers import floor_process, mosquitto_path, mosquitto_process

#: The line a user gets when the suite cannot run.
MISSING = "broker bench mqtt: needs mosquitto, which is not installed (apt install mosquitto)"

#: The brokers compared, in the order of the first round.
BROKERS = ("ours", "mosquitto")
#: The floors measured beside them for reference (``peers``' minimal MQTT
#: relays, see ``_trio_floor`` and ``_python_floor``): name and module.
FLOORS = (("trio_floor", "_trio_floor"), ("python_floor", "_python_floor"))
#: The slow-consumer runs: this broker, Mosquitto as configured by default
#: (``max_queued_messages`` 1,000), Mosquitto without that limit.
SLOW_BROKERS = ("ours", "mosquitto", "mosquitto_unbounded")
#: QoS 1 PUBLISHes a publisher keeps unacknowledged at most (this broker's
#: Receive Maximum).
WINDOW = 1024
#: Subscribers of the fan-out workload.
FANOUT = 10
#: The open-loop workload's rate (msg/s).
RATE = 1_000
#: The slow subscriber's pace (bytes of its socket read a second).
SLOW_BYTES_PER_S = 200_000
#: Payload bytes of every message.
PAYLOAD = 100
#: Seconds a subscriber waits for more, once it knows how many to expect.
IDLE = 10.0
#: Hang guard of one worker (seconds).
TIMEOUT = 900.0


@dataclass(frozen=True)
class Server:
    """A broker under test: where its MQTT listener is, and its pid."""

    url: str
    pid: int


def unavailable() -> str | None:
    """Why this suite cannot run here (one line saying what to install), or None."""
    return MISSING if mosquitto_path() is None else None


@contextmanager
def ours_process(data_dir: str) -> Iterator[Server]:
    """``broker serve --mqtt-listen`` on free loopback ports, with topic logs
    in ``data_dir``, stopped after the block."""
    port = free_port()
    with broker_process(["--mqtt-listen", f"127.0.0.1:{port}"], data_dir=data_dir) as (
        _url,
        process,
    ):
        assert process.stdout is not None
        # (The lines after "listening": the MQTT address comes last.)
        while not (line := process.stdout.readline()).startswith("MQTT on"):
            if not line:
                raise RuntimeError("broker did not say where it serves MQTT")
        yield Server(f"127.0.0.1:{port}", process.pid)


@contextmanager
def mosquitto_server(max_queued_messages: int | None = 0) -> Iterator[Server]:
    """Mosquitto (see :func:`~.peers.mosquitto_process`), stopped after the block."""
    path = mosquitto_path()
    if path is None:
        raise RuntimeError(MISSING)
    with mosquitto_process(path, max_queued_messages) as (url, process):
        yield Server(url, process.pid)


@contextmanager
def servers(directory: Path, floors: bool) -> Iterator[dict[str, Server]]:
    """This broker (data directory under ``directory``), Mosquitto and, with
    ``floors``, the two floor relays."""
    with ExitStack() as stack:
        found = {
            "ours": stack.enter_context(ours_process(str(directory / "ours"))),
            "mosquitto": stack.enter_context(mosquitto_server()),
        }
        for name, module in FLOORS if floors else ():
            url, process = stack.enter_context(floor_process(module))
            found[name] = Server(url, process.pid)
        yield found


def throughput(where: Server, topic: str, count: int, subscribers: int) -> dict[str, float]:
    """``count`` messages published flat out at QoS 1 (``WINDOW`` in
    flight) to ``subscribers`` QoS 1 subscribers of ``topic``."""
    spec = {"role": "mqtt_count", "url": where.url, "topic": topic, "qos": 1, "count": count}
    spec |= {"idle": IDLE, "timeout": TIMEOUT}
    subs = [
        worker({**spec, "connections": n, "client_id": f"bench-{topic}-{index}"})
        for index, n in enumerate(subscriber_processes(subscribers))
    ]
    for sub in subs:
        wait_ready(sub)
    cpu0 = cpu_seconds(where.pid)
    pub = worker(
        {
            "role": "mqtt_flood",
            "url": where.url,
            "topic": topic,
            "qos": 1,
            "count": count,
            "window": WINDOW,
            "size": PAYLOAD,
            "client_id": f"bench-{topic}-pub",
        }
    )
    published = worker_result(pub, TIMEOUT)
    results = [worker_result(sub, TIMEOUT) for sub in subs]
    cpu1 = cpu_seconds(where.pid)
    received = [one for result in results for one in result["subscribers"]]
    last = max((one["last"] for one in received if one["last"]), default=published["end"])
    seconds = max((last - published["start"]) / 1e9, 1e-9)
    unique = sum(one["unique"] for one in received)
    client_cpu = published["cpu_s"] + sum(result["cpu_s"] for result in results)
    return {
        "per_s": unique / seconds,
        "broker_cpu_us_per_msg": (cpu1 - cpu0) / count * 1e6,
        "client_cores": client_cpu / seconds,
        "lost": count * subscribers - unique + (count - published["acked"]),
        "duplicates": sum(one["duplicates"] for one in received),
    }


def _median(runs: list[dict[str, float]]) -> dict[str, float]:
    """The run of median rate (its other figures with it), the losses of all."""
    middle = statistics.median_low(run["per_s"] for run in runs)
    figures = dict(next(run for run in runs if run["per_s"] == middle))
    figures["lost"] = sum(run["lost"] for run in runs)
    figures["duplicates"] = sum(run["duplicates"] for run in runs)
    figures["runs"] = len(runs)
    return figures


class _RssSampler:
    """A process's ``RssAnon``, sampled every 50 ms in a thread: its value
    at the start and the peak since."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.start = self.peak = proc_status(pid, "RssAnon")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, proc_status(self.pid, "RssAnon"))

    def stop(self) -> float:
        """Stop sampling: the growth (MiB)."""
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, proc_status(self.pid, "RssAnon"))
        return (self.peak - self.start) / 2**20


def _in_window(one: dict[str, Any], start: int, end: int) -> int:
    """How many distinct messages a subscriber had by ``end`` (ns; counted
    by its marks, one every ``mark_every``), if its first came after ``start``."""
    marks = sum(1 for mark in one["marks"] if start <= mark <= end)
    return int(marks * one["mark_every"])


def slow_consumer(
    where: Server, topic: str, duration: float, *, slow: bool = True, idle: float = 3.0
) -> dict[str, float]:
    """One publisher flat out at QoS 1 for ``duration`` s to a subscriber
    flat out and (``slow``) one reading 200 KB/s; both read what is left
    flat out once the publisher is done (see the module)."""
    with tempfile.TemporaryDirectory(prefix="broker-bench-release-") as directory:
        release = str(Path(directory) / "published")
        spec = {"role": "mqtt_count", "url": where.url, "topic": topic, "qos": 1}
        spec |= {"release": release, "idle": idle, "timeout": TIMEOUT, "mark_every": 100}
        fast = worker({**spec, "client_id": f"bench-{topic}-fast"})
        subs = [fast]
        if slow:
            slow_spec = {**spec, "client_id": f"bench-{topic}-slow"}
            subs.append(worker({**slow_spec, "bytes_per_s": SLOW_BYTES_PER_S}))
        for sub in subs:
            wait_ready(sub)
        rss = _RssSampler(where.pid)
        cpu0 = cpu_seconds(where.pid)
        pub = worker(
            {
                "role": "mqtt_flood",
                "url": where.url,
                "topic": topic,
                "qos": 1,
                "duration": duration,
                "window": WINDOW,
                "size": PAYLOAD,
                "client_id": f"bench-{topic}-pub",
            }
        )
        published = worker_result(pub, duration + TIMEOUT)
        write_release(release, published["sent"])
        got = [worker_result(sub, TIMEOUT)["subscribers"][0] for sub in subs]
        cpu1 = cpu_seconds(where.pid)
        growth = rss.stop()
    sent: int = published["sent"]
    window_s = max((published["published"] - published["start"]) / 1e9, 1e-9)
    in_window = _in_window(got[0], published["start"], published["published"])
    figures = {
        "published": sent,
        "publish_per_s": sent / window_s,
        "unacked": sent - published["acked"],
        "fast_per_s": in_window / window_s,
        "fast_lost": sent - got[0]["unique"],
        "rss_anon_growth_mib": growth,
        "broker_cpu_us_per_msg": (cpu1 - cpu0) / max(sent, 1) * 1e6,
    }
    if slow:
        paced = _in_window(got[1], published["start"], published["published"])
        figures["slow_per_s"] = paced / window_s
        figures["slow_lost"] = sent - got[1]["unique"]
        figures["slow_duplicates"] = got[1]["duplicates"]
    return figures


def _slow_consumer_runs(
    duration: float, idle: float, progress: Callable[[str], None], results: dict[str, Any]
) -> None:
    """The slow-consumer workload on a fresh process of each of
    :data:`SLOW_BROKERS`: the fast subscriber alone, then beside the slow one."""
    for name in SLOW_BROKERS:
        with tempfile.TemporaryDirectory(prefix="broker-bench-mqtt-") as directory:
            if name == "ours":
                context = ours_process(str(Path(directory) / "ours"))
            else:
                context = mosquitto_server(None if name == "mosquitto" else 0)
            with context as where:
                progress(f"slow consumer on {name.replace('_', ' ')}: the fast subscriber alone")
                alone = slow_consumer(where, "bench/alone", duration, slow=False, idle=idle)
                progress(f"slow consumer on {name.replace('_', ' ')}: beside a 200 KB/s one")
                beside = slow_consumer(where, "bench/slow", duration, idle=idle)
        prefix = f"{name}_slow_"
        results.update({prefix + key: value for key, value in beside.items()})
        results[prefix + "fast_alone_per_s"] = alone["fast_per_s"]
        results[prefix + "alone_rss_anon_growth_mib"] = alone["rss_anon_growth_mib"]
        results[prefix + "fast_ratio"] = beside["fast_per_s"] / max(alone["fast_per_s"], 1e-9)


def run(
    quick: bool = False,
    progress: Callable[[str], None] = lambda _step: None,
    *,
    slow_consumer_only: bool = False,
    count: int | None = None,
    fanout_count: int | None = None,
    duration: float | None = None,
    slow_duration: float | None = None,
    rounds: int | None = None,
    slow_idle: float = 3.0,
    floors: bool = True,
    **_options: Any,
) -> dict[str, Any]:
    """Every workload on both brokers (see the module); with
    ``slow_consumer_only``, the slow consumer alone (its subscribers stop
    ``slow_idle`` s after the last message, once the publisher is done). Raises RuntimeError
    when mosquitto is not installed (see :func:`unavailable`)."""
    if mosquitto_path() is None:
        raise RuntimeError(MISSING)
    count = count or (2_000 if quick else 100_000)
    fanout_count = fanout_count or (500 if quick else 20_000)
    duration = duration or (2.0 if quick else 10.0)
    slow_duration = slow_duration or (2.0 if quick else 20.0)
    rounds = rounds or (1 if quick else 3)
    started = time.perf_counter()
    results: dict[str, Any] = {
        "python_loop_10m_s": python_loop_10m_s(),
        "payload_bytes": PAYLOAD,
        "window": WINDOW,
    }
    if not slow_consumer_only:
        results |= {
            "one_to_one_messages": count,
            "fanout_messages": fanout_count,
            "fanout_subscribers": FANOUT,
            "rounds": rounds,
            "open_loop_rate": RATE,
            "open_loop_seconds": duration,
        }
        with (
            tempfile.TemporaryDirectory(prefix="broker-bench-mqtt-") as directory,
            servers(Path(directory), floors) as brokers,
        ):
            _compare(brokers, count, fanout_count, duration, rounds, progress, results)
    results |= {"slow_seconds": slow_duration, "slow_bytes_per_s": SLOW_BYTES_PER_S}
    _slow_consumer_runs(slow_duration, slow_idle, progress, results)
    results["python_loop_10m_s_after"] = python_loop_10m_s()
    results["bench_seconds"] = time.perf_counter() - started
    return results


def _compare(
    brokers: dict[str, Server],
    count: int,
    fanout_count: int,
    duration: float,
    rounds: int,
    progress: Callable[[str], None],
    results: dict[str, Any],
) -> None:
    """1->1, 1->N and the open-loop run on every broker of ``brokers``,
    alternated; ratios of this broker's figures over Mosquitto's (and
    over the trio floor's, if measured)."""
    names = tuple(brokers)
    workloads: list[tuple[str, int, int]] = [
        ("one_to_one", count, 1),
        ("fanout", fanout_count, FANOUT),
    ]
    for name, messages, subscribers in workloads:
        runs: dict[str, list[dict[str, float]]] = {broker: [] for broker in names}
        for round_ in range(rounds):
            order = names if round_ % 2 == 0 else names[::-1]
            for broker in order:
                progress(f"{name} ({messages:,} messages) on {broker}, round {round_ + 1}")
                topic = f"bench/{name}/{round_}"
                runs[broker].append(throughput(brokers[broker], topic, messages, subscribers))
        for broker in names:
            figures = _median(runs[broker])
            results.update({f"{broker}_{name}_{key}": value for key, value in figures.items()})
    for broker in names:
        progress(f"{RATE:,} msg/s open loop for {duration:.0f} s on {broker}")
        where = brokers[broker]
        figures = at_rate(where.url, where.pid, RATE, duration, mqtt_qos=1)
        results.update({f"{broker}_rate_{RATE}_{key}": value for key, value in figures.items()})
    for other, prefix in (("mosquitto", "ratio"), ("trio_floor", "ratio_floor")):
        if other in brokers:
            results.update(_ratios(results, other, prefix))


#: The figures compared as ratios: (ratio name, figure key).
RATIOS = (
    *(
        (f"{name}_{short}", f"{name}_{key}")
        for name in ("one_to_one", "fanout")
        for short, key in (("rate", "per_s"), ("cpu", "broker_cpu_us_per_msg"))
    ),
    *(
        (f"rate_{RATE}_{short}", f"rate_{RATE}_{key}")
        for short, key in (("p50", "p50_us"), ("p99", "p99_us"), ("cpu", "broker_cpu_us_per_msg"))
    ),
)


def _ratios(results: dict[str, Any], other: str, prefix: str) -> dict[str, float | None]:
    """This broker's figures over ``other``'s, keyed ``{prefix}_{ratio}``
    (None where ``other``'s is 0: no CPU tick fell in its window)."""
    ratios: dict[str, float | None] = {}
    for ratio, key in RATIOS:
        theirs = results[f"{other}_{key}"]
        ratios[f"{prefix}_{ratio}"] = results[f"ours_{key}"] / theirs if theirs else None
    return ratios


def _ratio(value: float | None) -> str:
    return "     n/a" if value is None else f"{value:>8.2f}"


def table(results: dict[str, Any]) -> list[str]:
    """``results`` of :func:`run` as lines of a table."""
    r = results
    lines = [
        f"python_loop_10m_s {r['python_loop_10m_s']:.2f} before, "
        f"{r['python_loop_10m_s_after']:.2f} after; {r['payload_bytes']} B payloads, QoS 1, "
        f"publisher window {r['window']:,}; ratio: this broker / Mosquitto",
    ]
    if "ours_one_to_one_per_s" in r:
        names = [
            n
            for n in ("ours", "mosquitto", "trio_floor", "python_floor")
            if f"{n}_one_to_one_per_s" in r
        ]
        lines.append(
            f"{'workload':<32}"
            + "".join(f"{n.replace('_', ' '):>13}" for n in names)
            + f"{'x mosq':>8}"
        )

        def row(label: str, key: str, ratio: str | None, fmt: str = ",.0f") -> None:
            shown = _ratio(r[f"ratio_{ratio}"]) if ratio else ""
            figures = "".join(f"{r[f'{n}_{key}']:>13{fmt}}" for n in names)
            lines.append(f"{label:<32}{figures}{shown}")

        for name, label in (
            ("one_to_one", f"1->1 msg/s ({r['one_to_one_messages']:,})"),
            ("fanout", f"1->{r['fanout_subscribers']} deliveries/s ({r['fanout_messages']:,})"),
        ):
            row(label, f"{name}_per_s", f"{name}_rate")
            row("  broker CPU us/msg", f"{name}_broker_cpu_us_per_msg", f"{name}_cpu", ",.1f")
            row("  client cores busy", f"{name}_client_cores", None, ".2f")
            row("  lost", f"{name}_lost", None, ",")
        rate = r["open_loop_rate"]
        row(f"{rate:,} msg/s p50 us", f"rate_{rate}_p50_us", f"rate_{rate}_p50")
        row(f"{rate:,} msg/s p99 us", f"rate_{rate}_p99_us", f"rate_{rate}_p99")
        row(
            f"{rate:,} msg/s broker CPU us/msg",
            f"rate_{rate}_broker_cpu_us_per_msg",
            f"rate_{rate}_cpu",
            ",.1f",
        )
        row(f"{rate:,} msg/s received", f"rate_{rate}_received", None, ",")
    lines.append(
        f"slow consumer ({r['slow_seconds']:.0f} s flat out, one subscriber at "
        f"{r['slow_bytes_per_s'] // 1000} KB/s, one flat out):"
    )
    lines.append(
        f"{'broker':<22}{'published/s':>12}{'fast/s':>9}{'alone/s':>9}{'x alone':>8}"
        f"{'slow/s':>8}{'slow lost':>11}{'fast lost':>10}{'RssAnon+ MiB':>13}{'alone':>7}"
    )
    for name in SLOW_BROKERS:
        p = f"{name}_slow_"
        lines.append(
            f"{name.replace('_', ' '):<22}{r[p + 'publish_per_s']:>12,.0f}"
            f"{r[p + 'fast_per_s']:>9,.0f}{r[p + 'fast_alone_per_s']:>9,.0f}"
            f"{r[p + 'fast_ratio']:>8.2f}{r[p + 'slow_per_s']:>8,.0f}"
            f"{r[p + 'slow_lost']:>11,}{r[p + 'fast_lost']:>10,}"
            f"{r[p + 'rss_anon_growth_mib']:>13.1f}{r[p + 'alone_rss_anon_growth_mib']:>7.1f}"
        )
    return lines
