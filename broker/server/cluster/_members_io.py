"""The trio driver of a front end's membership (``_members.py``) over core NATS.

:func:`serve_membership` publishes this front end's heartbeat, feeds what is
heard on the subject into the table, expires the silent ones on time and
tells the caller of every change.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import trio

from broker.errors import sole_exception
from broker.nats import NatsClient, NatsError, SlowConsumer, Subscription
from broker.protocol import Cluster

from ._members import Membership, encode_heartbeat

__all__ = ["LEAVE_TIMEOUT", "serve_membership"]

log = logging.getLogger(__name__)

#: How long a stopping front end tries to tell the others it is leaving.
LEAVE_TIMEOUT = 1.0


async def serve_membership(
    client: NatsClient,
    membership: Membership,
    *,
    subject: str = "broker.members",
    interval: float = 0.5,
    on_change: Callable[[Cluster], None],
    task_status: trio.TaskStatus[Cluster] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Keep ``membership`` up to date until cancelled (or the client closes).

    Publishes ``membership.me``'s heartbeat on ``subject`` every ``interval``
    seconds (less than ``membership.dead_after``), takes every message heard
    there and expires members by the table's deadline.

    Started (``task_status.started(cluster)``) once our own heartbeat came
    back and ``dead_after`` seconds more passed: by then every live front
    end has been heard, so the first cluster already lists them (until our
    heartbeat comes back it waits: bound the start with ``trio.fail_after``).
    After that, ``on_change(cluster)`` is called (synchronously) after every
    change of the members; the changes before the start are in the cluster
    given to ``started``.

    When cancelled, publishes a ``leaving`` heartbeat (best effort, within
    :data:`LEAVE_TIMEOUT` seconds, shielded) and lets the cancellation go on.
    """
    if not 0 < interval < membership.dead_after:
        raise ValueError("the heartbeat interval must be positive and below dead_after")
    failure: BaseException | None = None
    with client.subscribe(subject) as subscription:
        try:
            await client.flush()  # (the server has the subscription before our first beat)
            heartbeat = encode_heartbeat(membership.me)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_beat, client, subject, heartbeat, interval)
                await _listen(subscription, membership, on_change, task_status)
        except BaseExceptionGroup as group:
            failure = sole_exception(group)
            if failure is group:
                raise
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(LEAVE_TIMEOUT):
                await _leave(client, subject, membership)
    if failure is not None:
        raise failure


async def _beat(client: NatsClient, subject: str, heartbeat: bytes, interval: float) -> None:
    """Publish ``heartbeat`` now and every ``interval`` seconds (a late beat
    is sent at once, and the next ones keep their pace from it)."""
    due = trio.current_time()
    while True:
        await client.publish(subject, heartbeat)
        due = max(due + interval, trio.current_time())
        await trio.sleep_until(due)


async def _listen(
    subscription: Subscription,
    membership: Membership,
    on_change: Callable[[Cluster], None],
    task_status: trio.TaskStatus[Cluster],
) -> None:
    """Feed the table what is heard and expire on time; start, then report changes."""
    ready_at: float | None = None
    started = False
    while True:
        now = trio.current_time()
        if membership.expire(now) and started:
            on_change(membership.cluster())
        if not started:
            if ready_at is None and membership.echoed:
                ready_at = now + membership.dead_after
            if ready_at is not None and now >= ready_at:
                started = True
                task_status.started(membership.cluster())
        wake = membership.deadline()
        if not started and ready_at is not None:
            wake = ready_at if wake is None else min(wake, ready_at)
        with trio.move_on_at(math.inf if wake is None else wake):
            try:
                message = await subscription.receive()
            except SlowConsumer as dropped:
                log.warning("membership: %s", dropped)
                continue
            if membership.heard(message.payload, trio.current_time()) and started:
                on_change(membership.cluster())


async def _leave(client: NatsClient, subject: str, membership: Membership) -> None:
    """Tell the others we are leaving, and wait until the server has it."""
    try:
        client.publish_nowait(subject, encode_heartbeat(membership.me, leaving=True))
        await client.flush()
    except (NatsError, trio.WouldBlock) as exc:
        log.info("membership: could not say we are leaving: %s", exc)
