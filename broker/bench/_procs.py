"""What the end-to-end benchmarks share: a broker process (memory-only or
with topic logs in a data directory), client worker processes and their
results, and readings of a process's memory and CPU from ``/proc``."""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def proc_status(pid: int, field: str) -> int:
    """A ``/proc/PID/status`` memory field in bytes (0 if unavailable)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def cpu_seconds(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


@contextmanager
def broker_process(
    extra: list[str] | None = None, *, data_dir: str | None = None
) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """A ``broker serve`` process on a free loopback port, stopped (SIGTERM)
    after the block: with topic logs in ``data_dir`` if given, else
    memory-only (said explicitly: a broker without one may keep logs in a
    default place)."""
    port = free_port()
    command = [sys.executable, "-m", "broker", "--log-level", "WARNING", "serve"]
    command += ["--listen", f"127.0.0.1:{port}", "--metrics-listen", "", *(extra or [])]
    if data_dir is None:
        command += ["--set", "memory_only=true"]
    else:
        command += ["--set", f"data_dir={data_dir}"]
    process = spawn(command, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if "listening" not in line:
            raise RuntimeError(f"broker did not start: {line!r}")
        yield f"127.0.0.1:{port}", process
    finally:
        stop(process)


#: Every process a bench started and has not stopped or reaped yet, and
#: whether it is a client worker (see :func:`spawn`).
_started: dict[subprocess.Popen[Any], bool] = {}


def spawn(command: list[str], *, worker: bool = False, **options: Any) -> subprocess.Popen[Any]:
    """Start a process of a bench (a broker, a peer, a floor, a client
    ``worker``): ``subprocess.Popen(command, **options)``, in a session of
    its own.

    A Ctrl-C at the terminal then reaches the bench alone, which ends its
    workers before the servers they use (:func:`stop`), so that nothing but
    the bench says anything of it. The process is on the list of started
    ones before a Ctrl-C can interrupt the bench (SIGINT is blocked meanwhile,
    and stays blocked in the process: it is ended by its bench, never by a
    signal of the terminal's), so whatever an interrupt cuts short is ended
    at exit (:func:`_stop_all`)."""
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        process = subprocess.Popen(command, start_new_session=True, **options)
        _started[process] = worker
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    return process


def stop(process: subprocess.Popen[Any]) -> None:
    """Stop a server process a bench started (a broker, a peer, a floor):
    first the client workers still running (the bench was interrupted, or
    failed), so that none of them reports the server going away; then
    SIGTERM, and SIGKILL if it has not ended ten seconds later; its standard
    output pipe, if any, is closed."""
    _end_workers()
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    if process.stdout is not None:
        process.stdout.close()
    _started.pop(process, None)


def _end_workers() -> None:
    """Kill the client workers still running, and reap them."""
    for process in [process for process, worker in _started.items() if worker]:
        del _started[process]
        if process.poll() is None:
            process.kill()
        process.communicate()


@atexit.register
def _stop_all() -> None:
    """At exit, what an interrupted bench left running: its workers, then
    its servers."""
    _end_workers()
    for process in list(_started):
        stop(process)


def worker(spec: dict[str, Any]) -> subprocess.Popen[str]:
    """A client worker process (``_worker``) for ``spec`` (see :func:`spawn`)."""
    command = [sys.executable, "-m", "broker.bench._worker", json.dumps(spec)]
    process: subprocess.Popen[str] = spawn(command, worker=True, stdout=subprocess.PIPE, text=True)
    return process


def wait_ready(process: subprocess.Popen[str]) -> None:
    """Wait for a worker's ``ready`` line. Read a byte at a time from the
    pipe itself: a buffered ``readline`` could take the worker's result
    too, if it came at once (a reader of records already there), and
    :func:`worker_result` (``communicate`` with a timeout reads the pipe,
    not that buffer) would then find nothing."""
    assert process.stdout is not None
    fd = process.stdout.fileno()
    line = b""
    while not line.endswith(b"\n"):
        byte = os.read(fd, 1)
        if not byte:
            break
        line += byte
    if line.decode(errors="replace").strip() != "ready":
        raise RuntimeError(f"subscriber worker failed: {line!r}")


def worker_result(process: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
    try:
        out, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        raise RuntimeError("benchmark worker timed out") from None
    _started.pop(process, None)
    if process.returncode:
        raise RuntimeError(f"benchmark worker failed with status {process.returncode}")
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def percentiles(latencies_ns: list[int]) -> dict[str, float]:
    if not latencies_ns:
        return {"p50_us": 0.0, "p99_us": 0.0, "p999_us": 0.0, "max_us": 0.0}
    ordered = sorted(latencies_ns)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1000

    return {"p50_us": at(0.5), "p99_us": at(0.99), "p999_us": at(0.999), "max_us": at(1.0)}


def subscriber_processes(subscribers: int) -> list[int]:
    """How many subscriber connections each subscriber process holds: the
    subscribers spread over as many processes as there are cores (a single
    Python process reading ten connections would measure itself, not the
    broker)."""
    processes = max(1, min(subscribers, os.cpu_count() or 1))
    return [
        subscribers // processes + (1 if i < subscribers % processes else 0)
        for i in range(processes)
    ]


def fan(url: str, count: int, subscribers: int, batch: bool = True) -> dict[str, float]:
    """``count`` messages published to ``subscribers`` subscriptions, which
    take them with ``receive_batch()`` (``batch``) or one ``receive()`` each."""
    spec = {"role": "sub", "url": url, "topic": "bench", "count": count, "batch": batch}
    subs = [worker({**spec, "connections": n}) for n in subscriber_processes(subscribers)]
    for sub in subs:
        wait_ready(sub)
    pub = worker({"role": "pub", "url": url, "topics": [{"name": "bench"}], "count": count})
    published = worker_result(pub, 300)
    results = [worker_result(sub, 300) for sub in subs]
    received_all = {"cpu_s": sum(r["cpu_s"] for r in results)}
    received = [one for r in results for one in r["subscribers"]]
    last = max(r["last"] for r in received)
    seconds = (last - published["start"]) / 1e9
    total = sum(r["received"] for r in received)
    lost = count * subscribers - total + sum(r["gaps"] for r in received)
    return {
        "per_s": total / seconds,
        "seconds": seconds,
        "lost": lost,
        "publisher_cpu": published["cpu_s"] / seconds,
        "subscriber_cpu": received_all["cpu_s"] / seconds,
        "subscriber_processes": len(subs),
    }


def _median(results: list[dict[str, float]]) -> dict[str, float]:
    median = statistics.median(r["per_s"] for r in results)
    middle = min(results, key=lambda r: abs(r["per_s"] - median))
    return {
        "per_s": median,
        "lost": sum(r["lost"] for r in results),
        "runs": len(results),
        # CPU cores each client process kept busy in the median run.
        "publisher_cpu": middle["publisher_cpu"],
        "subscriber_cpu": middle["subscriber_cpu"],
        "subscriber_processes": middle["subscriber_processes"],
    }


def median_runs(
    url: str, runs: int, count: int, subscribers: int, batch: bool = True
) -> dict[str, float]:
    """The median of ``runs`` runs of :func:`fan`."""
    return _median([fan(url, count, subscribers, batch) for _ in range(runs)])


def paired_median_runs(
    urls: list[str], runs: int, count: int, subscribers: int
) -> list[dict[str, float]]:
    """:func:`median_runs` of each broker in ``urls``, their runs interleaved
    (one run each, in turn, the order reversed every round) so that a
    machine whose load changes meanwhile weighs on every broker alike."""
    results: list[list[dict[str, float]]] = [[] for _ in urls]
    for round_ in range(runs):
        order = list(range(len(urls)))
        for index in order if round_ % 2 == 0 else order[::-1]:
            results[index].append(fan(urls[index], count, subscribers))
    return [_median(each) for each in results]
