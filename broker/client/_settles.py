"""Settling a consumer group member's messages: ``Settle`` frames, done
ones batched.

A member settles each message it took (``Message.ack()``, ``retry()``,
``reject()``, ``in_progress()``). *Done* settles are gathered and sent as
ranges in one frame: once ``settle_batch`` of them wait (``_subscription``), else within
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

from broker.protocol import Connection, LocalProtocolError, SettleOutcome
from broker.protocol.frames import max_settle_ranges, settle_ranges

from ._acks import HeldAcks
from ._subscription import SETTLE_BATCH, SubscriptionState

__all__ = ["SETTLE_BATCH", "flush_settles", "settle"]

#: (A Settle holds no bytes: it is held back by time only.)
_BY_TIME_ONLY = 1 << 30


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
        done = subscription._done
        done.append(seq)
        count = len(done)
        if count == 1:  # (the first of a batch starts the ack_delay timer)
            if session.held.hold(subscription, 1, session.clock(), _BY_TIME_ONLY):
                return
        elif count < subscription._settle_batch:
            return
        flush_settles(session, subscription)
        return
    subscription._other.append((seq, outcome, detail))
    flush_settles(session, subscription)


def flush_settles(session: SettlingSession, subscription: SubscriptionState) -> None:
    """Send the settles ``subscription`` gathered: its done ones as ranges
    in as few frames as fit, the others one by one (all kept while the
    connection is being replaced)."""
    if not subscription._done and not subscription._other:
        return
    conn = session.conn
    if conn.closed or not session.ready:
        return
    with contextlib.suppress(LocalProtocolError):  # (being freed)
        if subscription._done:
            seqs = subscription._done
            subscription._done = []
            ranges = settle_ranges(seqs)
            most = max(1, max_settle_ranges(conn.peer_max_frame))
            for start in range(0, len(ranges), most):
                conn.settle(subscription.handle, SettleOutcome.DONE, ranges[start : start + most])
            subscription.settles_sent += len(seqs)
            subscription._sent_done.extend(seqs)
        others = subscription._other
        subscription._other = []
        for seq, outcome, detail in others:
            conn.settle(subscription.handle, SettleOutcome(outcome), [(seq, 1)], detail)
            subscription.settles_sent += 1
        subscription._sent_other.extend(others)
    session.on_output()
