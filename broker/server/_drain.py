"""What a graceful shutdown waits for before its Goodbyes: the topics to
route what was forwarded to them, then the reliable deliveries queued for
connected subscribers to go out (see ``Broker.shutdown``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

import trio

from broker.protocol import Connection, DeliveryMode

from ._topic import Subscription, Topic

__all__ = ["SHUTDOWN_POLL", "queued_deliveries", "route_forwarded", "send_queued_deliveries"]

#: How often a graceful shutdown looks whether queued deliveries went out.
SHUTDOWN_POLL = 0.01


class Subscribed(Protocol):
    """A connection, as the drain sees it: its protocol and subscriptions."""

    @property
    def protocol(self) -> Connection: ...

    @property
    def subscriptions(self) -> Mapping[int, Subscription]: ...


async def route_forwarded(topics: Iterable[Topic]) -> None:
    """Return once ``topics`` have routed every publish forwarded to them
    (none is forwarded once the shutdown began; the owners of topics that
    other workers own confirmed what was sent on to them)."""
    waiting = list(topics)
    while waiting:
        waiting = [t for t in waiting if t.statistics().mailbox or t.forwarding]
        if waiting:
            await trio.sleep(SHUTDOWN_POLL)


def queued_deliveries(connections: Iterable[Subscribed]) -> list[tuple[Subscription, int]]:
    """Each reliable subscription of a connected subscriber with deliveries
    queued (waiting for its guarantees), and how many: those charged to
    their publishers, and those relayed from another worker (a forwarded
    subscription pays for its own, but its client's publishers saw them
    confirmed all the same)."""
    return [
        (subscription, subscription.queued)
        for connection in connections
        if not connection.protocol.closed
        for subscription in connection.subscriptions.values()
        if subscription.queued
        and (subscription.charges_publishers or subscription.mode == DeliveryMode.RELIABLE)
    ]


async def send_queued_deliveries(connections: Iterable[Subscribed]) -> None:
    """Return once every reliable delivery queued (routed, waiting for its
    subscriber's guarantees) is sent, or its subscription or connection is
    gone. Nothing is routed meanwhile, so the queues only shrink; the
    caller bounds the wait, for subscribers that issue no more guarantees."""
    waiting = [subscription for subscription, _ in queued_deliveries(connections)]
    while waiting:
        waiting = [
            subscription
            for subscription in waiting
            if subscription.queued
            and subscription.connection.open
            and subscription.connection.subscriptions.get(subscription.handle) is subscription
        ]
        if waiting:
            await trio.sleep(SHUTDOWN_POLL)
