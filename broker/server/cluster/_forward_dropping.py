"""Lossy and latest subscriptions to a topic another worker owns.

The subscriber's worker keeps the dropping queue itself: a
:class:`~._lossy.DroppingSubscription` with the subscription's own limits
(and its connection's ``lossy_budget``), fed by the link instead of by a
local topic. The same subscription is made at the owner over the link (the
same mode and options), and the link issues guarantees for it as soon as a
read is applied, whatever the local subscriber does: a stalled subscriber
makes neither the link nor the owner hold anything for it. Its drops happen
here, as on one process; the owner drops only if the link itself falls
behind its publishers, and says so with a ``Gap``, which becomes a hole in
this queue's numbering: reported to the subscriber as a ``Gap`` in turn,
in order, like the drops made here. Deliveries plus the Gaps' counts are
exactly what the owner routed to it.

Its sequence numbers are the owner's, shifted when a broken link is made
again (the owner numbers the new subscription from 1): they go on.
"""

from __future__ import annotations

from collections.abc import Mapping

from broker.protocol import DeliveryMode, Options, ProtocolError
from broker.protocol.frames import decode_deliver_tail

from ..topics._lossy import DroppingSubscriber, DroppingSubscription, QueueLimits
from ._forward import ForwardTopic, SubscriptionLink, end_here

__all__ = ["ForwardedDroppingSubscription", "forwarded_dropping_subscription"]


def forwarded_dropping_subscription(
    connection: DroppingSubscriber,
    handle: int,
    topic: ForwardTopic,
    mode: str,
    options: Mapping[str, object],
) -> ForwardedDroppingSubscription:
    """The ``lossy`` or ``latest`` subscription a Subscribe to a forwarded
    topic makes (raises :class:`~._lossy.OptionError`, naming the option,
    for limits the owner would refuse: checked before they are forwarded)."""
    limits = QueueLimits.from_options(options)
    return ForwardedDroppingSubscription(connection, handle, topic, mode, options, limits)


class ForwardedDroppingSubscription(DroppingSubscription):
    """A dropping subscription fed by the owner over a link (see the module);
    a :class:`~._forward.LinkedSubscription`."""

    __slots__ = ("_shift", "link", "options", "owner_handle")

    def __init__(
        self,
        connection: DroppingSubscriber,
        handle: int,
        topic: ForwardTopic,
        mode: str,
        options: Mapping[str, object],
        limits: QueueLimits,
    ) -> None:
        super().__init__(connection, handle, topic, mode, limits)
        self.options: Options = dict(options)  # type: ignore[arg-type]
        self.link: SubscriptionLink = topic.link
        #: Its handle on the link's current connection (None: not made there yet).
        self.owner_handle: int | None = None
        #: Local sequence number minus the owner's, on the link's current connection.
        self._shift = 0
        self.link.subscribe(self)

    def resubscribe_options(self, *, offsets: bool) -> Options:
        """Made again at the owner as first asked (it starts at the newest)."""
        return dict(self.options)

    def may_receive(self) -> bool:
        """Guarantees to the owner are never withheld: what the subscriber
        cannot take yet waits here, within the limits, or is dropped."""
        return True

    def relay(self, first_seq: int, tails: list[bytes]) -> None:
        """The owner delivered ``tails`` as its ``first_seq``, ``first_seq + 1``,
        ...: queue them (numbers the owner skipped stay holes: dropped there)."""
        first = first_seq + self._shift
        skip = self._assigned - first
        if skip > 0:  # (the owner never numbers back: only as a safeguard)
            if skip >= len(tails):
                return
            tails = tails[skip:]
            first += skip
        self._assigned = first
        if self.mode == DeliveryMode.LATEST:
            keys = [_key_of(tail) for tail in tails]
        else:
            keys = [None] * len(tails)
        self.offer(self.account, tails, keys)

    def relay_gap(self, first_seq: int, count: int) -> None:
        """The owner dropped ``count`` deliveries from ``first_seq``: they are
        a hole here, reported in its turn."""
        end = first_seq + count + self._shift
        if count > 0 and end > self._assigned:
            self._assigned = end
            self.pump()

    def owner_ended(self) -> None:
        """The owner ended it: its topic was deleted there."""
        end_here(self)

    def link_broken(self, *, offsets: bool) -> None:
        """The link's connection broke: the owner's subscription is gone, and
        the one made on the next connection numbers from 1 (what was
        published in between is not known here, so not reported)."""
        self.owner_handle = None
        self._shift = self._assigned - 1

    def close(self) -> None:
        """Leave: the owner's subscription ends too, everything queued is repaid."""
        super().close()
        self.link.unsubscribe(self)


def _key_of(tail: bytes) -> bytes | None:
    """The key of an encoded Deliver tail (None, as if it had none, for one
    that does not decode: the owner encoded it, so never)."""
    try:
        return decode_deliver_tail(tail)[1]
    except ProtocolError:
        return None
