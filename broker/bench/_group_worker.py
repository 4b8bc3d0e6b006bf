"""A consumer group's member among the benchmark workers (role ``member``).

It subscribes to ``topic`` as a member of ``group`` (from ``"earliest"``,
``max_outstanding``, group ``options``), prints ``ready`` once subscribed,
and acks every message it takes (whole batches at a time). It records the
offset of each delivery, and how many came with ``deliveries`` > 0.

The members of one run stop together: every ``SHARE_EVERY`` seconds each
writes how many distinct offsets it acked to its own file in ``shared``
(``member-<index>``) and sums its siblings' files; once the sum reaches
``count`` (the records published) it stops. ``count`` 0: it runs until
killed (the fault measurements), or stops after ``idle`` seconds with
nothing delivered once something was (with ``idle_always``, even if
nothing was).

With ``journal`` (a file path) it appends ``t <perf_counter_ns>`` as each
batch comes, ``r <offset> <deliveries>`` for each delivery and
``a <offset>`` for each ack, flushed every batch before any ``Settle`` of
it can be sent (never
fsynced: what a ``kill -9`` of the member cuts off is what the process had
not written, and that the kernel keeps).
"""

from __future__ import annotations

import math
import os
import time
from typing import Any, TextIO

import trio

from broker.client import open_client

#: Seconds between two looks at the siblings' counts.
SHARE_EVERY = 0.05


def _write_count(path: str, value: int) -> None:
    temporary = f"{path}.tmp"
    with open(temporary, "w") as out:
        out.write(str(value))
    os.replace(temporary, path)


def _read_counts(shared: str) -> int:
    total = 0
    for name in os.listdir(shared):
        if name.startswith("member-") and not name.endswith(".tmp"):
            try:
                with open(os.path.join(shared, name)) as file:
                    total += int(file.read() or 0)
            except (OSError, ValueError):
                pass
    return total


def _open_journal(path: str) -> TextIO:
    """The journal file, appended to (opened once, before any traffic)."""
    return open(path, "a", buffering=1 << 16)


async def member(spec: dict[str, Any]) -> dict[str, Any]:
    """Be a member as ``spec`` says (see the module)."""
    count: int = spec.get("count", 0)
    shared: str | None = spec.get("shared")
    index: int = spec.get("index", 0)
    idle: float = spec.get("idle", 0.0)
    idle_always: bool = spec.get("idle_always", False)
    journal_path: str | None = spec.get("journal")
    journal = _open_journal(journal_path) if journal_path else None
    offsets: list[int] = []
    seen: set[int] = set()
    redelivered = 0
    first = last = 0
    mine = os.path.join(shared, f"member-{index}") if shared else ""
    try:
        async with (
            open_client(
                spec["url"], name=f"bench-member-{index}", reconnect=spec.get("reconnect", 0.0)
            ) as client,
            client.subscribe(
                spec["topic"],
                group=spec.get("group", "bench"),
                start="earliest",
                max_outstanding=spec.get("max_outstanding", 1000),
                options=spec.get("options") or None,
            ) as subscription,
        ):
            subscribed = time.perf_counter_ns()
            print("ready", flush=True)
            async with trio.open_nursery() as nursery:
                if shared and count:

                    async def watch() -> None:
                        while True:
                            await trio.sleep(SHARE_EVERY)
                            _write_count(mine, len(seen))
                            if _read_counts(shared) >= count:
                                nursery.cancel_scope.cancel()

                    nursery.start_soon(watch)
                while True:
                    wait = idle if (idle and (offsets or idle_always)) else math.inf
                    with trio.move_on_after(wait):
                        batch = await subscription.receive_batch()
                        if journal is not None:
                            journal.write(f"t {time.perf_counter_ns()}\n")
                        for message in batch:
                            offset = message.offset or 0
                            offsets.append(offset)
                            seen.add(offset)
                            if message.deliveries:
                                redelivered += 1
                            if journal is not None:
                                journal.write(f"r {offset} {message.deliveries or 0}\n")
                            message.ack()
                            if journal is not None:
                                journal.write(f"a {offset}\n")
                        if journal is not None:
                            journal.flush()
                        last = time.perf_counter_ns()
                        first = first or last
                        continue
                    break
                nursery.cancel_scope.cancel()
            if mine:
                _write_count(mine, len(seen))
    finally:
        if journal is not None:
            journal.close()
    return {
        "index": index,
        "received": len(offsets),
        "offsets": offsets,
        "redelivered": redelivered,
        "subscribed": subscribed,
        "first": first,
        "last": last,
    }
