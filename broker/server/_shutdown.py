"""What a graceful shutdown waits for before its Goodbyes to clients (see
``Broker.shutdown`` and :func:`drain`): the topics to route what was
forwarded to them; the deliveries queued for other workers' links to go
out, then those links' Goodbyes; the owners of the topics this worker
forwards to, to confirm and relay their last (their Goodbyes); then the
reliable deliveries queued for connected subscribers to go out."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

import trio

from broker.protocol import Connection, DeliveryMode

from .topics._topic import Subscription, Topic

__all__ = [
    "SHUTDOWN_POLL",
    "drain",
    "queued_deliveries",
    "route_forwarded",
    "send_queued_deliveries",
]

#: How often a graceful shutdown looks whether queued deliveries went out.
SHUTDOWN_POLL = 0.01


class Subscribed(Protocol):
    """A connection, as the drain sees it: its protocol and subscriptions."""

    @property
    def protocol(self) -> Connection: ...

    @property
    def subscriptions(self) -> Mapping[int, Subscription]: ...


class Peer(Subscribed, Protocol):
    """A connection as the whole drain sees it: a client's or a link's."""

    @property
    def link(self) -> bool:
        """Another worker's link, not a client."""
        ...

    def shutting_down(self) -> None:
        """Send the last Confirms, then Goodbye 5."""
        ...


class Owners(Protocol):
    """This worker's links to the owners of the topics it forwards to."""

    def awaits_owners(self) -> bool:
        """Whether an owner may still confirm or relay something."""
        ...


async def drain(
    topics: Iterable[Topic], connections: Iterable[Peer], owners: Owners | None
) -> None:
    """Return once what was confirmed is on its way to every connected
    subscriber, also to one reached through another worker:

    1. ``topics`` route what was forwarded to them (none is once the
       shutdown began);
    2. the other workers' links get the deliveries queued for them, then
       their last Confirms and Goodbye 5: each forwarder learns that its
       owner has confirmed and relayed everything it ever will;
    3. this worker's own links have heard that from their owners (the
       owners shut down at the same time: step 2 there) or have nothing in
       flight, so what they relayed is queued for the subscribers here;
    4. the reliable deliveries queued for the clients go out.

    Each step waits only for other workers' steps that come before it, so
    workers shutting down together never wait for each other in a cycle.
    The caller bounds the whole (a worker shut down alone waits for its
    owners' Goodbyes until then)."""
    peers = list(connections)
    await route_forwarded(topics)
    links = [peer for peer in peers if peer.link]
    await send_queued_deliveries(links)
    for link in links:
        link.shutting_down()
    waiting = owners is not None and owners.awaits_owners()
    while waiting:
        await trio.sleep(SHUTDOWN_POLL)
        waiting = owners is not None and owners.awaits_owners()
    await send_queued_deliveries([peer for peer in peers if not peer.link])


async def route_forwarded(topics: Iterable[Topic]) -> None:
    """Return once ``topics`` have routed every publish forwarded to them
    (none is forwarded once the shutdown began), also those appended to a
    ``flush="always"`` log that wait for their fsync (under way: the logs'
    task goes on until the end). A stand-in's batches sent on to another
    worker are not waited for here: their owner's Goodbye says it
    confirmed what it will (see :func:`drain`)."""
    waiting = list(topics)
    while waiting:
        waiting = [t for t in waiting if t.statistics().mailbox or t.unsynced]
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
