"""Topic actors and the subscription queues they fan out into."""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from accounts import Account, LoanedItem
from actors import Actor, Turn

if TYPE_CHECKING:
    from ._connection import ServerConnection

#: Bytes a Deliver adds to the shared tail (head: prefix, type, handle, seq).
DELIVER_HEAD_ESTIMATE = 24
#: Queued deliveries offered to the subscriber's connection at a time.
PUMP_BATCH = 128


class RouteOrigin(Protocol):
    """Where publishes came from: told when a topic has routed a batch of them."""

    def routed(self, routed: Routed) -> None: ...


@dataclass(slots=True)
class Routed:
    """Publishes on their way through a topic: their encoded Deliver tails, in
    order, and the publish channel they came from."""

    tails: list[bytes]
    origin: RouteOrigin
    handle: int
    #: What the origin estimated routing them will charge (see ``ServerConnection._drain``).
    fan_out: int
    #: The publishes' keys, in the same order (``latest`` subscriptions keep one per key).
    keys: list[bytes | None]


class Subscription:
    """A reliable subscription queue of one subscriber's session.

    Every queued delivery is a loan on the account of the channel whose
    publish caused it. Once its Deliver frame is sent (within the
    subscriber's guarantees: nothing waits in the connection beyond them)
    the loan stays with the subscription, unacknowledged, until the
    subscriber's cumulative ``Ack`` covers it; if the connection breaks, the
    unacknowledged deliveries are sent again on the resumed connection.
    """

    __slots__ = (
        "_queue",
        "acked",
        "connection",
        "delivered",
        "handle",
        "mode",
        "next_seq",
        "topic",
        "unacked",
    )

    #: Its queued deliveries are charged to the publishers' channels (the
    #: fan-out rule); lossy and latest subscriptions pay for their own.
    charges_publishers = True

    def __init__(self, connection: ServerConnection, handle: int, topic: Topic, mode: str) -> None:
        self.connection = connection
        self.handle = handle
        self.topic = topic
        self.mode = mode
        self.next_seq = 1
        self.delivered = 0
        #: Sent deliveries not acknowledged yet: sequence numbers ``acked + 1`` on.
        self.unacked: deque[LoanedItem[bytes]] = deque()
        self.acked = 0
        self._queue: deque[LoanedItem[bytes]] = deque()

    @property
    def queued(self) -> int:
        """Deliveries waiting for the subscriber's guarantees."""
        return len(self._queue)

    def offer(self, account: Account, tails: list[bytes], keys: list[bytes | None]) -> None:
        """Queue deliveries of ``tails``, each charged to ``account``; send
        what fits in the subscriber's guarantees at once. (``keys`` matter
        to ``latest`` subscriptions only.)"""
        cost = DELIVER_HEAD_ESTIMATE
        loans = [LoanedItem(account, len(tail) + cost, tail) for tail in tails]
        queue = self._queue
        if queue:
            queue.extend(loans)
            return
        taken = self.connection.deliver(self, loans)
        if taken < len(loans):
            self.connection.subscription_stalled(self)
            queue.extend(loans[taken:])

    def pump(self) -> None:
        """Send queued deliveries while the subscriber's guarantees allow."""
        queue = self._queue
        deliver = self.connection.deliver
        while queue:
            batch = list(itertools.islice(queue, PUMP_BATCH))
            taken = deliver(self, batch)
            for _ in range(taken):
                queue.popleft()
            if taken < len(batch):
                return

    def ack(self, seq: int) -> None:
        """The subscriber processed every delivery up to ``seq``: repay their loans.

        An Ack beyond what was sent covers what was sent.
        """
        unacked = self.unacked
        count = min(seq - self.acked, len(unacked))
        for _ in range(count):
            unacked.popleft().repay()
        if count > 0:
            self.acked += count

    def attach(self, connection: ServerConnection, processed: int) -> int:
        """A resumed connection takes over; the subscriber processed up to
        ``processed``. What it did not process is sent again, first, with its
        sequence numbers; returns how many deliveries that is."""
        self.connection = connection
        self.ack(processed)
        resend = self.unacked
        if resend:
            self.unacked = deque()
            self._queue.extendleft(reversed(resend))
        self.next_seq = self.acked + 1
        self.pump()
        return len(resend)

    def close(self) -> None:
        """Leave the topic and repay every queued and unacknowledged delivery."""
        self.topic.unsubscribe(self)
        for queue in (self._queue, self.unacked):
            while queue:
                queue.popleft().repay()


class Topic(Actor):
    """One topic: routes each publish to every subscription, in order.

    A turn runs under the publishing channel's account, so each queued
    delivery is charged to that channel (the fan-out rule) before the
    publish's own loan is repaid.
    """

    def __init__(self, name: str, registry: dict[str, Topic]) -> None:
        self.topic_name = name
        self.subscriptions: list[Subscription] = []
        #: Subscriptions whose deliveries are charged to the publishers.
        self.charging = 0
        self.publishers = 0
        self.messages_in = 0
        self._registry = registry

    def handle(self, turn: Turn, message: Any) -> None:
        routed: Routed = message
        account = turn.account
        tails = routed.tails
        keys = routed.keys
        for subscription in self.subscriptions:
            subscription.offer(account, tails, keys)
        self.messages_in += len(tails)
        routed.origin.routed(routed)

    def subscribe(self, subscription: Subscription) -> None:
        self.subscriptions.append(subscription)
        self.charging += subscription.charges_publishers

    def unsubscribe(self, subscription: Subscription) -> None:
        if subscription in self.subscriptions:
            self.subscriptions.remove(subscription)
            self.charging -= subscription.charges_publishers
            self.release_if_unused()

    def release_if_unused(self) -> None:
        """Stop and forget the topic once nobody publishes to or subscribes to it."""
        if not self.publishers and not self.subscriptions:
            if self._registry.get(self.topic_name) is self:
                del self._registry[self.topic_name]
            self.stop()
