"""Lossy and latest subscriptions through a worker that does not own the
topic (``broker serve --workers 2``, a client that does not use the
membership): the same bounds and exact counts as on one process.

Such a subscription used to be a reliable queue at the subscriber's worker,
fed by the owner's: a stalled lossy subscriber with ``max_queued: 100``
received all 5,000 records published meanwhile (nothing dropped), a latest
one 45-176 deliveries of 10 keys x 100 versions and no Gap (its drops were
never counted). Now the subscriber's worker keeps the lossy or latest queue
itself, fed by the link, and reports what it and the owner dropped as Gaps.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import trio

from broker.client import Message, Subscription, open_client
from broker.protocol import Policy
from broker.workers import Supervisor, WorkerProcess
from broker.workers._client import http_get

from .test_supervisor import DEADLINE, running_workers, topics_of, worker_config

IDS = ["w0", "w1"]
#: The subscriber's window: what may be in flight to it (sent, not taken by
#: the application) whatever its queue at the broker holds.
WINDOW = 1024
#: Every payload is this long, so that a Deliver frame (the payload, its key
#: and a head) is longer still: the window holds fewer than ``WINDOW //
#: PAYLOAD`` = 10 deliveries, fewer than the 10 keys of the latest test.
PAYLOAD = 100
IN_FLIGHT = WINDOW // PAYLOAD


def direct(worker: WorkerProcess) -> str:
    return f"127.0.0.1:{worker.direct.getsockname()[1]}"


async def stat(worker: WorkerProcess) -> dict[str, Any]:
    assert worker.metrics is not None
    status, body = await http_get(worker.metrics, "/stat.json")
    assert status == 200
    document: dict[str, Any] = json.loads(body)
    return document


async def owner_side(owner: WorkerProcess, topic: str) -> dict[str, Any] | None:
    """The owner's subscription to ``topic`` (the one the link made), if any."""
    document = await stat(owner)
    for connection in document["connections"]:
        for subscription in connection["subscriptions"]:
            if subscription["topic"] == topic:
                found: dict[str, Any] = subscription
                return found
    return None


async def wait_for(condition: Callable[[], Awaitable[bool]], what: str) -> None:
    """Poll ``condition`` until it holds (the workers are other processes:
    their state is read from their /stat.json)."""
    deadline = trio.current_time() + DEADLINE
    while not await condition():
        if trio.current_time() > deadline:
            raise AssertionError(f"timed out after {DEADLINE}s waiting for {what}")
        await trio.sleep(0.02)


async def all_handed_over(owner: WorkerProcess, via: WorkerProcess, topic: str, count: int) -> bool:
    """Whether the owner's subscription has taken all ``count`` records and
    sent or dropped each (none queued there), and the subscriber's worker
    has taken everything it sent: from now on nothing more reaches the
    subscriber's worker, all of it is in that worker's queue or its window."""
    at_owner = await owner_side(owner, topic)
    if at_owner is None or at_owner["queued"]:
        return False
    dropped = at_owner.get("dropped_overflow", 0) + at_owner.get("dropped_replaced", 0)
    if at_owner["delivered"] + dropped != count:
        return False
    (link,) = (await stat(via))["broker"]["links"]
    relayed: int = link["deliveries_relayed"]
    delivered: int = at_owner["delivered"]
    return relayed == delivered


async def drain(subscription: Subscription, total: int) -> list[Message]:
    """Receive until deliveries and the Gaps' counts account for ``total``
    (failing with what they say if they never do)."""
    messages: list[Message] = []
    with trio.move_on_after(DEADLINE):
        while len(messages) + subscription.missed < total:
            messages.append(await subscription.receive())
        return messages
    raise AssertionError(
        f"{len(messages)} received and {subscription.missed} missed (the Gaps' counts) "
        f"of {total}, after {DEADLINE}s"
    )


def padded(text: bytes) -> bytes:
    return text.ljust(PAYLOAD, b".")


async def stalled_through_a_non_owner(
    supervisor: Supervisor,
    mode: str,
    options: dict[str, Any],
    records: Sequence[tuple[bytes, bytes | None]],
) -> tuple[list[Message], int]:
    """A subscriber at the worker that does not own the topic, which reads
    nothing while ``records`` (payload, key) are published at the owner;
    then what it receives and what its Gaps say it missed."""
    owner, via = supervisor.workers  # (w0 owns the topic)
    (topic,) = topics_of("w0", IDS, 1)
    async with (
        open_client(direct(via), name="subscriber", policy=Policy(deliver_capacity=WINDOW)) as sub,
        sub.subscribe(topic, mode=mode, options=options) as subscription,
        open_client(direct(owner), name="publisher") as publisher,
    ):

        async def made() -> bool:
            return await owner_side(owner, topic) is not None

        await wait_for(made, "the subscription made at the owner")
        with trio.fail_after(DEADLINE):
            for payload, key in records:
                await publisher.publish(topic, payload, key=key)
            await publisher.flush()

        async def handed_over() -> bool:
            return await all_handed_over(owner, via, topic, len(records))

        await wait_for(handed_over, "every record sent or dropped by the owner, and relayed")
        messages = await drain(subscription, len(records))
        return messages, subscription.missed


def assert_numbered(messages: list[Message], missed: int) -> None:
    """Sequence numbers increase; the holes between them are what the Gaps said."""
    seqs = [m.seq for m in messages]
    assert seqs == sorted(set(seqs))
    holes = seqs[0] - 1 + sum(b - a - 1 for a, b in itertools.pairwise(seqs))
    assert holes == missed


async def test_a_stalled_lossy_subscriber_through_a_non_owner_keeps_its_bound(
    tmp_path: Path,
) -> None:
    published = 5000
    max_queued = 100
    records = [(padded(b"%d" % n), None) for n in range(published)]
    async with running_workers(worker_config(tmp_path), 2) as supervisor:
        messages, missed = await stalled_through_a_non_owner(
            supervisor, "lossy", {"max_queued": max_queued}, records
        )
    # Exactly accounted for: each record either received or in a Gap.
    assert len(messages) + missed == published
    assert_numbered(messages, missed)
    # Bounded: what was in flight to it when it stalled (its window), and
    # the newest max_queued its worker kept.
    assert len(messages) <= max_queued + IN_FLIGHT, len(messages)
    # The newest are the ones kept.
    assert messages[-1].payload == padded(b"%d" % (published - 1))


async def test_a_stalled_latest_subscriber_through_a_non_owner_gets_each_keys_newest(
    tmp_path: Path,
) -> None:
    keys = [b"k%d" % k for k in range(10)]
    versions = 100
    records = [(padded(b"%s=%d" % (key, v)), key) for v in range(versions) for key in keys]
    async with running_workers(worker_config(tmp_path), 2) as supervisor:
        messages, missed = await stalled_through_a_non_owner(supervisor, "latest", {}, records)
    assert len(messages) + missed == len(records)
    assert_numbered(messages, missed)
    # At most one version of a key was in the window (it holds fewer than
    # 10 deliveries, the first ones), and one waited at the broker: the newest.
    per_key = Counter(m.key for m in messages)
    assert max(per_key.values()) <= 2, per_key
    newest = {m.key: m.payload for m in messages}
    assert newest == {key: padded(b"%s=%d" % (key, versions - 1)) for key in keys}
