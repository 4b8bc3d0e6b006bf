"""The MQTT benchmark's flat-out clients, run in a worker process
(``broker.bench._worker``, roles ``mqtt_flood`` and ``mqtt_count``), over
MQTT 3.1.1 with the bench's own codec (``_mqtt``): the same clients for
every broker they are pointed at.

``mqtt_flood`` publishes flat out, ``count`` messages or for ``duration``
seconds, each payload stamped with its send time and a sequence number; at
QoS 1 with at most ``window`` PUBLISHes unacknowledged (as a client that
honours a broker's Receive Maximum), sent in writes of up to 64.

``mqtt_count`` subscribes with ``connections`` connections (each its own
client id), prints ``ready`` once all are subscribed, and counts what
arrives: messages, distinct sequence numbers, duplicates, messages out of
order, and the time of every ``mark_every``-th distinct one (to tell how
many came within a window). Each read's deliveries are acknowledged with
their PUBACKs in one send. ``bytes_per_s`` paces the reads of the socket
(reads of at most 4 KiB, on a clock schedule): a slow consumer, whose
broker meets TCP backpressure. It stops at ``count`` distinct messages, or
``idle`` seconds after the last read once the count is known; the count is
``count``, or the number written to the file ``release`` (by the bench,
once the publisher is done: pacing stops then too, and what is left is
read flat out).
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from typing import Any

import trio

from . import _mqtt as mqtt
from ._mqtt_worker import _Connection
from ._open_loop import STAMP, filler_for

#: PUBLISHes sent in one write at most.
_CHUNK = 64
#: Bytes one paced read takes at most.
_PACED_READ = 4096
#: How far behind its schedule a paced reader may be before it starts anew.
_BURST_NS = 50_000_000


async def mqtt_flood(spec: dict[str, Any]) -> dict[str, Any]:
    """Publish to ``topic`` flat out (see the module)."""
    topic: str = spec["topic"]
    qos: int = spec.get("qos", 1)
    window: int = spec.get("window", 1024) if qos else _CHUNK
    count: int = spec.get("count", 0)
    duration: float = spec.get("duration", 0.0)
    size: int = spec.get("size", 100)
    filler = filler_for(size)
    prefix = mqtt.publish_prefix(topic, len(filler) + STAMP.size, qos)
    ids = [mqtt.packet_id_bytes(n) for n in range(65_536)] if qos else [b""] * 65_536
    stamp = STAMP.pack
    clock = time.perf_counter_ns
    connection = await _Connection.open(spec["url"], spec.get("client_id", "bench-mqtt-flood"))
    sent = acked = 0
    room = trio.Event()
    all_acked = trio.Event()
    start = clock()
    deadline = start + int(duration * 1e9) if duration else 0

    async def read_acks() -> None:
        nonlocal acked, room
        while True:
            packets = await connection.receive_batch()
            for packet in packets:
                if packet.type != mqtt.PUBACK:
                    raise RuntimeError(f"publisher got MQTT packet type {packet.type}")
            acked += len(packets)
            room.set()
            if done and acked >= sent:
                all_acked.set()

    done = False
    async with trio.open_nursery() as nursery:
        if qos:
            nursery.start_soon(read_acks)
        while (count and sent < count) or (deadline and clock() < deadline):
            free = window - (sent - acked) if qos else _CHUNK
            if free <= 0:
                room = trio.Event()
                await room.wait()
                continue
            n = min(free, _CHUNK, count - sent) if count else min(free, _CHUNK)
            now = clock()
            chunk = b"".join(
                prefix + ids[(seq % 65_535) + 1] + stamp(now, seq) + filler
                for seq in range(sent, sent + n)
            )
            sent += n
            await connection.send(chunk)
        published = clock()
        done = True
        if qos and acked < sent:
            await all_acked.wait()
        nursery.cancel_scope.cancel()
    await connection.close()
    return {
        "start": start,
        "published": published,
        "end": clock(),
        "sent": sent,
        "acked": acked if qos else 0,
    }


async def mqtt_count(spec: dict[str, Any]) -> dict[str, Any]:
    """Subscribe to ``topic`` and count what arrives (see the module)."""
    topic: str = spec["topic"]
    qos: int = spec.get("qos", 1)
    connections: int = spec.get("connections", 1)
    client_id: str = spec.get("client_id", "bench-mqtt-count")
    bytes_per_s: float = spec.get("bytes_per_s", 0.0)
    release: str = spec.get("release", "")
    idle: float = spec.get("idle", 5.0)
    mark_every: int = spec.get("mark_every", 100)
    timeout: float = spec.get("timeout", math.inf)
    target = [int(spec.get("count", 0))]  # (0: not known yet)
    released = trio.Event()
    if not release:
        released.set()
    ready = 0
    results: list[dict[str, Any]] = []
    scopes: list[trio.CancelScope] = []
    clock = time.perf_counter_ns
    unpack = STAMP.unpack_from

    async def watch_release() -> None:
        while True:
            try:
                text = (await trio.Path(release).read_text()).strip()
            except FileNotFoundError:
                text = ""
            if text:
                target[0] = int(text)
                released.set()
                for scope in scopes:  # (a reader waiting on a read gives up too)
                    scope.deadline = min(scope.deadline, trio.current_time() + idle)
                return
            await trio.sleep(0.05)

    async def one(index: int) -> None:
        nonlocal ready
        connection = await _Connection.open(spec["url"], f"{client_id}-{index}")
        await connection.send(mqtt.subscribe(1, topic, qos))
        _ident, granted = mqtt.parse_suback(await connection.receive())
        if granted != [qos]:
            raise RuntimeError(f"MQTT broker granted {granted}, not QoS {qos}")
        ready += 1
        if ready == connections:
            print("ready", flush=True)
        stream = connection.stream
        seen = bytearray()
        received = unique = duplicates = reordered = highest = 0
        first = last = read_bytes = 0
        marks: list[int] = []
        data = b""
        due = clock()
        with trio.CancelScope() as scope:
            scopes.append(scope)
            if target[0]:
                scope.deadline = trio.current_time() + idle
            while True:
                acks = []
                now = clock()
                for packet in connection.feed(data):
                    if packet.type != mqtt.PUBLISH:
                        raise RuntimeError(f"subscriber got MQTT packet type {packet.type}")
                    message = mqtt.parse_publish(packet)
                    if message.qos:
                        acks.append(mqtt.puback(message.packet_id))
                    seq = unpack(message.payload)[1]
                    received += 1
                    if seq >= len(seen):
                        seen.extend(bytes(seq + 1024 - len(seen)))
                    if seen[seq]:
                        duplicates += 1
                        continue
                    seen[seq] = 1
                    if seq < highest:
                        reordered += 1
                    highest = max(highest, seq)
                    unique += 1
                    if unique % mark_every == 0:
                        marks.append(now)
                    first = first or now
                    last = now
                if acks:
                    await connection.send(b"".join(acks))
                if target[0]:
                    if unique >= target[0]:
                        break
                    scope.deadline = trio.current_time() + idle
                if bytes_per_s and not released.is_set():
                    # (A clock schedule that lends no more than _BURST_NS of
                    # time not spent reading: no burst after a wait.)
                    due = max(due, now - _BURST_NS) + int(len(data) / bytes_per_s * 1e9)
                    if due > now:
                        await trio.sleep((due - now) / 1e9)
                    data = await stream.receive_some(_PACED_READ)
                else:
                    data = await stream.receive_some(65536)
                if not data:
                    raise RuntimeError("MQTT broker closed the connection")
                read_bytes += len(data)
        results.append(
            {
                "received": received,
                "unique": unique,
                "duplicates": duplicates,
                "reordered": reordered,
                "first": first,
                "last": last,
                "marks": marks,
                "mark_every": mark_every,
                "bytes": read_bytes,
            }
        )
        with trio.move_on_after(5):
            with contextlib.suppress(trio.BrokenResourceError):
                await connection.close()

    with trio.move_on_after(timeout):
        async with trio.open_nursery() as nursery:
            if release:
                nursery.start_soon(watch_release)
            async with trio.open_nursery() as readers:
                for index in range(connections):
                    readers.start_soon(one, index)
            nursery.cancel_scope.cancel()
    return {"subscribers": results}


def write_release(path: str, count: int) -> None:
    """Tell ``mqtt_count`` workers watching ``path`` that ``count``
    messages were published (atomically: they never read half of it)."""
    partial = f"{path}.part"
    with open(partial, "w") as file:
        file.write(f"{count}\n")
    os.replace(partial, path)
