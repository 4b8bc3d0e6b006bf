"""Applying a read's events: publishes and guarantees (the hot path) in line,
control events through :data:`CONTROL`, each to the part whose job it is."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final, Protocol

import trio

from broker.protocol import (
    Abort,
    Ack,
    Admin,
    AdminStatus,
    ChannelKind,
    Commit,
    ConnectionClosed,
    DeliverReceived,
    Event,
    GoodbyeCode,
    GuaranteesReceived,
    HandleDeleted,
    HandleFreeProposed,
    HandleType,
    HelloReceived,
    ListOffsets,
    PublishManyReceived,
    PublishReceived,
    Settle,
    Subscribed,
    TopicBound,
    TopicPattern,
)

from .._peer_logging import LINE_CHARS, ConnectionLog, shown
from .._services import BrokerServices
from ..admin._lists import Listing
from ..admin._requests import administer, refuse
from ..storage._offsets import Survey, answer_list_offsets
from ..storage._topic_logs import TopicUnavailable
from ..topics._subscribe import OptionError, make_pattern_subscription, make_subscription
from ._admission import Admission, Admitted
from ._budget import ConnectionBudget
from ._delivery import ConnectionCounters, Deliveries
from ._publishing import PublishChannel, Publishing


class Dispatched(Admitted, Protocol):
    """The connection whose events are applied."""

    #: Why the connection closed (for its last log line).
    close_reason: str


#: ListOffsets a connection may have waiting for logs to be read at once;
#: one more ends it (Goodbye 3): a client waits for its answers.
MAX_SURVEYS = 8


class Dispatch:
    """Applies the events of one connection's reads, in order.

    Called once ``receive_data`` has returned (never from inside it). The
    connection passes itself to :meth:`handle` rather than being kept here,
    so nothing here makes a reference cycle through it.
    """

    def __init__(
        self,
        services: BrokerServices,
        admission: Admission,
        publishing: Publishing,
        deliveries: Deliveries,
        budget: ConnectionBudget,
        counters: ConnectionCounters,
        log: ConnectionLog,
    ) -> None:
        #: For administration, which reads and changes any of them.
        self.services = services
        #: Whether the broker shuts down (then no Commit is decided).
        self.life = services.life
        #: The topic actors; pattern subscriptions and ListOffsets read it too.
        self.topics = services.topics
        #: The topic logs, cursors and groups.
        self.storage = services.storage
        self.admission = admission
        self.publishing = publishing
        self.deliveries = deliveries
        self.budget = budget
        self.counters = counters
        self.log = log
        self.protocol = publishing.protocol
        #: ListOffsets answers waiting for logs to be read (at most MAX_SURVEYS).
        self.surveys = 0
        #: The last topic listing of an Admin request, for its next pages.
        self.listings: dict[str, Listing] = {}
        #: The Publish and PublishMany frames of the last :meth:`handle`, and
        #: their bytes: charged to their channels (the rest are control frames).
        self.channel_frames = self.channel_bytes = 0

    def handle(self, events: list[Event], connection: Dispatched) -> None:
        """Apply ``events``: publishes go to their channel's buffer (or
        staging) and are drained once all are in; guarantees pump their
        subscription; the rest go through :data:`CONTROL`."""
        touched: set[PublishChannel] = set()
        protocol = self.protocol
        publishing = self.publishing
        channels = publishing.channels
        counters = self.counters
        closing = self.life.closing
        # Events of a read that ended the connection (the client's Goodbye, a
        # protocol error) all stand: they end with ConnectionClosed. Only a
        # Goodbye of ours, said while handling them, stops the rest.
        closed_before = protocol.closed
        frames = size = 0
        for event in events:
            if type(event) is PublishReceived:
                frames += 1
                size += event.size
                if closing:
                    continue  # a shutdown accepts none: never routed, never confirmed
                state = channels[event.channel.index]
                if not state.may_publish:
                    self.deny(f"may not publish to {shown(state.topic.topic_name)}", connection)
                    break
                if not state.published:
                    state.mark_published()
                if state.stage is not None:
                    refusal = publishing.stage(state, event)
                    if refusal is not None:
                        self.log(logging.WARNING, "%s", refusal)
                        connection.goodbye(GoodbyeCode.LIMIT_EXCEEDED, refusal)
                        break
                    continue
                state.buffer.append(event)
                touched.add(state)
                counters.messages_in += 1
            elif type(event) is PublishManyReceived:
                # (As a Publish, but never staged: the protocol refuses that.)
                frames += 1
                size += event.size
                if closing:
                    continue
                state = channels[event.channel.index]
                if not state.may_publish:
                    self.deny(f"may not publish to {shown(state.topic.topic_name)}", connection)
                    break
                if not state.published:
                    state.mark_published()
                state.buffer.append(event)
                touched.add(state)
                counters.messages_in += len(event.message.entries)
            elif type(event) is GuaranteesReceived:
                if event.channel.kind == ChannelKind.DELIVER:
                    self.deliveries.pump(event.channel.index)
            else:
                handler = CONTROL.get(type(event))
                if handler is not None:
                    try:
                        handler(self, event, connection)
                    except TopicUnavailable as error:  # (the broker's disk, not the client)
                        connection.goodbye(GoodbyeCode.LIMIT_EXCEEDED, str(error))
                if protocol.closed and not closed_before:
                    break  # nothing after a Goodbye of ours is applied
        self.channel_frames = frames
        self.channel_bytes = size
        if touched:
            now = trio.current_time()
            budget = self.budget
            # The batches of the read go into the topics' logs together: one
            # journal write covers their publish marks (``TopicLogs.gather``).
            logs = self.storage.logs
            if logs is not None:
                logs.gather()
            try:
                for state in touched:
                    budget.note_busy(state.channel, now)
                    publishing.drain(state)
            finally:
                if logs is not None:
                    logs.release()

    def deny(self, reason: str, connection: Dispatched) -> None:
        """Goodbye 6: the client's principal may not do that."""
        self.admission.deny(reason, connection)

    # ---------------------------------------------------------------- control events

    def hello(self, event: HelloReceived, connection: Dispatched) -> None:
        self.admission.hello(event, connection)

    def topic_bound(self, event: TopicBound, connection: Dispatched) -> None:
        self.admission.session_dirty = True
        self.admission.open_channel(event.handle, event.name, event.stage, connection)
        if event.stage is not None and (elsewhere := self.topics.not_owned(event.name)) is not None:
            # Staged (exactly-once) publishing is not forwarded between workers.
            connection.goodbye(GoodbyeCode.NOT_AUTHORISED, elsewhere)

    def commit(self, event: Commit, connection: Dispatched) -> None:
        if not self.life.closing:  # unanswered: the client sees Goodbye 5 instead
            self.publishing.commit(event)

    def abort(self, event: Abort, connection: Dispatched) -> None:
        self.publishing.abort(event.request, event.batch)

    def subscribed(self, event: Subscribed, connection: Dispatched) -> None:
        if event.topic is None:
            self.subscribed_pattern(event, connection)
            return
        if not self.admission.may_subscribe(event.topic_name):
            self.deny(f"may not subscribe to {shown(event.topic_name)}", connection)
            return
        topic = self.topics.topic(event.topic_name)
        try:
            principal = self.admission.principal
            subscription = make_subscription(
                self.deliveries,
                event.handle,
                topic,
                event.mode,
                event.options,
                cursors=self.storage.cursors,
                principal=principal.principal.name if principal is not None else None,
                trusted=self.admission.trusted,
                groups=self.storage.groups,
            )
        except OptionError as error:
            topic.release_if_unused()
            connection.goodbye(GoodbyeCode.PROTOCOL_ERROR, f"Subscribe: {error}")
            return
        self.deliveries.subscriptions[event.handle] = subscription
        self.admission.session_dirty = True
        topic.subscribe(subscription)
        self.budget.subscriptions_changed()

    def subscribed_pattern(self, event: Subscribed, connection: Dispatched) -> None:
        """A Subscribe of a pattern: the topics it matches that the principal
        may read, now and later (see ``_patterns``)."""
        principal = self.admission.principal
        try:
            subscription = make_pattern_subscription(
                self.deliveries,
                event.handle,
                TopicPattern(event.topic_name),
                event.mode,
                event.options,
                host=self.topics,
                cursors=self.storage.cursors,
                principal=principal.principal.name if principal is not None else None,
                may_read=self.admission.may_subscribe,
            )
        except OptionError as error:
            connection.goodbye(GoodbyeCode.PROTOCOL_ERROR, f"Subscribe: {error}")
            return
        self.deliveries.subscriptions[event.handle] = subscription
        self.admission.session_dirty = True
        subscription.start()
        self.budget.subscriptions_changed()

    def list_offsets(self, event: ListOffsets, connection: Dispatched) -> None:
        answer = answer_list_offsets(
            self.topics, self.protocol, self.admission.may_subscribe, event
        )
        if isinstance(answer, Survey):
            self._wait_for_disk(answer.answer, connection)
        elif answer is not None:
            self.deny(answer, connection)
        self.publishing.wake.set()

    def admin(self, event: Admin, connection: Dispatched) -> None:
        refusal = self.admission.may_administer()
        if refusal is not None:
            refuse(self.protocol, event, AdminStatus.NOT_PERMITTED, refusal)
        else:
            principal = self.admission.principal
            job = administer(
                self.services,
                self.protocol,
                event,
                principal.principal.name if principal is not None else None,
                self.listings,
            )
            if job is not None:
                self._wait_for_disk(job, connection)
        self.publishing.wake.set()

    def _wait_for_disk(self, answer: Callable[[], Awaitable[None]], connection: Dispatched) -> None:
        """Run ``answer`` (a ListOffsets or Admin answer that reads the disk
        first) in a task: at most :data:`MAX_SURVEYS` at once per
        connection; one more ends it (Goodbye 3: a client waits for its
        answers)."""
        nursery = self.publishing.nursery
        if self.surveys >= MAX_SURVEYS or nursery is None:
            connection.goodbye(
                GoodbyeCode.LIMIT_EXCEEDED,
                f"more than {MAX_SURVEYS} requests wait for the disk: "
                "wait for their answers before asking again",
            )
            return
        self.surveys += 1
        nursery.start_soon(self._answer_later, answer, connection)

    async def _answer_later(
        self, answer: Callable[[], Awaitable[None]], connection: Dispatched
    ) -> None:
        """Send an answer that waits for the disk (see :meth:`_wait_for_disk`)."""
        try:
            await answer()
        except TopicUnavailable as error:  # (the broker's disk, not the client)
            connection.goodbye(GoodbyeCode.LIMIT_EXCEEDED, str(error))
        finally:
            self.surveys -= 1
            self.publishing.wake.set()

    def ack(self, event: Ack, connection: Dispatched) -> None:
        self.deliveries.ack(event.subscription, event.seq)

    def settle(self, event: Settle, connection: Dispatched) -> None:
        refusal = self.deliveries.settle(
            event.subscription, event.ranges, int(event.outcome), event.detail
        )
        if refusal is not None:
            self.log(logging.WARNING, "%s", refusal)
            connection.goodbye(GoodbyeCode.PROTOCOL_ERROR, refusal)

    def handle_gone(
        self, event: HandleFreeProposed | HandleDeleted, connection: Dispatched
    ) -> None:
        self.admission.session_dirty = True
        if event.handle_type == HandleType.SUBSCRIPTION:
            self.deliveries.drop(event.handle)
            self.budget.subscriptions_changed()
        else:
            self.publishing.handle_gone(event.handle)

    def closed(self, event: ConnectionClosed, connection: Dispatched) -> None:
        # A client that says Goodbye 0 is done with its session; one that
        # breaks the rules loses it. Other Goodbyes (e.g. "broker silent")
        # leave it to be resumed.
        if event.error is not None or event.code == GoodbyeCode.NORMAL:
            self.admission.ends_session = True
        how = "by the client" if event.by_peer else "for a protocol violation"
        connection.close_reason = f"closed {how}: code {event.code} {shown(event.reason)}"
        if event.error is not None:
            self.log(logging.WARNING, "%s", shown(str(event.error), LINE_CHARS))

    def deliver(self, event: DeliverReceived, connection: Dispatched) -> None:  # pragma: no cover
        raise AssertionError("a broker never receives Deliver")  # (the protocol refuses it)


#: Control event type -> its handler (other events need nothing of the broker).
CONTROL: Final[dict[type, Callable[[Dispatch, Any, Dispatched], None]]] = {
    HelloReceived: Dispatch.hello,
    TopicBound: Dispatch.topic_bound,
    Commit: Dispatch.commit,
    Abort: Dispatch.abort,
    Subscribed: Dispatch.subscribed,
    Ack: Dispatch.ack,
    Settle: Dispatch.settle,
    ListOffsets: Dispatch.list_offsets,
    Admin: Dispatch.admin,
    HandleFreeProposed: Dispatch.handle_gone,
    HandleDeleted: Dispatch.handle_gone,
    ConnectionClosed: Dispatch.closed,
    DeliverReceived: Dispatch.deliver,
}
