"""Forwarding stand-ins of a worker for the topics another worker owns.

A worker of a multi-worker broker serves any client, but only the topic's
owner routes it. For a topic it does not own, a worker keeps:

- a :class:`ForwardTopic` in place of the :class:`~._topic.Topic`: it takes
  the same :class:`~._topic.Routed` batches from the publish channels
  (so publishing needs no special case) and hands them to the link to the
  owner, holding each batch's loan on its publisher's channel account until
  the owner has confirmed it: only then is the batch *routed* for the
  publisher (its Confirm);
- a :class:`ForwardedSubscription` per local reliable Subscribe: the same
  subscription made at the owner over the link; what the owner delivers is
  relayed to the local subscriber through the usual subscription queue
  (a lossy or latest Subscribe keeps its dropping queue here instead, fed
  by the link: see ``_forward_dropping``).

The link itself (a client connection to the owner) is behind the small
:class:`TopicLink` and :class:`SubscriptionLink` protocols; what it needs of
a subscription it feeds, behind :class:`LinkedSubscription`.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from accounts import Account, LoanedItem
from actors import Turn
from broker.protocol import DeliveryMode, Options

from ..topics._log_subscription import CURSOR_PRINCIPAL, start_request
from ..topics._lossy import OptionError, QueueLimits
from ..topics._topic import Routed, Subscriber, Subscription, Topic, charge_of

__all__ = [
    "ForwardLink",
    "ForwardTopic",
    "ForwardedSubscription",
    "LinkedSubscription",
    "PendingBatch",
    "SubscriptionLink",
    "TopicLink",
    "check_forwarded_options",
    "forwarded_subscription",
]


@dataclass(slots=True, eq=False)
class PendingBatch:
    """A batch of publishes on its way to the owner: charged to its
    publisher (``loan``) until the owner confirms every one of them."""

    routed: Routed
    loan: LoanedItem[None]
    #: Publishes of the batch sent on the link's current connection.
    sent: int = 0
    #: Publishes of the batch the owner confirmed.
    confirmed: int = 0

    def confirmed_all(self) -> None:
        """Every publish is confirmed by the owner: repay and tell the publisher."""
        self.loan.repay()
        self.routed.origin.routed(self.routed)


class TopicLink(Protocol):
    """What a forwarding topic needs of the link to its owner."""

    def publish(self, topic: ForwardTopic, batch: PendingBatch) -> None:
        """Send ``batch`` to the owner (now or once the link has room);
        :meth:`PendingBatch.confirmed_all` once the owner confirmed it all."""
        ...

    def topic_released(self, topic: ForwardTopic) -> None:
        """Nobody uses ``topic`` here any more: the link may let go of it."""
        ...


class ForwardTopic(Topic):
    """The stand-in for a topic another worker owns (see the module).

    It never routes: each batch it takes is charged to the sending channel's
    account (as a topic with a log charges a batch waiting for room) and
    passed to :attr:`link`, in order; the publishers' Confirms follow the
    owner's. Its local subscriptions are fed by the owner, not by it.
    """

    forwarded = True

    def __init__(self, name: str, registry: dict[str, Topic], link: ForwardLink) -> None:
        super().__init__(name, registry)
        self.link = link
        #: Batches sent or to send to the owner, not wholly confirmed yet.
        self.pending: deque[PendingBatch] = deque()

    def handle(self, turn: Turn, message: Any) -> None:
        routed: Routed = message
        account = turn.account
        batch = PendingBatch(routed, LoanedItem(account, charge_of(account, routed.tails), None))
        self.pending.append(batch)
        self.messages_in += len(routed.tails)
        self.link.publish(self, batch)

    def release_if_unused(self) -> None:
        """Stop and forget the stand-in once nobody here publishes or
        subscribes to it and the owner confirmed everything sent through it."""
        if not self.publishers and not self.subscriptions and not self.pending:
            if self._registry.get(self.topic_name) is self:
                del self._registry[self.topic_name]
                self.link.topic_released(self)
            self.stop()


class LinkedSubscription(Protocol):
    """A local subscription fed by the owner over a link, as the link sees
    it: a reliable :class:`ForwardedSubscription`, or a lossy or latest
    ``ForwardedDroppingSubscription``."""

    topic: Topic
    mode: str
    #: Its handle on the link's current connection (None: not made there yet).
    owner_handle: int | None

    def resubscribe_options(self, *, offsets: bool) -> Options:
        """The options to make it with at the owner (again, after a broken link)."""
        ...

    def relay(self, first_seq: int, tails: list[bytes]) -> None:
        """The owner delivered ``tails`` as its ``first_seq``, ``first_seq + 1``, ..."""
        ...

    def relay_gap(self, first_seq: int, count: int) -> None:
        """The owner dropped ``count`` deliveries from ``first_seq``."""
        ...

    def link_broken(self, *, offsets: bool) -> None:
        """The link's connection broke: the owner's subscription is gone."""
        ...

    def owner_ended(self) -> None:
        """The owner ended it (its topic was deleted there): end it here."""
        ...

    def may_receive(self) -> bool:
        """Whether the link may issue guarantees to the owner for it now."""
        ...


class Ending(Protocol):
    """A subscriber that can end one of its subscriptions (its topic was deleted)."""

    def end(self, handle: int) -> None: ...


def end_here(subscription: Subscription) -> None:
    """End ``subscription`` at its subscriber as the owner ended it (a
    client is told with a FreeHandle, a pattern that the topic is over); a
    subscriber that cannot be told closes it."""
    connection: Any = subscription.connection
    if callable(getattr(connection, "end", None)):
        ending: Ending = connection
        if connection.subscriptions.get(subscription.handle) is subscription:
            ending.end(subscription.handle)
            return
    subscription.close()


class SubscriptionLink(Protocol):
    """What a forwarded subscription needs of the link to its owner."""

    @property
    def offsets(self) -> bool:
        """Whether the broker keeps topic logs (reliable deliveries are offsets)."""
        ...

    def subscribe(self, subscription: LinkedSubscription) -> None:
        """Make ``subscription`` at the owner (again, after a broken link)."""
        ...

    def unsubscribe(self, subscription: LinkedSubscription) -> None:
        """End ``subscription`` at the owner."""
        ...

    def ack(self, subscription: LinkedSubscription, seq: int) -> None:
        """Acknowledge the owner's deliveries up to its ``seq``."""
        ...

    def resume_deliveries(self, subscription: LinkedSubscription) -> None:
        """``subscription``'s account cleared: the owner may send again."""
        ...


class ForwardLink(TopicLink, SubscriptionLink, Protocol):
    """A link to the owner, as forwarding topics and subscriptions see it."""

    def subscription_account(self, name: str) -> Account:
        """A new account for a forwarded subscription, with the channel watermarks."""
        ...


def forwarded_subscription(
    connection: Subscriber,
    handle: int,
    topic: ForwardTopic,
    mode: str,
    options: Mapping[str, object],
    principal: str | None = None,
    *,
    restored: int | None = None,
) -> ForwardedSubscription:
    """The subscription a reliable Subscribe to a forwarded topic makes, for
    the client's ``principal`` (raises :class:`OptionError`, naming the option,
    for what cannot be forwarded); with ``restored`` (the last offset its
    session's record has as processed), one restored after a restart, made
    at the owner when its client resumes."""
    link = topic.link
    check_forwarded_options(mode, options, logs=link.offsets)
    account = link.subscription_account(f"forward/{handle}/{topic.topic_name[:64]}")
    return ForwardedSubscription(
        connection, handle, topic, mode, options, link, account, principal, restored=restored
    )


def check_forwarded_options(mode: str, options: Mapping[str, object], *, logs: bool) -> None:
    """Refuse (:class:`OptionError`) what the owner would refuse, before it
    is forwarded (a refusal there would end the shared link), and what is
    not forwarded (``timestamps``)."""
    if mode == DeliveryMode.RELIABLE:
        request = start_request(options)
        if request.timestamps:
            raise OptionError(
                '"timestamps" is not forwarded between workers: '
                "connect with metadata or to the topic owner's direct address"
            )
        if not logs and not request.plain:
            raise OptionError(
                f"{sorted(options)[:3]} need a broker with a data directory: "
                "this one is memory-only and keeps no topic log"
            )
    else:
        QueueLimits.from_options(options)


class ForwardedSubscription(Subscription):
    """A local reliable subscription whose deliveries come from the owner
    over a link (a lossy or latest one: ``_forward_dropping``).

    Locally it is a reliable :class:`~._topic.Subscription` queue (the
    subscriber's guarantees, its Acks and a resumed session's resend work as
    for any); its deliveries are charged to its own :attr:`account` (with
    the channel watermarks), from the moment they are relayed until the
    local subscriber acknowledges them. The link
    issues guarantees to the owner on the subscription's link channel only
    while that account is not blocked, so what it holds is bounded by the
    watermark plus one link channel's capacity. Each local Ack is passed on
    to the owner, mapped to the owner's sequence numbers, so the owner's
    own reliable bookkeeping (and a durable cursor) follows the local
    subscriber. A local sequence number equals the owner's (an offset, on a
    broker that keeps logs); on a memory-only broker, until the link is
    reconnected (the owner numbers the new subscription from 1 again).
    """

    __slots__ = (
        "account",
        "link",
        "options",
        "owner_acked",
        "owner_handle",
        "owner_received",
        "paused",
        "pinned_ms",
        "restored",
        "segments",
    )

    charges_publishers = False
    #: (Session records are kept only by a broker with a data directory,
    #: whose owners number reliable deliveries by log offsets.)
    restorable = True

    def __init__(
        self,
        connection: Subscriber,
        handle: int,
        topic: Topic,
        mode: str,
        options: Mapping[str, object],
        link: SubscriptionLink,
        account: Account,
        principal: str | None = None,
        *,
        restored: int | None = None,
    ) -> None:
        super().__init__(connection, handle, topic, mode)
        self.options: Options = dict(options)  # type: ignore[arg-type]
        if principal is not None and "cursor" in options:
            # The owner keeps the cursor as the client's principal's, as if the
            # client had subscribed there directly (not as the link's).
            self.options[CURSOR_PRINCIPAL] = principal
        self.link = link
        #: Pays for the deliveries held here (see the class).
        self.account = account
        #: Its handle on the link's current connection (None: not made there yet).
        self.owner_handle: int | None = None
        #: The owner's last sequence number relayed (on its current connection).
        self.owner_received = 0
        #: The owner's sequence number acknowledged to it.
        self.owner_acked = 0
        #: (first local seq, local minus owner seq) of each run of deliveries
        #: numbered alike, oldest first: an Ack is mapped back through them.
        self.segments: deque[tuple[int, int]] = deque()
        #: Guarantees to the owner are withheld until the account clears.
        self.paused = False
        #: Restored from its session's record after a restart (the last offset
        #: recorded as processed): made at the owner only once its client
        #: resumes and says what it processed. None: made at once.
        self.restored = restored
        #: A reliable one asked to start at the latest record, on a broker
        #: with logs: when it was made here (ms since the epoch). It is made
        #: at the owner (first, and again after a broken link or a restart
        #: with nothing relayed yet) from the first record received from
        #: then on ("from_time"), not at the latest record of that moment:
        #: what was published in between is never skipped.
        self.pinned_ms: int | None = None
        if (
            restored is None
            and mode == DeliveryMode.RELIABLE
            and link.offsets
            and not {"cursor", "from_time"} & set(options)
            and options.get("from", "latest") == "latest"
        ):
            self.pinned_ms = time.time_ns() // 1_000_000
            self._pinned(self.options)
        if restored is None:
            link.subscribe(self)

    def _pinned(self, options: Options) -> Options:
        """``options`` starting where it started when first made (see ``pinned_ms``)."""
        if self.pinned_ms is not None:
            options.pop("from", None)
            options["from_time"] = self.pinned_ms
        return options

    def recorded_options(self, given: Mapping[str, object]) -> Mapping[str, object]:
        """Its Subscribe's options, pinned to when it was first made."""
        return self._pinned(dict(given))  # type: ignore[arg-type]

    def resubscribe_options(self, *, offsets: bool) -> Options:
        """The options to make it again at the owner after a broken link: on
        a broker with logs a reliable one continues after the last offset
        relayed (a durable cursor continues where it was acknowledged, and
        what was relayed already is skipped)."""
        options = dict(self.options)
        reliable = self.mode == DeliveryMode.RELIABLE
        if offsets and reliable and self.owner_received and "cursor" not in options:
            options.pop("from_time", None)
            options["from"] = self.owner_received + 1
        return options

    def attach(self, connection: Subscriber, processed: int) -> int:
        """A resumed connection takes over. A restored subscription is made at
        the owner now, to go on after the last offset processed (the client's
        word, or the record's if later; a durable cursor goes on from where
        the owner has it, what was processed skipped). One whose client had
        processed nothing starts as first asked. Nothing was sent on it
        here yet: 0 to send again."""
        if self.restored is None:
            return super().attach(connection, processed)
        processed = max(processed, self.restored)
        self.restored = None
        self.connection = connection
        if processed:
            self.acked = self.owner_received = processed
            self.next_seq = processed + 1
            if "cursor" not in self.options:
                self.options.pop("from_time", None)
                self.options["from"] = processed + 1
        self.link.subscribe(self)
        return 0

    def owner_ended(self) -> None:
        """The owner ended it: its topic was deleted there."""
        end_here(self)

    def link_broken(self, *, offsets: bool) -> None:
        """The link's connection broke: the owner's handle is gone. On a broker
        with logs the owner's numbering (offsets) goes on; without, the next
        connection numbers from 1 again (and what was relayed before is
        never acknowledged to the owner: that subscription is gone)."""
        self.owner_handle = None
        self.owner_acked = 0
        if not offsets:
            self.owner_received = 0
            self.segments.clear()

    def relay(self, first_seq: int, tails: list[bytes]) -> None:
        """The owner delivered ``tails`` as its ``first_seq``, ``first_seq + 1``,
        ...: queue them for the local subscriber, as one loan (what was
        relayed before, after a reconnected link, is skipped)."""
        skip = self.owner_received + 1 - first_seq
        if skip > 0:
            if skip >= len(tails):
                return
            tails = tails[skip:]
            first_seq += skip
        local = self.next_seq + self.queued
        if local == 1 and not self.unacked and not self.segments:
            local = self.next_seq = first_seq  # the subscriber sees the owner's numbers
        segments = self.segments
        shift = local - first_seq
        if not segments or shift != segments[-1][1] or first_seq != self.owner_received + 1:
            segments.append((local, shift))
        self.owner_received = first_seq + len(tails) - 1
        self.offer(self.account, tails, [None] * len(tails))
        self._settle()

    def relay_gap(self, first_seq: int, count: int) -> None:
        """The owner dropped ``count`` deliveries from ``first_seq``: the local
        subscriber is told if nothing is queued ahead of the gap (else its
        local numbering simply goes on)."""
        if count <= 0:
            return
        self.owner_received = max(self.owner_received, first_seq + count - 1)
        if not self.queued and self.connection.gap(self, self.next_seq, count):
            self.next_seq += count

    def pump(self) -> None:
        super().pump()
        self._settle()

    def ack(self, seq: int) -> None:
        super().ack(seq)
        owner_seq = self._owner_seq(self.acked)
        if self.owner_handle is not None and owner_seq > self.owner_acked:
            owner_seq = min(owner_seq, self.owner_received)
            if owner_seq > self.owner_acked:
                self.owner_acked = owner_seq
                self.link.ack(self, owner_seq)
        self._settle()

    def _owner_seq(self, local: int) -> int:
        """The owner's sequence number of local delivery ``local`` (0: none)."""
        segments = self.segments
        while len(segments) > 1 and segments[1][0] <= local:
            segments.popleft()
        if not segments or segments[0][0] > local:
            return 0
        return local - segments[0][1]

    def _settle(self) -> None:
        """Let the owner send again once the account is clear."""
        if self.paused and not self.account.blocked:
            self.paused = False
            self.link.resume_deliveries(self)

    def may_receive(self) -> bool:
        """Whether guarantees may be issued to the owner now (else paused
        until :meth:`_settle` sees the account clear)."""
        if self.account.blocked:
            self.paused = True
            return False
        return True

    def close(self) -> None:
        """Leave: the owner's subscription ends too, everything held is repaid."""
        super().close()
        self.link.unsubscribe(self)
        self.account.close()
