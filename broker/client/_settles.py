"""Settling a consumer group member's messages: ``Settle`` frames, done
ones batched.

A member settles each message it took (``Message.ack()``, ``retry()``,
``reject()``, ``in_progress()``). *Done* settles are gathered and sent as
ranges in one frame: once :func:`settle_batch` of them wait, else within
the policy's ``ack_delay`` (the session's held-acknowledgement timer, 20
ms by default): one frame per batch, not one per message. The others go at once. A settle
made while the connection is being replaced waits for the resumed
session; one of a session lost does nothing (its record went back to the
group: see ``GroupTicket``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Protocol

from broker.protocol import (
    Connection,
    LocalProtocolError,
    SettleOutcome,
    max_settle_ranges,
    settle_ranges,
)

from ._acks import HeldAcks
from ._subscription import SubscriptionState

__all__ = ["SETTLE_BATCH", "flush_settles", "settle"]

#: Done settles of one subscription sent together at the latest.
SETTLE_BATCH = 64
#: A member's ``max_outstanding`` when it names none (the broker's default).
DEFAULT_MAX_OUTSTANDING = 1000


class SettlingSession(Protocol):
    """What settling needs of the client session."""

    @property
    def conn(self) -> Connection: ...

    @property
    def ready(self) -> bool: ...

    @property
    def held(self) -> HeldAcks[SubscriptionState]: ...

    clock: Callable[[], float]
    on_output: Callable[[], object]


def settle(
    session: SettlingSession,
    subscription: SubscriptionState,
    seq: int,
    outcome: int,
    detail: int | str | None,
) -> None:
    """Settle delivery ``seq`` of ``subscription`` (see the module)."""
    if subscription._closed:
        subscription.settles_dropped += 1
        return
    if outcome == SettleOutcome.DONE:
        subscription._done.append(seq)
        if len(subscription._done) < settle_batch(subscription):
            window = 1 << 30  # (held by time only: a Settle holds no bytes)
            if session.held.hold(subscription, 1, session.clock(), window):
                return
        flush_settles(session, subscription)
        return
    flush_settles(session, subscription)
    conn = session.conn
    if conn.closed or not session.ready:
        subscription.settles_dropped += 1  # (ack_wait gives it back all the same)
        return
    with contextlib.suppress(LocalProtocolError):  # (being freed)
        conn.settle(subscription.handle, SettleOutcome(outcome), [(seq, 1)], detail)
        subscription.settles_sent += 1
    session.on_output()


def settle_batch(subscription: SubscriptionState) -> int:
    """How many done settles go in one frame at once: :data:`SETTLE_BATCH`,
    or a quarter of the member's ``max_outstanding`` if less (the broker
    sends a member nothing new while it holds that many, so a batch must
    never wait for deliveries that cannot come)."""
    options = subscription.options or {}
    most = options.get("max_outstanding", DEFAULT_MAX_OUTSTANDING)
    if type(most) is not int or most < 1:
        return 1
    return max(1, min(SETTLE_BATCH, most // 4))


def flush_settles(session: SettlingSession, subscription: SubscriptionState) -> None:
    """Send the done settles ``subscription`` gathered (kept while the
    connection is being replaced)."""
    if not subscription._done:
        return
    conn = session.conn
    if conn.closed or not session.ready:
        return
    seqs = subscription._done
    subscription._done = []
    ranges = settle_ranges(seqs)
    most = max(1, max_settle_ranges(conn.peer_max_frame))
    with contextlib.suppress(LocalProtocolError):  # (being freed)
        for start in range(0, len(ranges), most):
            conn.settle(subscription.handle, SettleOutcome.DONE, ranges[start : start + most])
        subscription.settles_sent += len(seqs)
        subscription._sent_done.extend(seqs)
    session.on_output()
