"""Topic actors and the subscription queues they fan out into."""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from accounts import Account, LoanedItem
from actors import Actor, Turn

if TYPE_CHECKING:
    from ._connection import ServerConnection

#: Bytes a Deliver adds to the shared tail (head: prefix, type, handle, seq).
DELIVER_HEAD_ESTIMATE = 24
#: Queued deliveries offered to the subscriber's connection at a time.
PUMP_BATCH = 128


@dataclass(slots=True)
class Routed:
    """Publishes on their way through a topic: their encoded Deliver tails, in
    order, and the publish channel they came from."""

    tails: list[bytes]
    origin: ServerConnection
    handle: int
    #: What the origin estimated routing them will charge (see ``ServerConnection._drain``).
    fan_out: int
    #: The publishes' keys, in the same order (``latest`` subscriptions keep one per key).
    keys: list[bytes | None]


class Subscription:
    """A reliable subscription queue of one subscriber connection.

    Every queued delivery is a loan on the account of the channel whose
    publish caused it; the loan moves to the subscriber's writer when the
    Deliver frame is queued within the subscriber's guarantees, and is repaid
    when its bytes have been handed to the socket. The subscriber's
    guarantees on its delivery channel are the window: nothing waits in the
    connection beyond them.
    """

    __slots__ = ("_queue", "connection", "delivered", "handle", "mode", "next_seq", "topic")

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

    def close(self) -> None:
        """Leave the topic and repay every queued delivery."""
        self.topic.unsubscribe(self)
        while self._queue:
            self._queue.popleft().repay()


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
