"""Measure the broker's RSS under connection churn: a ``broker serve`` process
with the default settings (``gc_threshold`` and ``gc.freeze`` included) and
cycles of N clients that connect, publish a message, subscribe, and leave.

    python tests/measure/churn_rss.py [--cycles 20] [--connections 1000]

Prints the broker's RSS (MiB) after each cycle. Linux only (reads /proc).
"""

from __future__ import annotations

import argparse
import os
import subprocess

import trio
from _process import (  # (tests/measure is sys.path[0])
    free_port,
    rss_mib,
    serve_command,
    wait_listening,
)

from broker.client import open_client

#: Clients connected at once (more overflow the listen backlog: slow retries).
CONCURRENT = 100


async def one_client(url: str, index: int, limiter: trio.CapacityLimiter) -> None:
    async with limiter, open_client(url, name=f"churn-{index}") as client:
        topic = f"churn.{index % 50}"
        await client.publish(topic, b"x" * 100)
        async with client.subscribe(topic):
            pass


async def cycle(url: str, connections: int) -> None:
    limiter = trio.CapacityLimiter(CONCURRENT)
    async with trio.open_nursery() as nursery:
        for index in range(connections):
            nursery.start_soon(one_client, url, index, limiter)


async def run(url: str, pid: int, cycles: int, connections: int) -> list[float]:
    figures = []
    for number in range(cycles):
        await cycle(url, connections)
        await trio.sleep(0.3)
        figures.append(rss_mib(pid))
        print(f"cycle {number + 1:3d}: broker RSS {figures[-1]:6.1f} MiB", flush=True)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=20)
    parser.add_argument("--connections", type=int, default=1000)
    args = parser.parse_args()
    port = free_port()
    broker = subprocess.Popen(
        serve_command(port, "WARNING"),
        env=os.environ.copy(),
    )
    try:
        wait_listening(port)
        start = rss_mib(broker.pid)
        print(f"start: broker RSS {start:6.1f} MiB")
        figures = trio.run(run, f"127.0.0.1:{port}", broker.pid, args.cycles, args.connections)
        print(
            f"RSS {start:.1f} -> {figures[-1]:.1f} MiB (peak {max(figures):.1f}) "
            f"over {args.cycles} cycles of {args.connections} connections"
        )
    finally:
        broker.terminate()
        broker.wait(10)


if __name__ == "__main__":
    main()
