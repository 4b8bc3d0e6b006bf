"""``broker bench peers``: the broker beside Mosquitto at everyday rates, in
the same run, with the same open-loop method (issue 22).

At each rate (100, 1,000 and 10,000 msg/s) in turn: the broker's own
per-rate run (:func:`rates_table`) with minimal clients of its protocol
(``ours``, the like-for-like figures) and with the project's client library
(``ours_client``), then Mosquitto at QoS 1, then at QoS 0, then two floors at
QoS 1 (``trio_floor``: the least an MQTT broker written with trio does, see
``_trio_floor``; ``python_floor``: the least one written in Python does,
with no framework, see ``_python_floor``), each on a freshly started broker,
one publisher process to one subscriber process, 100-byte payloads stamped
with their scheduled send time. Reported per broker: p50/p99 latency,
messages received and the broker's CPU per message over the middle of the
run; and the broker's figures over each other's
(``ratio_{qos1,qos0,floor,pyfloor}_rate_{rate}_{p50,p99,cpu}``).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ._procs import free_port, spawn, stop
from ._rates import TABLE_RATES, at_rate, rates_table
from ._yardstick import python_loop_10m_s

#: Where Debian installs mosquitto, which is not on a user's PATH.
_SBIN_MOSQUITTO = "/usr/sbin/mosquitto"

#: The line a user gets when the suite cannot run.
MISSING = "broker bench peers: needs mosquitto, which is not installed (apt install mosquitto)"

#: The Mosquitto runs: the QoS of each, and the name its figures go under.
QOS_RUNS = ((1, "mosquitto_qos1"), (0, "mosquitto_qos0"))

#: The rows this broker's figures are divided by, and the name of each ratio.
COMPARED = (
    *((name, f"qos{qos}") for qos, name in QOS_RUNS),
    ("trio_floor", "floor"),
    ("python_floor", "pyfloor"),
)

#: The figures compared as ratios, and the key of each in a per-rate result.
RATIOS = (("p50", "p50_us"), ("p99", "p99_us"), ("cpu", "broker_cpu_us_per_msg"))


def mosquitto_path() -> str | None:
    """The mosquitto executable: on PATH, or where Debian puts it."""
    found = shutil.which("mosquitto")
    if found is None and os.access(_SBIN_MOSQUITTO, os.X_OK):
        found = _SBIN_MOSQUITTO
    return found


def unavailable() -> str | None:
    """Why this suite cannot run here (one line saying what to install), or None."""
    return MISSING if mosquitto_path() is None else None


def _wait_listening(port: int, process: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"mosquitto exited with status {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"mosquitto did not listen on port {port} within {timeout:.0f} s")


@contextmanager
def mosquitto_process(
    path: str, max_queued_messages: int | None = 0
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A Mosquitto broker on a free loopback port (anonymous, no persistence,
    logging off, no limit on the QoS 1 messages queued for a client; with
    ``max_queued_messages`` None, Mosquitto's default limit, 1,000),
    stopped (SIGTERM) after the block."""
    with tempfile.TemporaryDirectory(prefix="broker-bench-mosquitto-") as directory:
        port = free_port()
        config = Path(directory) / "mosquitto.conf"
        # (max_queued_messages 0: as this broker's reliable subscriptions, drop
        # no QoS 1 message for a subscriber that falls behind; the default
        # drops past 1,000.)
        config.write_text(
            f"listener {port} 127.0.0.1\n"
            "allow_anonymous true\n"
            "persistence false\n"
            "log_dest none\n"
            + (
                ""
                if max_queued_messages is None
                else f"max_queued_messages {max_queued_messages}\n"
            )
        )
        process: subprocess.Popen[bytes] = spawn(
            [path, "-c", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            # (A generous deadline: the machine may be busy with the tests.)
            _wait_listening(port, process, 30)
            yield f"127.0.0.1:{port}", process
        finally:
            stop(process)


def mosquitto_rates_table(
    path: str, duration: float, qos: int, rates: tuple[int, ...] = TABLE_RATES
) -> dict[str, Any]:
    """At each of ``rates``, on one freshly started Mosquitto, with MQTT
    clients at ``qos``: :func:`at_rate`'s figures (latency percentiles,
    messages received, broker CPU per message), keyed ``rate_{rate}_{figure}``."""
    with mosquitto_process(path) as (url, process):
        return _mqtt_rates(url, process.pid, duration, qos, rates)


def _mqtt_rates(
    url: str, pid: int, duration: float, qos: int, rates: tuple[int, ...]
) -> dict[str, Any]:
    """:func:`at_rate`'s figures at each of ``rates`` with MQTT clients at
    ``qos``, against the MQTT broker process ``pid`` serving ``url``."""
    results: dict[str, Any] = {}
    for rate in rates:
        figures = at_rate(url, pid, rate, duration, mqtt_qos=qos)
        results.update({f"rate_{rate}_{key}": value for key, value in figures.items()})
    return results


#: The floor relays: the name their figures go under, and their module.
FLOORS = (("trio_floor", "_trio_floor"), ("python_floor", "_python_floor"))


@contextmanager
def floor_process(module: str) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """A floor relay (``module``, one of :data:`FLOORS`) on a free loopback
    port, stopped after the block."""
    command = [sys.executable, "-m", f"broker.bench.{module}"]
    process: subprocess.Popen[str] = spawn(command, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        port = process.stdout.readline().strip()
        if not port.isdigit():
            raise RuntimeError(f"the floor relay {module} did not start: {port!r}")
        yield f"127.0.0.1:{port}", process
    finally:
        stop(process)


def floor_rates_table(
    duration: float, rates: tuple[int, ...] = TABLE_RATES, module: str = "_trio_floor"
) -> dict[str, Any]:
    """:func:`mosquitto_rates_table` for a floor relay (``module``), at QoS 1."""
    with floor_process(module) as (url, process):
        return _mqtt_rates(url, process.pid, duration, 1, rates)


def run(
    quick: bool = False,
    progress: Callable[[str], None] = lambda _step: None,
    *,
    rates: tuple[int, ...] = TABLE_RATES,
    **_options: Any,
) -> dict[str, Any]:
    """The broker's per-rate figures (``ours_rate_*``) and Mosquitto's at QoS 1
    and 0 (``mosquitto_qos1_rate_*``, ``mosquitto_qos0_rate_*``), rate by rate,
    each run on a fresh broker process; their ratios; ``python_loop_10m_s``.
    Raises RuntimeError when mosquitto is not installed (see :func:`unavailable`)."""
    path = mosquitto_path()
    if path is None:
        raise RuntimeError(MISSING)
    # (The CPU figures are read in clock ticks, 10 ms each: ten-second runs
    # keep a tick under 2 us per message at 1,000 msg/s.)
    duration = 2.0 if quick else 10.0
    started = time.perf_counter()
    results: dict[str, Any] = {"python_loop_10m_s": python_loop_10m_s(), "duration_s": duration}
    for rate in rates:
        # (The like-for-like figures: minimal clients of each protocol. The
        # project's own clients, heavier, are measured too, for reference.)
        progress(f"{rate:,} msg/s for {duration:.0f} s: this broker")
        runs = {"ours": rates_table(duration, (rate,), raw=True)}
        progress(f"{rate:,} msg/s for {duration:.0f} s: this broker with the project's client")
        runs["ours_client"] = rates_table(duration, (rate,))
        for qos, name in QOS_RUNS:
            progress(f"{rate:,} msg/s for {duration:.0f} s: mosquitto at QoS {qos}")
            runs[name] = mosquitto_rates_table(path, duration, qos, (rate,))
        for name, module in FLOORS:
            progress(f"{rate:,} msg/s for {duration:.0f} s: the {name.replace('_', ' ')} at QoS 1")
            runs[name] = floor_rates_table(duration, (rate,), module)
        for name, figures in runs.items():
            results.update({f"{name}_{key}": value for key, value in figures.items()})
        for name, short in COMPARED:
            for ratio, key in RATIOS:
                theirs = results[f"{name}_rate_{rate}_{key}"]
                ours = results[f"ours_rate_{rate}_{key}"]
                # (None: no CPU tick fell in that broker's window.)
                results[f"ratio_{short}_rate_{rate}_{ratio}"] = ours / theirs if theirs else None
    results["python_loop_10m_s_after"] = python_loop_10m_s()
    results["bench_seconds"] = time.perf_counter() - started
    return results


def table(results: dict[str, Any]) -> list[str]:
    """``results`` of :func:`run` as a table: a row per rate and broker, the
    broker's own figures over each compared row's in the ratio columns."""
    rates = sorted(
        {int(key.split("_")[2]) for key in results if key.startswith("ours_rate_")},
    )
    header = (
        f"{'rate':>7}  {'broker':<15}{'p50 us':>9}{'p99 us':>9}{'CPU us/msg':>12}"
        f"{'received':>10}{'p50 x':>8}{'p99 x':>8}{'CPU x':>8}"
    )
    lines = [header]
    for rate in rates:
        for name in ("ours", "ours_client", *(name for name, _short in COMPARED)):
            prefix = f"{name}_rate_{rate}_"
            row = (
                f"{rate:>7,}  {name.replace('_', ' '):<15}"
                f"{results[prefix + 'p50_us']:>9,.0f}{results[prefix + 'p99_us']:>9,.0f}"
                f"{results[prefix + 'broker_cpu_us_per_msg']:>12,.1f}"
                f"{results[prefix + 'received']:>10,}"
            )
            short = dict(COMPARED).get(name)
            if short is not None:
                ratios = [results[f"ratio_{short}_rate_{rate}_{ratio}"] for ratio, _ in RATIOS]
                row += "".join("     n/a" if r is None else f"{r:>8.2f}" for r in ratios)
            lines.append(row)
    lines.append(
        f"python_loop_10m_s {results['python_loop_10m_s']:.2f} before, "
        f"{results['python_loop_10m_s_after']:.2f} after; "
        f"{results['duration_s']:.0f} s per run; ratios: this broker / that row"
    )
    return lines
