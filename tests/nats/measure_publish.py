"""Client CPU per publish, measured (not a test): ``python -m tests.nats.measure_publish``.

Starts one nats-server (JetStream, ``sync_interval: always``) on a free
loopback port and reports the client process's CPU (user + system, from
``time.process_time``) per message for:

- core publishes: ``N`` 100-byte ``publish()`` calls, then a flush;
- JetStream publishes of 6.5 KB (64 records packed as one message), each
  with a ``Nats-Msg-Id``, ``WINDOW`` acknowledgements in flight from one
  task (a window refilled as each acknowledgement comes), and from
  ``WINDOW`` tasks with one each (the front end's shape: one run in flight
  per publish channel);
- pulling them back in order, ``WINDOW`` at a time (an ordered reader);

beside ``python_loop_10m_s`` (the project's yardstick). Figures depend on
the machine and its load; compare runs taken in one session.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from collections import deque
from pathlib import Path

import trio

from broker.bench._yardstick import python_loop_10m_s
from broker.nats import JetStream, PendingAck, StreamConfig, open_nats
from broker.nats._servers import open_nats_servers

N = 100_000
JS_N = 5_000
WINDOW = 64
PACKED = 6_500


async def core_publishes(url: str, n: int) -> float:
    async with open_nats(url) as client:
        payload = b"x" * 100
        await client.flush()
        start = time.process_time()
        for _ in range(n):
            await client.publish("bench.core", payload)
        await client.flush()
        return (time.process_time() - start) / n


async def jetstream_publishes(url: str, n: int, window: int) -> float:
    async with open_nats(url) as client:
        js = JetStream(client, timeout=30)
        await js.add_stream(StreamConfig("BENCH", ["bench.js.>"], allow_direct=True))
        payload = b"r" * PACKED
        in_flight: deque[PendingAck] = deque()
        start = time.process_time()
        for i in range(n):
            if len(in_flight) >= window:
                await in_flight.popleft().wait()
            in_flight.append(js.publish_nowait(f"bench.js.{i % 8}", payload, msg_id=f"run-{i}"))
        while in_flight:
            await in_flight.popleft().wait()
        return (time.process_time() - start) / n


async def jetstream_fetches(url: str, n: int, batch: int) -> float:
    """Client CPU per message pulled, ``batch`` at a time, from what
    :func:`jetstream_publishes` stored."""
    async with open_nats(url) as client:
        js = JetStream(client, timeout=30)
        reader = js.ordered("BENCH", 1)
        got = 0
        start = time.process_time()
        while got < n:
            got += len(await reader.fetch(batch, expires=5.0))
        return (time.process_time() - start) / got


async def jetstream_channels(url: str, n: int, channels: int) -> float:
    """``channels`` tasks, each with one publish in flight (the front end's
    shape: one run in flight per publish channel, many channels)."""
    async with open_nats(url) as client:
        js = JetStream(client, timeout=30)
        await js.add_stream(StreamConfig("BENCH2", ["bench.ch.>"], allow_direct=True))
        payload = b"r" * PACKED
        each = n // channels

        async def channel(index: int) -> None:
            for i in range(each):
                await js.publish(f"bench.ch.{index}", payload, msg_id=f"c{index}-{i}")

        start = time.process_time()
        async with trio.open_nursery() as nursery:
            for index in range(channels):
                nursery.start_soon(channel, index)
        return (time.process_time() - start) / (each * channels)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else N
    with tempfile.TemporaryDirectory() as root, open_nats_servers(Path(root), 1) as servers:
        url = servers[0].url
        loop = python_loop_10m_s()
        core = trio.run(core_publishes, url, n)
        js = trio.run(jetstream_publishes, url, JS_N, WINDOW)
        channels = trio.run(jetstream_channels, url, JS_N, WINDOW)
        fetches = trio.run(jetstream_fetches, url, JS_N, WINDOW)
    print(
        json.dumps(
            {
                "python_loop_10m_s": round(loop, 3),
                "core_publish_client_cpu_us": round(core * 1e6, 2),
                "core_publishes": n,
                "js_publish_6500b_client_cpu_us": round(js * 1e6, 2),
                "js_publish_client_cpu_us_per_record_of_64": round(js * 1e6 / 64, 3),
                "js_channels_6500b_client_cpu_us": round(channels * 1e6, 2),
                "js_channels_client_cpu_us_per_record_of_64": round(channels * 1e6 / 64, 3),
                "js_fetch_6500b_client_cpu_us": round(fetches * 1e6, 2),
                "js_publishes": JS_N,
                "js_window": WINDOW,
            }
        )
    )


if __name__ == "__main__":
    main()
