"""The log-reading subscriber of the benchmark workers (role ``logsub``).

It subscribes reliably with Subscribe ``options`` (``{"from": "earliest"}``
replays), checks the offsets of what it gets (a broker with topic logs
numbers a reliable subscription's deliveries by record offset: every offset
must come once, consecutively), and reads either flat out or at a fixed
byte rate for ``duration`` seconds and then flat out (the slow consumer
catching up: whatever it lagged is still in the log).

It stops once it has ``count`` messages, or (``count`` 0) once nothing has
come for ``idle`` seconds after the first message. With ``stamped`` (flat
out only), it also checks the sequence numbers in the payloads' stamps (one
publisher's, from 0): ``out_of_order`` counts those not one more than the
one before.
"""

from __future__ import annotations

import math
import time
from typing import Any

import trio

from broker.client import open_client

from ._open_loop import STAMP

#: A reader at a fixed rate wakes at most this often (seconds).
READ_EVERY = 0.01


class OffsetCheck:
    """Offsets seen by one subscription: gaps (offsets skipped) and
    duplicates (an offset at or below one already seen)."""

    __slots__ = ("duplicates", "first", "gaps", "last", "received")

    def __init__(self) -> None:
        self.first = 0
        self.last = 0
        self.gaps = 0
        self.duplicates = 0
        self.received = 0

    def see(self, offset: int) -> None:
        """Count one delivery numbered ``offset``."""
        self.received += 1
        if not self.first:
            self.first = self.last = offset
            return
        if offset <= self.last:
            self.duplicates += 1
            return
        self.gaps += offset - self.last - 1
        self.last = offset

    def figures(self) -> dict[str, int]:
        return {
            "received": self.received,
            "first_offset": self.first,
            "last_offset": self.last,
            "gaps": self.gaps,
            "duplicates": self.duplicates,
        }


async def read_log(spec: dict[str, Any]) -> dict[str, Any]:
    """Subscribe as ``spec`` says (see the module); prints ``ready`` once subscribed."""
    count: int = spec.get("count", 0)
    rate_bytes: float = spec.get("rate_bytes", 0.0)
    duration: float = spec.get("duration", 0.0)
    idle: float = spec.get("idle", 2.0)
    #: Payload bytes of one message (what a fixed byte rate is counted in).
    size: int = spec.get("size", 100)
    check = OffsetCheck()
    first = last = 0
    rated = 0
    rated_last = 0
    stamped: bool = spec.get("stamped", False)
    out_of_order = 0
    expected = 0
    async with (
        open_client(spec["url"], name=spec.get("name", "bench-logsub")) as client,
        client.subscribe(spec["topic"], options=spec.get("options") or None) as subscription,
    ):
        subscribed = time.perf_counter_ns()
        print("ready", flush=True)
        if rate_bytes:
            # At a fixed byte rate: what is due by now, taken in one call at
            # most every READ_EVERY seconds (a reader slower than the topic,
            # whose own CPU stays small on a machine it shares).
            consumed = 0

            def due() -> float:
                """Payload bytes the rate allows beyond what was consumed."""
                return (time.perf_counter_ns() - first) / 1e9 * rate_bytes - consumed

            with trio.move_on_after(duration):
                while not count or check.received < count:
                    most = 1
                    if first:
                        if due() < size:
                            await trio.sleep(max((size - due()) / rate_bytes, READ_EVERY))
                        most = max(1, int(due() // size))
                    if count:
                        most = min(most, count - check.received)
                    batch = await subscription.receive_batch(most)
                    last = time.perf_counter_ns()
                    first = first or last
                    for message in batch:
                        check.see(message.seq)
                        consumed += len(message.payload)
            rated = check.received
            rated_last = last
        # Flat out (and a slow reader's catching up): whole batches at a time.
        while not count or check.received < count:
            wait = idle if check.received else math.inf
            with trio.move_on_after(wait):
                batch = await subscription.receive_batch()
                for message in batch:
                    check.see(message.seq)
                    if stamped:
                        seq = STAMP.unpack_from(message.payload)[1]
                        out_of_order += seq != expected
                        expected = seq + 1
                last = time.perf_counter_ns()
                first = first or last
                continue
            break
    return {
        **check.figures(),
        "out_of_order": out_of_order,
        "subscribed": subscribed,
        "first": first,
        "last": last,
        "rated_received": rated,
        "rated_last": rated_last,
    }


async def read_many(spec: dict[str, Any]) -> dict[str, Any]:
    """Role ``logsubs``: one client subscribed reliably to each of
    ``spec["topics"]`` (with ``options``), flat out, until ``count``
    messages came over all of them; each subscription's offsets checked
    as :func:`read_log` checks one. Prints ``ready`` once subscribed."""
    count: int = spec["count"]
    checks = [OffsetCheck() for _ in spec["topics"]]
    first = last = 0
    received = 0
    done = trio.Event()
    async with open_client(spec["url"], name=spec.get("name", "bench-logsubs")) as client:

        async def read(topic: str, check: OffsetCheck, ready: trio.Event) -> None:
            nonlocal first, last, received
            async with client.subscribe(topic, options=spec.get("options") or None) as sub:
                ready.set()
                while not done.is_set():
                    batch = await sub.receive_batch()
                    last = time.perf_counter_ns()
                    first = first or last
                    for message in batch:
                        check.see(message.seq)
                    received += len(batch)
                    if received >= count:
                        done.set()

        async with trio.open_nursery() as nursery:
            for topic, check in zip(spec["topics"], checks, strict=True):
                ready = trio.Event()
                nursery.start_soon(read, topic, check, ready)
                await ready.wait()
            print("ready", flush=True)
            await done.wait()
            nursery.cancel_scope.cancel()
    figures = [check.figures() for check in checks]
    return {
        "received": sum(f["received"] for f in figures),
        "gaps": sum(f["gaps"] for f in figures),
        "duplicates": sum(f["duplicates"] for f in figures),
        "first": first,
        "last": last,
    }
