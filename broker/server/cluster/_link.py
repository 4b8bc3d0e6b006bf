"""A worker's link to another worker: an ordinary client connection to the
owner's link listener (a Unix socket), over which this worker forwards the
publishes and subscriptions of topics that worker owns.

One :class:`Link` per owner, opened on first need and reopened, with
backoff, whenever it breaks (``_link_io`` runs its connections). It drives
the sans-IO :class:`~broker.protocol.Connection` directly; what a read
brings is applied at once and never waits (no credit cycle between two
workers forwarding to each other, each direction being its own connection
with its own guarantees).

What a broken link means:

- publishes sent and not confirmed by the owner are sent again, in order,
  on the next connection (at least once at the hop: the owner may get a
  publish twice, never none); their publishers stay charged and unconfirmed
  meanwhile;
- forwarded subscriptions are made again: on a broker with topic logs a
  reliable one continues after the last offset relayed (nothing lost or
  repeated), a memory-only one from the messages published from then on.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import islice
from typing import Protocol

import trio

from accounts import Account
from broker.config import BrokerConfig
from broker.protocol import (
    Channel,
    ChannelKind,
    Confirm,
    Connection,
    ConnectionClosed,
    DeliverGroup,
    DeliverManyReceived,
    DeliverReceived,
    EncodedDeliveriesReceived,
    Gap,
    GoodbyeCode,
    GuaranteesReceived,
    HandleFreeProposed,
    HandleType,
    LocalProtocolError,
    NoGuarantees,
    OriginRun,
    Policy,
    Role,
    SettleOutcome,
    Throttled,
    WelcomeReceived,
    add_runs,
    slice_origins,
)
from broker.protocol.frames import encode_deliver_tail

from ..transport._wake import Outbox, Wake
from ._forward import ForwardTopic, LinkedSubscription, PendingBatch
from ._forward_group import ForwardedGroupMember
from ._link_runner import LinkRunner

__all__ = ["Link", "LinkHost", "LinkStatistics"]


class LinkHost(Protocol):
    """What a link needs of its broker."""

    @property
    def config(self) -> BrokerConfig: ...

    @property
    def outbox(self) -> Outbox:
        """Where wakes of the connections a link read affects are coalesced."""
        ...

    @property
    def offsets(self) -> bool:
        """Whether reliable deliveries are numbered by log offsets."""
        ...

    @property
    def account(self) -> Account:
        """The broker's root account (forwarded subscriptions' accounts roll up there)."""
        ...


@dataclass(frozen=True, slots=True)
class LinkStatistics:
    """A snapshot of one link (the keys of ``Broker.statistics().links``)."""

    owner: str
    open: bool
    connects: int
    publishes_in_flight: int
    bytes_in_flight: int
    publishes_forwarded: int
    subscriptions_forwarded: int
    deliveries_relayed: int


class _LinkTopic:
    """A forwarded topic's state on the link's current connection."""

    __slots__ = ("confirmed", "handle", "sending", "topic")

    def __init__(self, topic: ForwardTopic) -> None:
        self.topic = topic
        #: Its topic handle on the current connection (None: not bound there).
        self.handle: int | None = None
        #: Publishes the owner confirmed on :attr:`handle` (cumulative).
        self.confirmed = 0
        #: Batches of ``topic.pending`` (from the left) sent wholly.
        self.sending = 0


class _LinkPolicy(Policy):
    """The link's guarantees to the owner on a forwarded subscription follow
    that subscription's account (withheld while it is blocked)."""

    def __init__(self, link: Link) -> None:
        super().__init__()
        self.link = link

    def may_issue(self, channel: Channel) -> bool:
        if channel.kind != ChannelKind.DELIVER:
            return True
        subscription = self.link.by_owner_handle.get(channel.index)
        return subscription is None or subscription.may_receive()


class Link:
    """The link from this worker to worker ``owner`` (see the module); a
    :class:`~._forward.TopicLink` and :class:`~._forward.SubscriptionLink`."""

    def __init__(
        self, host: LinkHost, name: str, owner: str, path: str, token: str | None = None
    ) -> None:
        self.host = host
        self.name = name
        #: What the Hello presents to the owner (a front end's link token).
        self.token = token
        self.owner = owner
        self.conn: Connection | None = None
        #: Welcomed by the owner, and not closed since: handles may be bound.
        self.open = False
        #: The owner said it is shutting down (Goodbye 5) on the last
        #: connection, or refused the next one so: it sends nothing more.
        self.owner_closing = False
        self.connects = 0
        self.publishes_forwarded = 0
        self.deliveries_relayed = 0
        self.topics: dict[str, _LinkTopic] = {}
        self.by_topic_handle: dict[int, _LinkTopic] = {}
        self.subscriptions: dict[LinkedSubscription, None] = {}
        self.by_owner_handle: dict[int, LinkedSubscription] = {}
        #: Forwarded subscriptions to make on the current connection.
        self._to_subscribe: dict[LinkedSubscription, None] = {}
        #: Topic handles to free once the owner confirmed what they wait for.
        self._to_free: list[int] = []
        #: Subscription handles to free at the owner (see ``_free_subscriptions``).
        self._to_unsubscribe: list[int] = []
        #: Topic handles whose channel the owner said it withholds (Throttled).
        self._withheld: set[int] = set()
        self.runner = LinkRunner(self, host.outbox, name, owner, path)
        #: Topics with batches to send once the outbox step under way ends
        #: (see :meth:`publish`), and the wake that sends them then.
        self._dirty: dict[_LinkTopic, None] = {}
        self._outbox = host.outbox
        self._deferred = Wake(host.outbox)
        self._deferred.write_now = self._send_dirty

    @property
    def offsets(self) -> bool:
        """Whether the broker keeps topic logs (reliable deliveries are offsets)."""
        return self.host.offsets

    def subscription_account(self, name: str) -> Account:
        """A forwarded subscription's account: the channel watermarks, under the root."""
        config = self.host.config
        return Account(
            f"{self.name}/{name}",
            high_watermark=config.channel_high_watermark,
            low_watermark=config.channel_low_watermark,
            parent=self.host.account,
            kind="forward",
        )

    # ---------------------------------------------------------------- TopicLink

    def _topic(self, topic: ForwardTopic) -> _LinkTopic:
        """``topic``'s state, bound on the current connection if it is open."""
        state = self.topics.get(topic.topic_name)
        if state is None or state.topic is not topic:
            state = self.topics[topic.topic_name] = _LinkTopic(topic)
        if self.open and state.handle is None:
            self._bind(state)
        return state

    def _free_idle(self) -> None:
        """Free the handles of topics with nothing in flight and no forwarded
        subscription still to make with them (bound again when used; a
        subscription, once made, does not need its topic's handle): the
        owner funds a connection's topics from one budget, so an idle one's
        room goes to one that waits. Done when the owner says a channel is
        withheld (as the clients do), and while one is, whenever a topic's
        last publish is confirmed."""
        waiting = {subscription.topic.topic_name for subscription in self._to_subscribe}
        for name, state in self.topics.items():
            if state.handle is not None and not state.topic.pending and name not in waiting:
                self._withheld.discard(state.handle)
                del self.by_topic_handle[state.handle]
                self._to_free.append(state.handle)
                state.handle = None
        self._free_handles()

    def publish(self, topic: ForwardTopic, batch: PendingBatch) -> None:
        """Send ``batch`` to the owner as its guarantees allow (see ``TopicLink``).

        While an outbox step is under way (a client's read), it is sent when
        the step ends, with the topic's other batches of the step: in as few
        PublishMany frames as the guarantees allow, so the owner decodes,
        routes and confirms them as one."""
        state = self._topic(topic)
        if state.handle is None:
            return
        if self._outbox.is_open:
            self._dirty[state] = None
            self._deferred.set()  # (noted before the link's own wake: sent first)
            self.runner.flush()
        else:
            self._send(state)

    def _send_dirty(self) -> bool:
        """The outbox step ended: send what its publishes left to send."""
        dirty = self._dirty
        self._dirty = {}
        for state in dirty:
            if state.handle is not None and self.by_topic_handle.get(state.handle) is state:
                self._send(state, flush=False)
        self.runner.flush()  # (already noted and flushed next, or the writer sends it)
        return True

    def topic_released(self, topic: ForwardTopic) -> None:
        """Let go of ``topic``'s handle on the owner (its room funds others)."""
        state = self.topics.get(topic.topic_name)
        if state is None or state.topic is not topic:
            return
        del self.topics[topic.topic_name]
        if state.handle is not None:
            self._withheld.discard(state.handle)
            del self.by_topic_handle[state.handle]
            self._to_free.append(state.handle)
            self._free_handles()

    def _free_handles(self) -> None:
        """Free the topic handles let go of (see :meth:`_free`)."""
        self._to_free = self._free(HandleType.TOPIC, self._to_free)

    def _free(self, handle_type: HandleType, handles: list[int]) -> list[int]:
        """Propose freeing ``handles`` to the owner; those it may not free yet
        (a bind or Subscribe not confirmed, publishes unconfirmed), to try
        again after the next read. All are gone with a broken connection."""
        conn = self.conn
        if conn is None or not self.open or conn.closed:
            return []
        waiting: list[int] = []
        for handle in handles:
            try:
                conn.free_handle(handle_type, handle)
            except LocalProtocolError:
                waiting.append(handle)
        self._flush()
        return waiting

    def _bind(self, state: _LinkTopic) -> None:
        assert self.conn is not None
        state.handle = self.conn.bind_topic(state.topic.topic_name)
        state.confirmed = state.sending = 0
        self.by_topic_handle[state.handle] = state
        self._send(state)

    def _send(self, state: _LinkTopic, *, flush: bool = True) -> None:
        """Send the topic's pending publishes as far as the guarantees go:
        every batch not sent wholly yet, together (none on a connection that
        is closed: they wait for the next)."""
        conn = self.conn
        handle = state.handle
        assert conn is not None and handle is not None
        if conn.closed:
            return
        pending = state.topic.pending
        index = state.sending
        if index >= len(pending):
            return
        origins: list[OriginRun] = []
        if index == len(pending) - 1:
            batch = pending[index]
            tails = batch.routed.tails[batch.sent :] if batch.sent else batch.routed.tails
            origins += _origins_of(batch)
        else:
            tails = []
            for batch in islice(pending, index, None):
                tails += batch.routed.tails[batch.sent :]
                add_runs(origins, _origins_of(batch))
        # (A Publish ends as a Deliver does: each tail is copied as is, in
        # as few PublishMany frames as the owner's guarantees allow, with
        # whose publishes they are: the owner stores none twice.)
        if len(tails[0]) >= conn.peer_max_frame - 16 and conn.peer_max_message:
            # A message larger than a frame goes alone, in parts (its origin
            # is not said: a publish sent again after a forwarder's crash
            # may be stored twice: docs/broker.md says so).
            sent = left = int(conn.publish_tail_in_parts(handle, tails[0]))
            flush = flush and not sent  # (the rest goes on below, then flushed)
        else:
            sent = left = conn.publish_many_tails(handle, tails, origins=origins)
        while index < len(pending):
            batch = pending[index]
            take = min(left, len(batch.routed.tails) - batch.sent)
            batch.sent += take
            left -= take
            if batch.sent < len(batch.routed.tails):
                break  # out of room: the rest when guarantees come
            index += 1
        state.sending = index
        self.publishes_forwarded += sent
        if sent and len(tails[0]) >= conn.peer_max_frame - 16 and conn.peer_max_message:
            self._send(state)  # those after it, as far as the guarantees go
        elif flush:
            self._flush()

    def _confirmed(self, state: _LinkTopic, count: int) -> None:
        """The owner confirmed ``count`` publishes on the topic's handle in
        all: batches now wholly confirmed are routed for their publishers."""
        newly = count - state.confirmed
        state.confirmed = count
        pending = state.topic.pending
        while newly > 0 and pending:
            batch = pending[0]
            take = min(newly, batch.sent - batch.confirmed)
            if take <= 0:
                break
            batch.confirmed += take
            newly -= take
            if batch.confirmed == len(batch.routed.tails):
                pending.popleft()
                state.sending -= 1
                batch.confirmed_all()
        if not pending:
            if self._withheld:
                self._free_idle()  # (this one may be idle now: its room for them)
            state.topic.release_if_unused()

    # ---------------------------------------------------------------- SubscriptionLink

    def subscribe(self, subscription: LinkedSubscription) -> None:
        """Make ``subscription`` at the owner once its topic handle is confirmed."""
        topic = subscription.topic
        assert isinstance(topic, ForwardTopic)
        self._topic(topic)
        self.subscriptions[subscription] = None
        self._to_subscribe[subscription] = None
        self._subscribe_waiting()

    def _subscribe_waiting(self) -> None:
        conn = self.conn
        if conn is None or not self.open or not self._to_subscribe:
            return
        offsets = self.host.offsets
        for subscription in list(self._to_subscribe):
            state = self.topics.get(subscription.topic.topic_name)
            if state is None or state.handle is None:
                continue
            if not conn.confirmed(HandleType.TOPIC, state.handle):
                continue
            try:
                handle = conn.subscribe(
                    state.handle,
                    subscription.mode,
                    subscription.resubscribe_options(offsets=offsets),
                )
            except NoGuarantees:
                # No room for it on the link now (the owner's max_subscriptions
                # for this link): it waits until one ends and the owner says so.
                break
            del self._to_subscribe[subscription]
            subscription.owner_handle = handle
            self.by_owner_handle[handle] = subscription
        self._flush()

    def unsubscribe(self, subscription: LinkedSubscription) -> None:
        """End ``subscription`` at the owner (what it still sends is dropped)."""
        self.subscriptions.pop(subscription, None)
        self._to_subscribe.pop(subscription, None)
        handle = subscription.owner_handle
        subscription.owner_handle = None
        if handle is not None and self.by_owner_handle.pop(handle, None) is not None:
            self._to_unsubscribe.append(handle)
            self._free_subscriptions()

    def _owner_ended(self, handle: int) -> None:
        """The owner ended its subscription ``handle`` (its topic was
        deleted): the one it fed here ends as it did."""
        subscription = self.by_owner_handle.pop(handle, None)
        if subscription is None:
            return
        self.subscriptions.pop(subscription, None)
        self._to_subscribe.pop(subscription, None)
        subscription.owner_handle = None
        subscription.owner_ended()

    def _free_subscriptions(self) -> None:
        """Free at the owner the subscriptions ended here (one whose Subscribe
        the owner has not confirmed yet is freed once it has: until then,
        what it delivers is released unread)."""
        self._to_unsubscribe = self._free(HandleType.SUBSCRIPTION, self._to_unsubscribe)

    def ack(self, subscription: LinkedSubscription, seq: int) -> None:
        """Acknowledge the owner's deliveries up to its ``seq``."""
        conn = self.conn
        handle = subscription.owner_handle
        if conn is not None and not conn.closed and handle is not None:
            conn.ack(handle, seq)
            self._flush()

    def resume_deliveries(self, subscription: LinkedSubscription) -> None:
        """Issue the guarantees withheld from the owner on ``subscription``."""
        conn = self.conn
        handle = subscription.owner_handle
        if conn is not None and not conn.closed and handle is not None:
            conn.issue_guarantees(Channel(ChannelKind.DELIVER, handle))
            self._flush()

    def close(self) -> None:
        """The broker stops: what waits for the owner is let go, unconfirmed
        (its publishers never saw a Confirm for it: their clients keep it)."""
        for state in self.topics.values():
            pending = state.topic.pending
            while pending:
                pending.popleft().loan.repay()

    @property
    def awaits_owner(self) -> bool:
        """Whether the owner may still send something a shutdown here waits
        for: Confirms of forwarded publishes, or deliveries to relay to a
        forwarded subscription (not once the owner said it shuts down: it
        sent those before its Goodbye)."""
        if self.owner_closing:
            return False
        return bool(self.subscriptions) or any(s.topic.pending for s in self.topics.values())

    # ---------------------------------------------------------------- statistics

    def statistics(self) -> LinkStatistics:
        batches = [batch for state in self.topics.values() for batch in state.topic.pending]
        return LinkStatistics(
            owner=self.owner,
            open=self.open,
            connects=self.connects,
            publishes_in_flight=sum(len(b.routed.tails) - b.confirmed for b in batches),
            bytes_in_flight=sum(b.loan.amount for b in batches),
            publishes_forwarded=self.publishes_forwarded,
            subscriptions_forwarded=len(self.subscriptions),
            deliveries_relayed=self.deliveries_relayed,
        )

    # ---------------------------------------------------------------- running

    def _flush(self) -> None:
        """Something was queued on the connection: the writer sends it."""
        self.runner.flush()

    async def run(self) -> None:
        """Keep the link connected until cancelled (reconnecting with backoff)."""
        await self.runner.run()

    def connected(self) -> Connection:
        """A new connection to the owner (its Hello queued): this one's now."""
        config = self.host.config
        conn = self.conn = Connection(
            Role.CLIENT,
            policy=_LinkPolicy(self),
            max_frame=config.max_frame,
            max_message=config.max_message,
            heartbeat=config.heartbeat,
            lease=config.lease,
            now=trio.current_time(),
        )
        # (A new session each time: what the owner did not confirm is sent
        # again by the link itself, so nothing is kept for a resume.)
        conn.hello(
            self.name,
            deliver_many=True,
            encoded_deliveries=True,
            publish_many=True,
            keep_unconfirmed=False,
            token=self.token,
        )
        return conn

    def _relay(self, handle: int, first_seq: int, tails: list[bytes]) -> None:
        """Relay deliveries (their encoded tails) from ``first_seq`` on the
        owner's subscription ``handle`` to its forwarded subscription here,
        if it still has one."""
        subscription = self.by_owner_handle.get(handle)
        if subscription is not None:
            self.deliveries_relayed += len(tails)
            subscription.relay(first_seq, tails)

    def _relay_group(self, many: DeliverGroup) -> None:
        """Relay a group member's deliveries (with their offsets and counts)."""
        subscription = self.by_owner_handle.get(many.subscription)
        if isinstance(subscription, ForwardedGroupMember):
            self.deliveries_relayed += len(many.entries)
            tails = [encode_deliver_tail(*entry) for entry in many.entries]
            subscription.relay_group(many.first_seq, tails, many.offsets, many.delivered)

    def settle(
        self,
        subscription: LinkedSubscription,
        ranges: list[tuple[int, int]],
        outcome: int,
        detail: int | str | None,
    ) -> None:
        """Pass a member's Settle of the owner's deliveries on."""
        conn = self.conn
        handle = subscription.owner_handle
        if conn is not None and not conn.closed and handle is not None:
            with contextlib.suppress(LocalProtocolError):  # (being freed)
                conn.settle(handle, SettleOutcome(outcome), ranges, detail)
            self._flush()

    def handle(self, conn: Connection, events: Iterable[object]) -> str | None:
        """Apply a read's events; why the connection ended, if it did."""
        subscriptions = self.by_owner_handle
        for event in events:
            kind = type(event)
            if kind is EncodedDeliveriesReceived:
                assert isinstance(event, EncodedDeliveriesReceived)
                encoded = event.message
                conn.release(event)
                self._relay(encoded.subscription, encoded.first_seq, encoded.entries)
            elif kind is DeliverManyReceived:
                assert isinstance(event, DeliverManyReceived)
                many = event.message
                conn.release(event)
                if type(many) is DeliverGroup:
                    self._relay_group(many)
                    continue
                self._relay(
                    many.subscription,
                    many.first_seq,
                    [encode_deliver_tail(*entry) for entry in many.entries],
                )
            elif kind is DeliverReceived:
                assert isinstance(event, DeliverReceived)
                one = event.message
                conn.release(event)
                self._relay(
                    one.subscription,
                    one.seq,
                    [encode_deliver_tail(one.payload, one.key, one.headers)],
                )
            elif kind is Confirm:
                assert isinstance(event, Confirm)
                state = self.by_topic_handle.get(event.topic)
                if state is not None:
                    self._confirmed(state, event.count)
            elif kind is GuaranteesReceived:
                assert isinstance(event, GuaranteesReceived)
                if event.channel.kind == ChannelKind.PUBLISH:
                    state = self.by_topic_handle.get(event.channel.index)
                    if state is not None and state.handle is not None:
                        self._send(state)
            elif kind is Throttled:
                assert isinstance(event, Throttled)
                if event.channel.kind == ChannelKind.PUBLISH:
                    if event.throttled:
                        self._withheld.add(event.channel.index)
                        self._free_idle()
                    else:
                        self._withheld.discard(event.channel.index)
            elif kind is Gap:
                assert isinstance(event, Gap)
                subscription = subscriptions.get(event.subscription)
                if subscription is not None:
                    subscription.relay_gap(event.first_seq, event.count)
            elif kind is HandleFreeProposed:
                assert isinstance(event, HandleFreeProposed)
                if event.handle_type == HandleType.SUBSCRIPTION:
                    self._owner_ended(event.handle)
            elif kind is WelcomeReceived:
                self._welcomed()
            elif kind is ConnectionClosed:
                assert isinstance(event, ConnectionClosed)
                # (Closed now, though ``broken`` comes only once its tasks
                # end: nothing is bound or sent on it meanwhile.)
                self.open = False
                self.owner_closing = event.code == GoodbyeCode.SHUTTING_DOWN
                return f"goodbye {event.code}: {event.reason}"
        self._subscribe_waiting()
        if self._to_unsubscribe:
            self._free_subscriptions()
        if self._to_free:
            self._free_handles()
        return None

    def _welcomed(self) -> None:
        self.open = True
        self.owner_closing = False
        self.connects += 1
        for state in list(self.topics.values()):
            self._bind(state)
        self._to_subscribe = dict.fromkeys(self.subscriptions)

    def broken(self) -> None:
        """The connection is gone: what it carried waits for the next one."""
        self.open = False
        self.conn = None
        offsets = self.host.offsets
        self.by_topic_handle.clear()
        self._to_free.clear()
        self._to_unsubscribe.clear()
        self._withheld.clear()
        for state in self.topics.values():
            state.handle = None
            state.confirmed = state.sending = 0
            for batch in state.topic.pending:
                batch.sent = batch.confirmed
        self.by_owner_handle.clear()
        for subscription in self.subscriptions:
            subscription.link_broken(offsets=offsets)
        self._to_subscribe = dict.fromkeys(self.subscriptions)


def _origins_of(batch: PendingBatch) -> list[OriginRun]:
    """The origin runs of the publishes of ``batch`` not sent yet (a run
    naming no session for publishes without one, such as a commit's)."""
    routed = batch.routed
    count = len(routed.tails)
    if routed.origins is None:
        return [(b"", 0, 1, count - batch.sent)]
    return slice_origins(routed.origins, batch.sent, count) if batch.sent else routed.origins
