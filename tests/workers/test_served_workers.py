"""``broker serve --workers 2`` as an operator runs it (a real process on
127.0.0.1): its metrics endpoint answers from the moment the client port
accepts, and ``broker stat`` shows what each worker serves."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import trio

from broker.bench._procs import free_port
from broker.client import BlockingClient, open_client
from tests.cli.helpers import TIMEOUT, Served, broker_command, run, serving

from .test_supervisor import topics_of

#: Seconds between two connection attempts while waiting for a port.
POLL = 0.002


def accepts(port: int) -> bool:
    """Whether something accepts a TCP connection on 127.0.0.1:``port`` now."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT).close()
    except OSError:
        return False
    return True


@contextmanager
def supervisor_on(client: int, metrics: int) -> Iterator[subprocess.Popen[bytes]]:
    """``broker serve --workers 2`` (memory-only) on those ports, stopped
    (SIGINT, status 0) when the block ends."""
    process = subprocess.Popen(
        broker_command(
            "--log-level",
            "WARNING",
            "serve",
            "--workers",
            "2",
            "--memory-only",
            "--listen",
            f"127.0.0.1:{client}",
            "--metrics-listen",
            f"127.0.0.1:{metrics}",
        ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        yield process
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=TIMEOUT)
        assert process.returncode == 0, stderr.decode()
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate(timeout=TIMEOUT)


def test_the_metrics_port_answers_the_moment_the_client_port_accepts() -> None:
    """A probe that waits for the client port and then scrapes is answered.
    (The supervisor bound its metrics port only once every worker was up:
    0.6-1.3 s after the client port accepted, refused meanwhile.)"""
    client, metrics = free_port(), free_port()
    with supervisor_on(client, metrics) as process:
        deadline = time.monotonic() + TIMEOUT
        while not accepts(client):
            assert process.poll() is None, process.communicate()[1].decode()
            assert time.monotonic() < deadline, "the client port never accepted"
            time.sleep(POLL)
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=TIMEOUT) as got:
            assert got.status == 200
            text = got.read().decode()
        assert "broker_workers 2.0" in text
        assert 'broker_worker_up{worker="w0"}' in text


def directs(served: Served) -> dict[str, str]:
    """The workers' direct addresses, from the third line ``broker serve`` says."""
    assert served.process.stdout is not None
    line = served.process.stdout.readline()
    assert line.startswith("2 workers, direct: "), line
    pairs = line.removeprefix("2 workers, direct: ").strip().split(", ")
    return dict(pair.split(" on ") for pair in pairs)


async def test_stats_worker_table_shows_each_workers_connections_and_topics(
    tmp_path: Path,
) -> None:
    """Clients that publish and leave (as ``broker pub`` does) and one that
    stays: each worker's row counts them. (It showed the client connections
    open at that instant and the topics open: 0 and 0 for a worker whose
    publishers had left, while they published again and again.)"""
    ids = ["w0", "w1"]
    (a,) = topics_of("w0", ids, 1)
    b, c = topics_of("w1", ids, 2)
    with serving("--workers", "2", "--data-dir", str(tmp_path)) as served:
        at = directs(served)
        for url, topic, count in [(at["w0"], a, 3), (at["w1"], b, 1), (at["w1"], c, 1)]:
            for _ in range(count):
                async with open_client(url, name="short") as client:
                    for n in range(10):
                        await client.publish(topic, b"%d" % n)
                    await client.flush()
        async with open_client(at["w1"], name="stays") as client:
            await client.publish(c, b"one more")
            await client.flush()

            def settled() -> dict[str, Any]:
                """The document once the workers have seen the short ones go."""
                deadline = time.monotonic() + TIMEOUT
                while True:
                    document = served.stat()
                    if document["connections_total"] == 1 or time.monotonic() > deadline:
                        return document
                    time.sleep(0.05)

            document = await trio.to_thread.run_sync(settled)
            text = await trio.to_thread.run_sync(lambda: run("stat", "--metrics", served.metrics))
    rows = {row["id"]: row for row in document["workers"]}
    shown = ("connections", "connections_total", "topics", "messages_in")
    assert [rows["w0"].get(key) for key in shown] == [0, 3, 1, 30]
    assert [rows["w1"].get(key) for key in shown] == [1, 3, 2, 21]
    # The links between the workers are no client connections.
    assert document["broker"]["statistics"]["connections"] == 1
    lines = text.stdout.splitlines()
    head = lines.index("workers (2, 2 up)")
    table = [line.split() for line in lines[head + 1 : head + 4]]
    assert table[0] == ["id", "pid", "up", "restarts", "direct", *shown]
    assert table[1][0] == "w0" and table[1][5:] == ["0", "3", "1", "30"]
    assert table[2][0] == "w1" and table[2][5:] == ["1", "3", "2", "21"]


def workers_of(pid: int) -> list[int]:
    """The worker processes (``python -m broker.workers``) whose parent is
    ``pid`` now, from ``/proc``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rpartition(")")[2].split()
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                command = cmdline.read().split(b"\0")
        except OSError:
            continue  # it ended meanwhile
        if int(fields[1]) == pid and b"broker.workers" in command:
            found.append(int(entry))
    return found


def test_a_worker_killed_while_it_starts_is_restarted() -> None:
    """A worker killed (SIGKILL) before it said it was up used to count as
    one that could not start: the whole broker stopped ("worker w0 did not
    start (exit status -9)", status 1), and every client connected to the
    other worker lost it. It is restarted as any worker that ends."""
    process = subprocess.Popen(
        broker_command(
            "serve", "--workers", "2", "--memory-only",
            "--listen", "127.0.0.1:0", "--metrics-listen", "",
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + TIMEOUT
        while not (started := workers_of(process.pid)):
            assert process.poll() is None and time.monotonic() < deadline
            time.sleep(POLL)
        os.kill(started[0], signal.SIGKILL)
        assert process.stdout is not None
        said = process.stdout.readline()
        assert said.startswith("broker listening on "), said + process.communicate()[1]
        address = said.split()[-1]
        with BlockingClient(address) as client:
            client.publish("after", b"served")
            client.flush(timeout=TIMEOUT)
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=TIMEOUT)
        assert process.returncode == 0, stderr
        assert "ended (signal SIGKILL): restarting it" in stderr
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate(timeout=TIMEOUT)
