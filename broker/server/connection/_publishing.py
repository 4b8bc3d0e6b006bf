"""A connection's publish channels: the channel buffers, forwarding to topics
while each channel's account is clear, Confirms, staging and commits."""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol

import trio

from accounts import Account
from broker.config import BrokerConfig
from broker.protocol import (
    Channel,
    ChannelKind,
    Commit,
    Connection,
    Event,
    HandleDeleted,
    HandleType,
    OriginRun,
    OutcomeStatus,
    PublishMany,
    PublishManyReceived,
    PublishReceived,
    Stage,
    slice_origins,
)
from broker.protocol.frames import encode_deliver_tail

from .._peer_logging import ConnectionLog, shown
from .._services import Commits, Lifecycle, OriginFilter, TopicDirectory
from ..staging._area import (
    STAGED_PUBLISH_OVERHEAD,
    CommitDecision,
)
from ..staging._registry import CommitRegistry
from ..staging._stream import StagedRun, StagedSender, StagingStore, drop_quietly
from ..topics._topic import DELIVER_HEAD_ESTIMATE, FORWARD_BATCH, Routed, Topic
from ..transport._wake import Wake
from ._budget import ConnectionBudget

__all__ = ["FORWARD_BATCH", "FORWARD_SLICE", "PublishChannel", "Publishing"]

#: Publishes a resumed channel forwards before yielding to other tasks.
FORWARD_SLICE = 256


class Counting(Protocol):
    """The connection's counter of publishes received."""

    messages_in: int


@dataclass(slots=True, eq=False)
class PublishChannel:
    """The broker's side of one publish channel ``[2, t]``."""

    channel: Channel
    account: Account
    topic: Topic
    #: Received publishes not yet forwarded to the topic (the channel buffer).
    buffer: deque[PublishReceived | PublishManyReceived] = field(default_factory=deque)
    #: Publishes the topic has routed to every subscription (for Confirm).
    routed: int = 0
    #: Publishes passed on to the topic (counted on from a resume's ``routed``):
    #: the index on the handle of the last one.
    forwarded: int = 0
    confirmed: int = 0
    #: A task waits for the account to clear (guarantees are withheld meanwhile).
    waiting: bool = False
    #: The client was told (Throttled) that this channel is withheld.
    advised: bool = False
    #: Estimated charge of the deliveries of batches the topic has not routed yet.
    unrouted_fan_out: int = 0
    #: The client's principal may publish to the topic (else a publish ends the connection).
    may_publish: bool = True
    #: Where its publishes are staged until a commit (None: routed at once).
    stage: Stage | None = None
    #: :meth:`Publishing.drain` is forwarding its buffer (a topic that routes
    #: a batch at once, in line, must not start a second drain inside it).
    draining: bool = False
    #: It has received a publish (counted in its topic's ``publishing``).
    published: bool = False
    #: Cluster mode, staged: its runs on their way to the staging stream.
    sender: StagedSender | None = None

    def mark_published(self) -> None:
        """A publish arrived on it: its topic counts it among its publishers."""
        if not self.published:
            self.published = True
            self.topic.publishing += 1

    def unbind(self) -> None:
        """It leaves its topic (its handle freed, its connection closed)."""
        topic = self.topic
        topic.publishers -= 1
        if self.published:
            topic.publishing -= 1
        topic.release_if_unused()


class Publishing:
    """One connection's publish channels (a :class:`~._topic.RouteOrigin`).

    Publishes wait in their channel's buffer and are forwarded to the topic
    only while the channel's account is clear; guarantees on a channel are
    issued only while its account is below its watermark (see
    :class:`~._policy.BrokerPolicy`), so a slow topic withholds exactly its
    own channel's guarantees. A throttled channel is looked after by one
    task (:meth:`_await_clear`) in :attr:`nursery` (the connection's).
    """

    def __init__(
        self,
        config: BrokerConfig,
        life: Lifecycle,
        topics: TopicDirectory,
        commits: Commits,
        seen: OriginFilter,
        name: str,
        account: Account,
        protocol: Connection,
        budget: ConnectionBudget,
        counters: Counting,
        wake: Wake,
        log: ConnectionLog,
    ) -> None:
        self.config = config
        #: Whether the broker shuts down (then nothing more is forwarded or confirmed).
        self.life = life
        self.topics = topics
        #: Staging and commits (exactly-once publishing).
        self.commits = commits
        #: What this worker took of each forwarded origin (``cluster._origin_dedup``).
        self.seen = seen
        self.name = name
        self.account = account
        self.protocol = protocol
        self.budget = budget
        self.counters = counters
        self.wake = wake
        self.log = log
        self.channels: dict[int, PublishChannel] = {}
        #: The client's session (set once it has one): its publishes' origin.
        self.session_id = b""
        #: Channels whose routed count the client has not been told (Confirm).
        self.confirm_dirty: set[int] = set()
        #: Whose staged batches this connection may commit: its principal's.
        self.owner: str | None = None
        self.nursery: trio.Nursery | None = None

    # ---------------------------------------------------------------- channels

    def open(
        self, handle: int, topic_name: str, stage: Stage | None, *, may_publish: bool
    ) -> PublishChannel:
        """The broker's side of a newly bound (or restored) topic handle."""
        topic = self.topics.topic(topic_name)
        topic.publishers += 1
        account = self._channel_account(f"publish/{handle}", "publish")
        state = PublishChannel(
            Channel(ChannelKind.PUBLISH, handle),
            account,
            topic,
            may_publish=may_publish,
            stage=stage,
        )
        self.channels[handle] = state
        return state

    def _channel_account(self, name: str, kind: str) -> Account:
        """An account under the connection's, with the channel watermarks."""
        config = self.config
        return Account(
            f"{self.name}/{name}",
            high_watermark=config.channel_high_watermark,
            low_watermark=config.channel_low_watermark,
            parent=self.account,
            kind=kind,
        )

    def handle_gone(self, handle: int) -> None:
        """Topic ``handle`` is being freed (or was): its channel goes once
        its buffer is forwarded (HandleDeleted comes later, then)."""
        state = self.channels.get(handle)
        if state is None or state.buffer:
            return
        del self.channels[handle]
        self.budget.forget(state.channel)
        state.unbind()
        state.account.close()
        if self.budget.settle():  # its capacity may fund a starved channel
            self.wake.set()

    def close_all(self) -> None:
        """The connection lets go of its channels.

        Publishes that were accepted within guarantees are forwarded even
        though their sender is gone: the guarantee promised they'd be routed.
        (Not once a shutdown began: they are never confirmed, and the client
        publishes them again.)"""
        closing = self.life.closing
        for state in list(self.channels.values()):
            if state.buffer and not closing:
                self._forward_all(state)
            if state.sender is not None and closing:
                self.commits.staging.pending -= state.sender.close()
            state.unbind()
            state.account.close()
        self.channels.clear()

    def _released(self, events: list[Event]) -> None:
        """Events of releasing frames: a handle whose last frame went is deleted."""
        for event in events:
            assert isinstance(event, HandleDeleted) and event.handle_type == HandleType.TOPIC
            self.handle_gone(event.handle)

    # ---------------------------------------------------------------- confirms

    def send_confirms(self) -> None:
        """Confirm what was routed since the last Confirms."""
        protocol = self.protocol
        for handle in self.confirm_dirty:
            state = self.channels.get(handle)
            if state is None:
                continue
            count = state.routed
            if count > state.confirmed:
                state.confirmed = count
                if protocol.may_reference(state.channel):  # not when its topic is being freed
                    protocol.confirm(handle, count)
        self.confirm_dirty.clear()

    def routed(self, routed: Routed) -> None:
        """A topic routed a batch of this connection's publishes."""
        state = self.channels.get(routed.handle)
        if state is None:
            return
        state.unrouted_fan_out -= routed.fan_out
        if not self.protocol.closed:
            state.routed += len(routed.tails) + routed.skipped
            self.confirm_dirty.add(routed.handle)
            self.wake.set()
            if state.buffer and not state.waiting and not state.draining:
                self.drain(state)

    # ---------------------------------------------------------------- forwarding

    def drain(self, state: PublishChannel, limit: int = 0) -> None:
        """Forward buffered publishes (at most ``limit``, if given) while the
        channel's account is clear.

        Publishes go to the topic in batches of up to ``FORWARD_BATCH``: one
        actor message and one loan per batch, one release of buffer space. A
        batch ends with the publish that, counting the deliveries it and
        the batches still on their way will be charged, takes the account
        over its high watermark: the debt passes the watermark by about one
        publish's fan-out, as if publishes were forwarded one at a time.
        """
        if self.life.closing:
            return  # a shutdown forwards nothing more (nothing more is confirmed)
        state.draining = True
        try:
            self._drain(state, limit)
        finally:
            state.draining = False
        self._watch_blocked(state)
        if self.budget.settle():  # a shrink may have completed
            self.wake.set()

    def _watch_blocked(self, state: PublishChannel) -> None:
        """If ``state``'s account withholds its guarantees, have one task
        (:meth:`_await_clear`) issue them again once it clears."""
        if state.account.blocked and not state.waiting and not self.protocol.closed:
            state.waiting = True
            assert self.nursery is not None
            self.nursery.start_soon(self._await_clear, state)

    def _drain(self, state: PublishChannel, limit: int) -> None:
        """:meth:`drain`'s forwarding loop."""
        buffer = state.buffer
        account = state.account
        protocol = self.protocol
        left = limit or len(buffer)
        while buffer and left > 0 and not account.blocked:
            # While routed, a publish's loan and its deliveries' loans are all
            # charged: the room is shared by the publishes and their fan-out.
            # Batches not routed yet will add their fan-out: count it as spent.
            room = account.high_watermark - account.debt - state.unrouted_fan_out
            fan_out = state.topic.charging  # lossy/latest queues charge nobody here
            per_delivery = DELIVER_HEAD_ESTIMATE + account.event_cost
            if room <= 0 and state.unrouted_fan_out > 0:
                break  # resumed by routed() when the topic has caught up
            if type(buffer[0]) is PublishManyReceived:
                # Many publishes in one frame: a batch of its own, cut where
                # it takes the account over its watermark (as below).
                many = _cut_many(buffer, room, fan_out, per_delivery)
                left -= 1
                self._forward_many(state, many, account.event_cost)
                released = protocol.release_frames(
                    state.channel, many.size, len(many.message.entries)
                )
                if released:
                    self._released(released)
                continue
            batch: list[PublishReceived] = []
            size = deliveries = 0
            most = min(FORWARD_BATCH, left)
            while buffer and len(batch) < most and (not batch or size + deliveries <= room):
                event = buffer.popleft()
                if type(event) is not PublishReceived:
                    buffer.appendleft(event)  # (a PublishMany goes as its own batch)
                    break
                batch.append(event)
                size += event.size
                deliveries += fan_out * (event.size + per_delivery)
            left -= len(batch)
            self._forward(state, batch, size, deliveries)
            released = protocol.release_frames(state.channel, size, len(batch))
            if released:
                self._released(released)

    def _forward(
        self, state: PublishChannel, batch: list[PublishReceived], size: int, fan_out: int
    ) -> None:
        """Send ``batch`` (``size`` bytes of frames) to the topic as one loan on
        the channel's account; ``fan_out`` estimates what its deliveries will
        be charged once routed."""
        tails = [
            encode_deliver_tail(e.message.payload, e.message.key, e.message.headers) for e in batch
        ]
        state.unrouted_fan_out += fan_out
        keys = [e.message.key for e in batch]
        origins = self._passed_on(state, len(batch))
        tails, keys, skipped, origins = self._not_taken(state.topic, origins, tails, keys, False)
        state.topic.send_nowait(
            Routed(tails, self, state.channel.index, fan_out, keys, origins, skipped),
            account=state.account,
            cost=size,
        )

    def _forward_many(self, state: PublishChannel, event: PublishManyReceived, cost: int) -> None:
        """Send the publishes of one PublishMany to the topic as one batch
        (one loan on the channel's account, as :meth:`_forward`'s); ``cost``
        is the account's per-event constant."""
        message = event.message
        tails = message.entries
        keys = message.keys
        count = len(tails)
        topic = state.topic
        fan_out = topic.charging * (event.size + (DELIVER_HEAD_ESTIMATE + cost) * count)
        state.unrouted_fan_out += fan_out
        origins = message.origins
        forwarded = origins is not None
        if origins is None:
            origins = self._passed_on(state, count)
        else:
            state.forwarded += count
        tails, keys, skipped, origins = self._not_taken(topic, origins, tails, keys, forwarded)
        topic.send_nowait(
            Routed(tails, self, state.channel.index, fan_out, keys, origins, skipped),
            account=state.account,
            cost=event.size,
        )

    def _not_taken(
        self,
        topic: Topic,
        origins: list[OriginRun] | None,
        tails: list[bytes],
        keys: list[bytes | None],
        forwarded: bool,
    ) -> tuple[list[bytes], list[bytes | None], int, list[OriginRun] | None]:
        """The publishes (tails, keys, origin runs) of a batch for ``topic``
        its owner has not taken before, and how many were left out: a
        worker's link forwards them to their owner (``forwarded``), or in
        cluster mode a session moves between front ends, so none is stored
        twice (the runs left are marked in the log: ``_publish_marks``)."""
        if origins is not None and not topic.forwarded and (forwarded or self.seen.notes_local):
            taken = self.seen.take(topic.topic_name, origins, tails, keys)
            if taken is not None:
                return taken
        return tails, keys, 0, origins

    def _passed_on(self, state: PublishChannel, count: int) -> list[OriginRun] | None:
        """Count ``count`` more publishes of ``state`` passed on to its topic;
        their origin run where it is needed: the topic is another worker's
        (its owner learns whose they are: see ``cluster._origin_dedup``), or it has a log
        (which marks where they go: see ``_publish_marks``)."""
        first = state.forwarded + 1
        state.forwarded += count
        topic = state.topic
        if not self.session_id or (not topic.forwarded and topic.log is None):
            return None
        if self.protocol.accept_origins:
            return None  # (a worker's link: its own session is nobody's origin)
        return [(self.session_id, state.channel.index, first, count)]

    def _forward_all(self, state: PublishChannel) -> None:
        """Send everything in the channel's buffer to the topic, in order,
        whatever the account says (the connection ends)."""
        buffer = state.buffer
        while buffer:
            if type(buffer[0]) is PublishManyReceived:
                many = buffer.popleft()
                assert type(many) is PublishManyReceived
                self._forward_many(state, many, 0)
                continue
            batch: list[PublishReceived] = []
            while buffer and type(buffer[0]) is PublishReceived:
                event = buffer.popleft()
                assert type(event) is PublishReceived
                batch.append(event)
            self._forward(state, batch, sum(event.size for event in batch), 0)

    async def _await_clear(self, state: PublishChannel) -> None:
        """Resume a throttled channel once its account clears and its buffer
        is forwarded; ``state.waiting`` stays true until then, so exactly one
        such task looks after the channel.

        The buffered publishes are forwarded a slice at a time, yielding in
        between, so that a backlog does not hold up other channels' traffic;
        if forwarding (or routing meanwhile) blocks the account again, it
        waits again. Guarantees are issued when it is done.
        """
        life = self.life
        while self._owns(state):
            if state.account.blocked:
                await self._wait_for_funds(state)
                continue
            if not state.buffer or life.closing:
                break
            self.drain(state, FORWARD_SLICE)
            self.wake.set()
            await trio.lowlevel.checkpoint()
        state.waiting = False
        if self._owns(state) and not life.closing:
            if state.advised:
                state.advised = False
                if self.protocol.may_reference(state.channel):  # not when being freed
                    self.protocol.throttled(state.channel, False)
            self.protocol.issue_guarantees(state.channel)
            self.wake.set()

    async def _wait_for_funds(self, state: PublishChannel) -> None:
        """Wait for the channel's account to clear; a wait longer than
        ``throttle_notice_after`` is announced to the client (Throttled)."""
        with trio.move_on_after(self.config.throttle_notice_after) as patience:
            await state.account.ensure_clear_funds()
        if patience.cancelled_caught:
            if not state.advised and self._owns(state):
                state.advised = True
                if self.protocol.may_reference(state.channel):  # not when being freed
                    self.protocol.throttled(state.channel, True)
                self.wake.set()
            await state.account.ensure_clear_funds()

    def _owns(self, state: PublishChannel) -> bool:
        """``state`` is still this open connection's channel."""
        return self.channels.get(state.channel.index) is state and not self.protocol.closed

    # ---------------------------------------------------------------- staging

    def stage(self, state: PublishChannel, event: PublishReceived) -> str | None:
        """Stage a publish of a staged channel: held by the broker, routed
        when its batch is committed; confirmed at once (standalone), or once
        the staging stream stored it (cluster mode). The refusal if the
        staging area is full (the caller says Goodbye 3)."""
        stage = state.stage
        assert stage is not None
        message = event.message
        tail = encode_deliver_tail(message.payload, message.key, message.headers)
        cost = len(tail) + STAGED_PUBLISH_OVERHEAD
        staging = self.commits.staging
        store = self.commits.staged
        if store is not None and not staging.decided((self.owner, stage.batch)):
            # Cluster mode: confirmed once the staging stream stored it.
            refusal = staging.no_room(cost)
            if refusal is not None:
                return refusal
            state.forwarded += 1
            staging.pending += cost
            sender = state.sender
            if sender is None:
                sender = state.sender = self._staged_sender(state, store)
            origin = (self.session_id, state.channel.index, state.forwarded)
            batch = (self.owner, stage.batch)
            entry = (message.key, tail, cost)
            sender.add(batch, stage.member, state.topic.topic_name, origin, entry)
            self._watch_blocked(state)  # (its runs' loans: a stream that does not answer)
        else:
            refusal = staging.stage(
                self.owner,
                stage,
                state.topic.topic_name,
                tail,
                message.key,
                cost,
                trio.current_time(),
                (self.session_id, state.channel.index, state.routed + 1)
                if self.session_id
                else None,
            )
            if refusal is not None:
                return refusal
            state.routed += 1
            self.confirm_dirty.add(state.channel.index)
            self.wake.set()
        self.counters.messages_in += 1
        released = self.protocol.release_frames(state.channel, event.size, 1)
        if released:
            self._released(released)
        return None

    def _staged_sender(self, state: PublishChannel, store: StagingStore) -> StagedSender:
        """The sender of ``state``'s staged runs, in the broker's nursery (a
        run accepted within guarantees is stored even if the connection
        closes meanwhile: a resume then finds it staged)."""
        staging = self.commits.staging
        nursery = self.life.nursery
        assert nursery is not None

        def stored(run: StagedRun) -> None:
            staging.stored(run, trio.current_time())
            if self._owns(state):
                state.routed = max(state.routed, run.first + len(run.entries) - 1)
                self.confirm_dirty.add(state.channel.index)
                self.wake.set()

        return StagedSender(store, state.account, nursery, stored)

    def commit(self, event: Commit) -> None:
        """Decide a Commit; route what it makes visible (charged to a commit
        account under this connection's) and answer once it is routed."""
        commits = self.commits
        batch = (self.owner, event.batch)
        if commits.registry is not None:  # (cluster mode: its registry is asked first)
            self.life.start_soon(partial(self._commit_in_cluster, event, commits.registry))
            return
        # (A topic whose owner moved since the batch was staged, or whose
        # log cannot be opened now: refused, before anything changes.)
        decision = commits.staging.commit(*batch, event.members, self.topics.cannot_commit_to)
        self._decided(event, decision)

    async def _commit_in_cluster(self, event: Commit, registry: CommitRegistry) -> None:
        batch, members = (self.owner, event.batch), event.members
        decision = await registry.decide(
            self.commits.staging, batch, members, self.topics.cannot_commit_to, self._owned
        )
        self._decided(event, decision)

    def _decided(self, event: Commit, decision: CommitDecision) -> None:
        """Answer a Commit, or route what it makes visible first."""
        commits = self.commits
        batch = (self.owner, event.batch)
        running = commits.in_flight.get(batch)
        if decision.status is OutcomeStatus.DUPLICATE and running is not None:
            # The first commit is still routing: "committed before" must
            # still mean "visible", so answer once it is.
            running.waiters.append(lambda: self.answer(event.request, decision))
            return
        if decision.status is not OutcomeStatus.COMMITTED or not decision.publishes:
            self.answer(event.request, decision)
            return
        account = self._channel_account(f"commit/{event.request}", "commit")

        def routed() -> None:
            account.close()
            self.answer(event.request, decision)

        self.log(
            logging.INFO, "batch %s committed: %d to route", shown(event.batch), decision.messages
        )
        commits.start(batch, account, decision.publishes, routed)

    def _owned(self, topic: str) -> bool:
        return self.topics.not_owned(topic) is None

    def abort(self, request: int, batch: str) -> None:
        """Discard staged batch ``batch`` (Abort ``request``) and answer; in
        cluster mode its runs in the staging stream too (all of them: an
        Abort gives the batch up on every front end)."""
        decision = self.commits.staging.abort(self.owner, batch)
        staged = self.commits.staged
        if staged is not None and decision.status is OutcomeStatus.ABORTED:
            self.life.start_soon(partial(drop_quietly, staged, (self.owner, batch), None))
        self.answer(request, decision)

    def answer(self, request: int, decision: CommitDecision) -> None:
        """Send the Outcome of Commit or Abort ``request`` (if still connected)."""
        if not self.protocol.closed:
            self.protocol.outcome(request, decision.status, decision.messages, decision.reason)
            self.wake.set()


def _cut_many(
    buffer: deque[PublishReceived | PublishManyReceived],
    room: float,
    fan_out: int,
    per_delivery: int,
) -> PublishManyReceived:
    """Take from the head of ``buffer`` (a PublishMany) the publishes that
    fit ``room`` with their deliveries' charge, up to and including the one
    that passes it (at least one): all of them, or a part, the rest left at
    the head. The part's size is its entries' bytes; the last part has the
    frame's head too, so the parts' sizes add up to the frame's."""
    many = buffer[0]
    assert type(many) is PublishManyReceived
    entries = many.message.entries
    if many.size * (1 + fan_out) + fan_out * per_delivery * len(entries) <= room:
        buffer.popleft()  # (the usual case: it all fits; the frame's head counted too)
        return many
    spent = size = count = 0
    for entry in entries:
        count += 1
        size += len(entry)
        spent += len(entry) + fan_out * (len(entry) + per_delivery)
        if spent > room:
            break
    if count == len(entries):
        buffer.popleft()
        return many
    keys = many.message.keys
    origins = many.message.origins
    topic = many.message.topic
    first = rest = None
    if origins is not None:  # (a worker link's: each part with its own)
        first = slice_origins(origins, 0, count)
        rest = slice_origins(origins, count, len(entries))
    after = PublishMany(topic, entries[count:], keys[count:], rest)
    buffer[0] = PublishManyReceived(after, many.topic_name, many.channel, many.size - size)
    part = PublishMany(topic, entries[:count], keys[:count], first)
    return PublishManyReceived(part, many.topic_name, many.channel, size)
