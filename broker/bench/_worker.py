"""A benchmark client process: ``python -m broker.bench._worker '<json spec>'``.

Roles: ``logsub`` reads a broker's topic log (see ``_log_worker``);
``member`` is a consumer group's member (see ``_group_worker``);
``pub`` publishes (flat out, or open-loop at a fixed rate with the
*scheduled* send time in each payload, so latency has no coordinated
omission); ``sub`` subscribes with one or more connections, prints
``ready`` once subscribed, and records receive times and latencies;
``mqtt_pub`` and ``mqtt_sub`` do the open-loop latency run's part over
MQTT, against a peer broker (see ``_mqtt_worker``); ``mqtt_flood`` and
``mqtt_count`` publish flat out and count deliveries over MQTT (see
``_mqtt_load``). The result is one JSON line on stdout.
"""

from __future__ import annotations

import json
import math
import resource
import sys
import time
from typing import Any

import trio

from broker.client import open_client
from broker.config import BrokerConfig
from broker.runtime import tune_gc

from ._group_worker import member
from ._log_worker import read_log, read_many
from ._mqtt_load import mqtt_count, mqtt_flood
from ._mqtt_worker import mqtt_publish, mqtt_subscribe
from ._open_loop import STAMP, filler_for, schedule
from ._raw_worker import raw_publish, raw_subscribe

GC_THRESHOLD = BrokerConfig.gc_threshold


async def _publish(spec: dict[str, Any]) -> dict[str, Any]:
    size: int = spec.get("size", 100)
    count: int = spec.get("count", 0)
    duration: float = spec.get("duration", 0.0)
    topics: list[dict[str, Any]] = spec["topics"]
    sent: dict[str, int] = {}
    timelines: dict[str, list[tuple[int, int]]] = {}
    late: dict[str, list[int]] = {}
    start = time.perf_counter_ns()
    filler = filler_for(size)
    stamp = STAMP.pack

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
                await client.publish(topic, stamp(now, n) + filler)
                n += 1
            samples.append((time.perf_counter_ns(), n))
            sent[topic] = n

        async def at_rate(topic: str, rate: float) -> None:
            total = count or int(rate * duration)
            late[topic] = []
            async for n, scheduled in schedule(rate, total, late[topic]):
                await client.publish(topic, stamp(scheduled, n) + filler)
            sent[topic] = total

        async def round_robin(names: list[str]) -> None:
            # One task, each message to the next topic in turn (``count`` in all).
            timelines[names[0]] = [(start, 0)]
            for n in range(count):
                await client.publish(
                    names[n % len(names)], stamp(time.perf_counter_ns(), n) + filler
                )
            for index, name in enumerate(names):
                sent[name] = len(range(index, count, len(names)))
            timelines[names[0]].append((time.perf_counter_ns(), count))

        async with trio.open_nursery() as nursery:
            if spec.get("round_robin"):
                nursery.start_soon(round_robin, [topic["name"] for topic in topics])
                topics = []
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
        "lateness": late,
    }


def _count_gaps(seqs: list[int], gaps: int, expected: int) -> tuple[int, int]:
    """``gaps`` and ``expected`` (the next sequence number) after ``seqs``
    (the hot loops below do the same inline, for speed)."""
    for seq in seqs:
        if seq != expected:
            gaps += abs(seq - expected)
        expected = seq + 1
    return gaps, expected


async def _subscribe(spec: dict[str, Any]) -> dict[str, Any]:
    count: int = spec.get("count", 0)
    connections: int = spec.get("connections", 1)
    rate: float = spec.get("rate", 0.0)
    duration: float = spec.get("duration", 0.0)
    record: bool = spec.get("latency", False)
    drain_idle: float = spec.get("drain_idle", 0.0)
    batch = spec.get("batch", True) and not rate and not record
    lean = count and not duration and not batch and not rate and not record
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
                # Flat out and not timing each message: take what is here in
                # one call, as a consumer handling messages in bulk would.
                while batch and count and received < count:
                    for message in await subscription.receive_batch():
                        _stamp, seq = STAMP.unpack_from(message.payload)
                        if seq != expected:
                            gaps += abs(seq - expected)
                        expected = seq + 1
                        received += 1
                    last = time.perf_counter_ns()
                    first = first or last
                # Flat out, one receive() per message: as lean a loop.
                while lean and received < count:
                    message = await subscription.receive()
                    _stamp, seq = STAMP.unpack_from(message.payload)
                    if seq != expected:
                        gaps += abs(seq - expected)
                    expected = seq + 1
                    received += 1
                    if received == 1:
                        first = time.perf_counter_ns()
                if lean:
                    last = time.perf_counter_ns()
                while not count or received < count:
                    if interval and received:
                        due = first + int(received * interval)
                        now = time.perf_counter_ns()
                        if due > now:
                            await trio.sleep((due - now) / 1e9)
                    message = await subscription.receive()
                    now = time.perf_counter_ns()
                    stamp, seq = STAMP.unpack_from(message.payload)
                    if seq != expected:
                        gaps += abs(seq - expected)
                    expected = seq + 1
                    if not received:
                        first = now
                    last = now
                    received += 1
                    if record:
                        latencies.append(now - stamp)
            # Then, if asked, take what is still queued at full speed, until
            # nothing has come for ``drain_idle`` seconds: a reliable
            # subscriber gets everything in the end, however slow it was.
            drained = 0
            while drain_idle:
                with trio.move_on_after(drain_idle):
                    batch_seqs = [
                        STAMP.unpack_from(m.payload)[1] for m in await subscription.receive_batch()
                    ]
                    gaps, expected = _count_gaps(batch_seqs, gaps, expected)
                    drained += len(batch_seqs)
                    continue
                break
        results.append(
            {
                "received": received,
                "drained": drained,
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


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    spec = json.loads(sys.argv[1])
    # Tuned as the broker tunes itself (BrokerConfig.gc_threshold): the
    # clients are the load, and should cost what a tuned client costs.
    tune_gc(GC_THRESHOLD)
    role = spec["role"]
    # The CPU of the work, not of the interpreter's start-up and imports.
    before = _cpu_seconds()
    roles = {
        "pub": _publish,
        "sub": _subscribe,
        "logsub": read_log,
        "logsubs": read_many,
        "member": member,
        "mqtt_pub": mqtt_publish,
        "mqtt_sub": mqtt_subscribe,
        "mqtt_flood": mqtt_flood,
        "mqtt_count": mqtt_count,
        "raw_pub": raw_publish,
        "raw_sub": raw_subscribe,
    }
    try:
        result = trio.run(roles[role], spec)
    except Exception as error:
        # One line (the bench then says that a worker failed, and stops).
        while isinstance(error, ExceptionGroup) and error.exceptions:
            error = error.exceptions[0]
        print(f"broker bench: a {role} worker failed: {error}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    result["cpu_s"] = _cpu_seconds() - before
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
