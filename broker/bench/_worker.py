"""A benchmark client process: ``python -m broker.bench._worker '<json spec>'``.

Roles: ``pub`` publishes (flat out, or open-loop at a fixed rate with the
*scheduled* send time in each payload, so latency has no coordinated
omission); ``sub`` subscribes with one or more connections, prints
``ready`` once subscribed, and records receive times and latencies. The
result is one JSON line on stdout.
"""

from __future__ import annotations

import json
import math
import struct
import sys
import time
from typing import Any

import trio

from broker.client import open_client

_STAMP = struct.Struct(">qQ")  # scheduled send time (ns), sequence number


def _payload(size: int, stamp_ns: int, seq: int) -> bytes:
    head = _STAMP.pack(stamp_ns, seq)
    return head + b"x" * max(0, size - len(head))


async def _publish(spec: dict[str, Any]) -> dict[str, Any]:
    size: int = spec.get("size", 100)
    count: int = spec.get("count", 0)
    duration: float = spec.get("duration", 0.0)
    topics: list[dict[str, Any]] = spec["topics"]
    sent: dict[str, int] = {}
    timelines: dict[str, list[tuple[int, int]]] = {}
    start = time.perf_counter_ns()

    async with open_client(spec["url"], name="bench-pub") as client:

        async def flat_out(topic: str) -> None:
            n = 0
            deadline = start + int(duration * 1e9) if duration else None
            samples = timelines[topic] = []
            next_sample = start
            while (count and n < count) or (deadline and time.perf_counter_ns() < deadline):
                now = time.perf_counter_ns()
                if now >= next_sample:
                    samples.append((now, n))
                    next_sample = now + 250_000_000
                await client.publish(topic, _payload(size, now, n))
                n += 1
            samples.append((time.perf_counter_ns(), n))
            sent[topic] = n

        async def at_rate(topic: str, rate: float) -> None:
            interval = 1e9 / rate
            total = count or int(rate * duration)
            t0 = time.perf_counter_ns()
            for n in range(total):
                scheduled = t0 + int(n * interval)
                now = time.perf_counter_ns()
                if scheduled > now:
                    await trio.sleep((scheduled - now) / 1e9)
                await client.publish(topic, _payload(size, scheduled, n))
            sent[topic] = total

        async with trio.open_nursery() as nursery:
            for topic in topics:
                if topic.get("rate"):
                    nursery.start_soon(at_rate, topic["name"], topic["rate"])
                else:
                    nursery.start_soon(flat_out, topic["name"])
        published = time.perf_counter_ns()
        await client.flush()
    return {
        "start": start,
        "published": published,
        "end": time.perf_counter_ns(),
        "sent": sent,
        "timelines": timelines,
    }


async def _subscribe(spec: dict[str, Any]) -> dict[str, Any]:
    count: int = spec.get("count", 0)
    connections: int = spec.get("connections", 1)
    rate: float = spec.get("rate", 0.0)
    duration: float = spec.get("duration", 0.0)
    record: bool = spec.get("latency", False)
    results: list[dict[str, Any]] = []
    ready = 0

    async def one(index: int) -> None:
        nonlocal ready
        latencies: list[int] = []
        received = 0
        gaps = 0
        expected = 0
        first = last = 0
        async with (
            open_client(spec["url"], name=f"bench-sub-{index}") as client,
            client.subscribe(spec["topic"]) as subscription,
        ):
            ready += 1
            if ready == connections:
                print("ready", flush=True)
            interval = 1e9 / rate if rate else 0
            with trio.move_on_after(duration or math.inf):
                while not count or received < count:
                    if interval and received:
                        due = first + int(received * interval)
                        now = time.perf_counter_ns()
                        if due > now:
                            await trio.sleep((due - now) / 1e9)
                    message = await subscription.receive()
                    now = time.perf_counter_ns()
                    stamp, seq = _STAMP.unpack_from(message.payload)
                    if seq != expected:
                        gaps += abs(seq - expected)
                    expected = seq + 1
                    if not received:
                        first = now
                    last = now
                    received += 1
                    if record:
                        latencies.append(now - stamp)
        results.append(
            {
                "received": received,
                "first": first,
                "last": last,
                "gaps": gaps,
                "latencies": latencies,
            }
        )

    async with trio.open_nursery() as nursery:
        for index in range(connections):
            nursery.start_soon(one, index)
    return {"subscribers": results}


def main() -> None:
    spec = json.loads(sys.argv[1])
    role = spec["role"]
    result = trio.run(_publish if role == "pub" else _subscribe, spec)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
