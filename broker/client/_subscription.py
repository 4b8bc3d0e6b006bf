"""What both clients keep of a subscription, and how consuming frees room.

:class:`SubscriptionState` is the sans-IO part of a subscription: its handle,
options, inbox and counters, and taking messages from the inbox, which
releases the room of consumed frames (and acknowledges them) in batches. The
drivers' :class:`~broker.client.Subscription` and
:class:`~broker.client.BlockingSubscription` add the waiting.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Protocol

from broker.protocol import (
    DeliverManyReceived,
    DeliverMatched,
    DeliverReceived,
    Matched,
    MatchedGap,
    Options,
    is_topic_pattern,
)

from ._common import GroupTicket, Message
from ._inbox import Inbox
from ._start import LOG_KEYS, START_KEYS, without_log_problem

log = logging.getLogger("broker.client")

#: Consumed messages whose buffer space a subscription releases together (it
#: releases sooner when the application has consumed everything received).
RELEASE_BATCH = 32
#: Messages taken whose acknowledgement is sent at the latest, whole frames
#: or not (a DeliverMany holds up to 1,024): how far a durable cursor or a
#: session may lag what the application took when it is killed outright.
ACK_EVERY = 256
#: Done settles a group member keeps to send again after a resume.
SETTLES_KEPT = 8192
#: Done settles of a group member sent together at the latest.
SETTLE_BATCH = 64
#: A member's ``max_outstanding`` when it names none (the broker's default).
DEFAULT_MAX_OUTSTANDING = 1000
#: The most messages ``receive_batch()`` returns unless told otherwise.
BATCH_MOST = 1024


def settle_batch(options: Options | None) -> int:
    """How many done settles go in one frame at once: :data:`SETTLE_BATCH`,
    or a quarter of the member's ``max_outstanding`` if less (the broker
    sends a member nothing new while it holds that many, so a batch must
    never wait for deliveries that cannot come)."""
    most = (options or {}).get("max_outstanding", DEFAULT_MAX_OUTSTANDING)
    if type(most) is not int or most < 1:
        return 1
    return max(1, min(SETTLE_BATCH, most // 4))


class Releaser(Protocol):
    """Who frees the room of consumed messages (the client session)."""

    def release(self, subscription: SubscriptionState, *, hold: bool = False) -> None:
        """Free the room of the frames it consumed whole and acknowledge what
        it consumed (with ``hold``, fewer than a batch: the Ack may be held
        back for a moment)."""
        ...

    def acknowledge(self, subscription: SubscriptionState) -> None:
        """Acknowledge what ``subscription`` consumed (frames whole or not)."""
        ...


class SubscriptionState:
    """One subscription's handle, options, inbox and counters.

    ``releaser`` is the session whose connection the room of consumed
    messages goes back to.
    """

    def __init__(self, releaser: Releaser, handle: int, topic: str) -> None:
        self._releaser = releaser
        #: The subscription handle (on the wire; a new one if the session is made again).
        self.handle = handle
        #: The topic subscribed to (or the topic pattern: see :attr:`pattern`).
        self.topic = topic
        #: Whether :attr:`topic` is a pattern: the subscription gets the
        #: records of every topic it matches, each message naming its topic.
        self.pattern = is_topic_pattern(topic)
        self._inbox = Inbox(topic)
        self._closed = False
        #: Why the broker ended the subscription (None: it did not), e.g.
        #: its topic was deleted: iteration stops once the inbox is empty.
        self.ended: str | None = None
        #: Deliveries received from the broker so far (taken or not), not
        #: counting those dropped as duplicates.
        self.received = 0
        #: Deliveries dropped because their offset was at or below the last
        #: one handed to the application or queued for it (a durable cursor
        #: subscribed again after a lost session delivers again what was
        #: taken and not yet acknowledged): see :meth:`_redelivered`.
        self.duplicates_dropped = 0
        #: Deliveries the broker dropped (lossy and latest modes), per its Gap notices.
        self.missed = 0
        #: One past the last sequence number (offset) a Gap covered (0: none):
        #: every delivery before it has been received (a bounded read whose
        #: end lies in a gap is done once its inbox is empty).
        self.skipped_to = 0
        #: The options it was made with (to subscribe again if the session is lost).
        self.mode = "reliable"
        self.options: Options | None = None
        #: The sequence numbers of the last message consumed and of the last acknowledged.
        self._consumed = 0
        self._acked = 0
        #: Messages taken since the last acknowledgement.
        self._unacked = 0
        #: While reconnecting: the messages received and not consumed, those
        #: of a session lost before and those of frames of the broken
        #: connection (see :meth:`_reset`), and the last offset of the latter.
        self._held: list[Message] = []
        self._held_framed: list[Message] = []
        self._held_to = 0
        #: With offsets, once the connection was replaced until the session
        #: is known lost: the last offset a resume says was processed. A
        #: resumed broker sends what follows it: a delivery at or below it
        #: is a record at an offset given again (see :meth:`_redelivered`).
        self._told = 0
        #: Delivery numbers settled done and not sent yet (a group's member),
        #: and how many are sent together (see ``_settles.settle_batch``).
        self._done: list[int] = []
        self._settle_batch = 1
        #: The last done settles sent on this connection: sent again after a
        #: resume (a Settle lost with a broken connection is not resent by
        #: the protocol; the broker ignores one it had).
        self._sent_done: deque[int] = deque(maxlen=SETTLES_KEPT)
        #: Settles other than done (retry, reject, in progress) not sent yet,
        #: and the last sent on this connection (sent again after a resume).
        self._other: list[tuple[int, int, int | str | None]] = []
        self._sent_other: deque[tuple[int, int, int | str | None]] = deque(maxlen=1024)
        #: Settles sent (a group's member), and those of a lost session's
        #: messages, which did nothing (their records went back to the group).
        self.settles_sent = 0
        self.settles_dropped = 0

    @property
    def group(self) -> str | None:
        """The consumer group this subscription is a member of (None: none)."""
        group = (self.options or {}).get("group")
        return group if isinstance(group, str) else None

    def _join_group(self) -> None:
        """It is a group's member: its messages settle through a new ticket."""
        if self._inbox.ticket is not None:
            self._inbox.ticket.valid = False
        self._inbox.ticket = GroupTicket(self)  # type: ignore[arg-type]  # (drivers add _settle)
        self._settle_batch = settle_batch(self.options)

    def _gap(self, first_seq: int, count: int) -> None:
        """The broker's Gap: ``count`` deliveries from ``first_seq`` will never come."""
        self.missed += count
        self.skipped_to = max(self.skipped_to, first_seq + count)

    def _matched(self, event: Matched | MatchedGap) -> None:
        """A pattern subscription's Matched (a topic bound to a match index,
        or unbound: deleted) or MatchedGap (records of it dropped)."""
        inbox = self._inbox
        if isinstance(event, MatchedGap):
            self.missed += event.count
        elif event.topic is None:
            topic = inbox.matches.pop(event.match, None)
            if topic is not None and inbox.bounds is not None:
                inbox.bounds.pop(topic, None)  # (made again, it starts at 1)
        else:
            inbox.matches[event.match] = event.topic

    def _take(self) -> Message:
        """The next queued message (there is one)."""
        inbox = self._inbox
        if inbox.detached:
            return inbox.take()  # (of a lost session: nothing to acknowledge)
        message = inbox.take()
        self._consumed = message.seq
        self._unacked += 1
        if inbox.done_count:  # (rare mid-frame: not worth a call per message)
            self._release_if_due()
        elif self._unacked >= ACK_EVERY:
            self._releaser.acknowledge(self)  # (in a DeliverMany of up to 1024)
        return message

    def _take_many(self, limit: int) -> list[Message]:
        """The next queued messages, at most ``limit`` (at least one is queued)."""
        if self._inbox.detached:
            return self._inbox.take_many(limit)  # (of a lost session: see _take)
        messages = self._inbox.take_many(limit)
        self._consumed = messages[-1].seq
        self._unacked += len(messages)
        self._release_if_due()
        return messages

    def _put(self, event: DeliverReceived | DeliverManyReceived) -> int:
        """Queue the messages of a received frame, but those numbered at or
        below the last offset handed out or queued (see :meth:`_redelivered`);
        returns how many were dropped as duplicates."""
        if type(event.message) is DeliverMatched:
            return self._put_matched(event)
        queued = self._inbox.put(event)
        duplicates = 0
        if queued < 0:  # (REDELIVERED: handed out or queued already, in part)
            queued, duplicates = self._redelivered(event)
        self.received += queued
        return duplicates

    def _put_matched(self, event: DeliverManyReceived) -> int:
        """:meth:`_put` of a pattern subscription's DeliverMatched: what is
        at or below its topic's last offset handed out or queued is dropped
        (counted as taken, as in :meth:`_redelivered`)."""
        inbox = self._inbox
        waiting = bool(inbox.messages)
        dropped, last = inbox.put_matched(event)
        self.received += len(event.message.entries) - dropped
        if dropped:
            self.duplicates_dropped += dropped
            if not waiting and last > self._consumed:
                self._consumed = last
                self._unacked += dropped
            if dropped == len(event.message.entries):
                self._releaser.release(self, hold=True)
        return dropped

    def _redelivered(self, event: DeliverReceived | DeliverManyReceived) -> tuple[int, int]:
        """A frame numbered by offsets starts at or below the last offset
        handed to the application or queued for it (``Inbox.bound``): queue
        only what is above it. Returns how many messages were queued and how
        many dropped.

        What is dropped counts as taken: if nothing waits before it, the
        subscription has processed it (its ``Ack`` and a resume's
        ``processed`` cover it, so a durable cursor moves past it), and a
        frame dropped whole has its room released at once (with its ``Ack``
        held back as for a small batch taken).

        The exception: a resumed broker sends what follows the offset the
        client said it processed, so a record numbered at or below that
        offset is not the same record but one at an offset given again (its
        log was cut back by a crash of its machine, the unsynced tail lost):
        it is queued, and said in a warning."""
        inbox = self._inbox
        if isinstance(event, DeliverReceived):
            first, size = event.message.seq, 1
        else:
            first, size = event.message.first_seq, len(event.message.entries)
        if first <= self._told:
            self._told = 0
            log.warning(
                "the broker delivers offsets of %r from %d again (after %d): its log lost "
                "records received before (a crash of its machine); taking them as new records",
                self.topic,
                first,
                inbox.bound,
            )
            inbox.bound = first - 1
            return inbox.put(event), 0
        waiting = bool(inbox.messages)
        dropped, last = inbox.put_above(event)
        self.duplicates_dropped += dropped
        if not waiting and last > self._consumed:
            self._consumed = last
            self._unacked += dropped
        queued = size - dropped
        if not queued:
            self._releaser.release(self, hold=True)
        return queued, dropped

    def _release_if_due(self) -> None:
        """Release what whole frames taken hold, once ``RELEASE_BATCH``
        messages' worth is waiting or the application has taken everything
        received (acknowledging what was taken: a batch at once, fewer
        within the policy's ``ack_delay``); else acknowledge what was
        taken once ``ACK_EVERY`` messages are unacknowledged, whole
        frames or not: a durable cursor (and a session's resume) never lags
        the application by more than that, however large the frames."""
        inbox = self._inbox
        done = inbox.done_count
        if done and (done >= RELEASE_BATCH or not inbox.messages):
            self._releaser.release(self, hold=done < RELEASE_BATCH)
        elif self._unacked >= ACK_EVERY:
            self._releaser.acknowledge(self)

    def _numbered(self, offsets: bool) -> None:
        """The connection's broker numbers reliable deliveries by offsets (or
        not): whether this subscription's messages carry an ``offset``."""
        if self.pattern:
            # Numbered by delivery; each message's offset is its topic's,
            # a log offset (to drop duplicates by) on a broker with logs.
            self._inbox.offsets = False
            reliable = offsets and self.mode == "reliable"
            if reliable and self._inbox.bounds is None:
                self._inbox.bounds = {}
            elif not reliable:
                self._inbox.bounds = None
            return
        self._inbox.offsets = offsets and self.mode == "reliable" and self.group is None

    def _resubscribing(self, offsets: bool) -> SubscriptionState:
        """The session was lost: make the options to subscribe again with, on
        a broker that numbers by offsets (or not). If the messages received
        carried offsets, it starts from the record after the last one
        received (its ``"from"`` replaces the start options it was made
        with), and those received and not consumed stay queued: nothing is
        lost or delivered twice. With a durable cursor the broker knows (it
        takes precedence: it continues after its last acknowledged record)
        it starts after the last consumed, and delivers the rest again. On a
        broker without topic logs, options that need one are dropped (said
        in a warning), as the broker would refuse them, and what was
        received and not consumed stays queued (no broker has it any more).
        Returns itself."""
        options = self.options or {}
        kept = self._held + self._held_framed
        self._told = 0
        if self.group is not None:
            # Its records went back to the group when the session was lost:
            # another member may have them now. Nothing of it is kept.
            self.settles_dropped += len(self._done) + len(self._other)
            self._done = []
            self._other = []
            self._sent_done.clear()
            self._sent_other.clear()
            self._join_group()
            self._inbox.keep([])
            self._held = self._held_framed = []
            return self
        inbox = self._inbox
        if self.pattern:
            # Subscribed again with its options: a durable cursor's broker
            # goes on after its last acknowledged record of each topic, and
            # what it delivers again is dropped by each topic's bound.
            if inbox.bounds is not None:
                for message in self._held_framed:
                    if message.offset is not None:
                        inbox.bounds[message.topic] = max(
                            inbox.bounds.get(message.topic, 0), message.offset
                        )
            inbox.matches = {}
            self._inbox.keep(kept)
            self._held = self._held_framed = []
            return self
        if inbox.offsets and not (offsets and "cursor" in options):
            inbox.bound = max(inbox.bound, self._held_to)  # (all of it stays queued)
        elif not inbox.offsets:
            inbox.bound = 0  # (what was received carried no offsets)
        if not offsets:
            if without_log_problem(options) is not None:
                self.options = {k: v for k, v in options.items() if k not in LOG_KEYS}
                log.warning(
                    "the broker keeps no topic log any more: subscribing to %r again "
                    "from the next message published (without %s)",
                    self.topic,
                    ", ".join(sorted(set(options) & set(LOG_KEYS))),
                )
        elif self._inbox.offsets and "cursor" in options:
            kept = self._held  # (the cursor's broker delivers the rest again)
            if self._consumed > 0:
                self.options = {k: v for k, v in options.items() if k not in START_KEYS}
                self.options["from"] = self._consumed + 1
        elif self._inbox.offsets and max(self._consumed, self._held_to) > 0:
            self.options = {k: v for k, v in options.items() if k not in START_KEYS}
            self.options["from"] = max(self._consumed, self._held_to) + 1
        self._inbox.keep(kept)
        self._held = self._held_framed = []
        return self

    def _resumed(self) -> None:
        """The session was resumed: the broker delivers again what was
        received and not consumed; only what came in a session lost before
        stays held. A group member's last settles of the broken connection
        go again (see ``_sent_done``, ``_sent_other``)."""
        if self._sent_done:
            self._done = [*self._sent_done, *self._done]
            self._sent_done.clear()
        if self._sent_other:
            self._other = [*self._sent_other, *self._other]
            self._sent_other.clear()
        self._inbox.keep(self._held)
        self._held = self._held_framed = []

    def _given_up(self) -> None:
        """Reconnecting ended for good: what was received and not consumed
        is still the application's to take (before the error)."""
        self._told = 0
        self._inbox.keep(self._held + self._held_framed)
        self._held = self._held_framed = []

    def _reset(self) -> None:
        """The connection was replaced: what was received and not consumed is
        held until the new connection says whether the session was resumed
        (then the broker delivers it again: see :meth:`_resumed`,
        :meth:`_resubscribing`, :meth:`_given_up`)."""
        inbox = self._inbox
        messages = list(inbox.messages)
        self._held = messages[: inbox.detached]
        self._held_framed = messages[inbox.detached :]
        # (offsets of the framed ones: a lost session's subscription made
        # again with topic logs starts after them, not after the consumed.)
        self._held_to = self._held_framed[-1].seq if inbox.offsets and self._held_framed else 0
        # What was handed to the application or stays queued whatever comes
        # next: everything before the first framed message not taken (the
        # broker delivers that one again, unless the session is lost and it
        # stays queued: see _resubscribing).
        if not inbox.offsets:
            inbox.bound = 0
        elif self._held_framed:
            inbox.bound = self._held_framed[0].seq - 1
        if inbox.bounds is not None:
            # A pattern's: each topic's framed messages not taken come again.
            firsts: dict[str, int] = {}
            for message in reversed(self._held_framed):
                if message.offset is not None:
                    firsts[message.topic] = message.offset
            for topic, first in firsts.items():
                inbox.bounds[topic] = first - 1
        self._told = self._consumed if inbox.offsets else 0
        inbox.clear()
        self._acked = self._consumed
        self._unacked = 0
