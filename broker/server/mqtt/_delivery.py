"""An MQTT connection's subscriptions and what they send: the broker's
subscriptions (log readers, reliable and lossy queues, pattern
subscriptions) deliver through this part as MQTT PUBLISH packets.

One MQTT topic filter is one or two broker subscriptions (see
``broker_topic_filter``), each under a handle of this connection, each
delivered at the filter's granted QoS:

- QoS 1 is a ``reliable`` subscription: with topic logs it reads the log
  from where it is, at the client's pace. What may be in flight is the
  client's Receive Maximum (PUBLISHes not acknowledged) and
  ``max_unsent`` bytes of output the client has not read (TCP): beyond
  them a subscription waits (stalled) and nothing more is read from the
  log or queued in memory. PUBACKs acknowledge it in order of its
  numbers (a log offset, or a pattern's number), as a native ``Ack``.
- QoS 0 is a ``lossy`` subscription: a bounded queue that drops its
  oldest when the client falls behind (counted in
  :attr:`DeliveryCounters.deliveries_overflowed`).
- A shared subscription (``$share/GROUP/TOPIC``) is a member of the
  topic's consumer group GROUP (``topics/_groups``): the group gives it
  records (each numbered per member) and each is *settled done* at its
  PUBACK (QoS 1), or once sent (QoS 0: at most once). What it holds when
  it leaves (unsubscribed, disconnected) goes back to the group, to
  another member.
- A record whose ``mqtt-expiry`` has passed, or (on a No Local
  subscription) whose ``mqtt-origin`` is this client (see ``_messages``), is
  taken and acknowledged (settled) without being sent.
- A new subscription's retained messages (see ``_retained``) are queued
  here (:meth:`MQTTDeliveries.queue_retained`: references to the stored
  messages) and sent before anything else, with the retain flag, within
  the same Receive Maximum and ``max_unsent``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import trio

from accounts import Account, LoanedItem
from broker.groups import Outcome
from broker.mqtt import (
    MQTTUsageError,
    PacketTooLargeForPeer,
    ServerConnection,
    mqtt_topic_name,
)

from ..patterns._subscription import PatternSubscription
from ..topics._groups import GroupSubscription
from ..topics._topic import Subscription
from ._messages import delivered, plain_delivery, wall_ms

__all__ = ["RETAINED_HANDLE", "DeliveryCounters", "FilterState", "MQTTDeliveries"]

#: The handle :attr:`MQTTDeliveries.in_flight` notes retained messages
#: under (no broker subscription's: their acknowledgements move no position).
RETAINED_HANDLE = 0


@dataclass(slots=True)
class DeliveryCounters:
    """What an MQTT connection counted of its deliveries (and drops)."""

    messages_out: int = 0
    bytes_out: int = 0
    #: Deliveries its QoS 0 queues dropped: overflow, replaced (never: no ``latest``).
    deliveries_overflowed: int = 0
    deliveries_replaced: int = 0
    #: Deliveries larger than the client's Maximum Packet Size: dropped, as MQTT says.
    deliveries_too_large: int = 0
    #: Messages not delivered: their Message Expiry Interval had passed (5.0).
    deliveries_expired: int = 0


@dataclass(slots=True, eq=False)
class FilterState:
    """One MQTT subscription (a topic filter) of the connection: its
    broker subscriptions' handles and what its deliveries carry."""

    topic_filter: str
    qos: int
    #: 5.0: the Subscription Identifier to send with each delivery (None: none).
    identifier: int | None
    handles: list[int] = field(default_factory=list)
    #: 5.0's Retain As Published: deliveries keep the retain flag they were
    #: published with (else it is 0, but on retained messages sent at SUBSCRIBE).
    retain_as_published: bool = False
    #: A shared subscription (``$share/...``): its broker subscription is a
    #: consumer group's member.
    shared: bool = False
    #: 5.0's No Local: the client's own publishes are not delivered to it.
    no_local: bool = False
    #: A persistent session's subscription: when it was first subscribed
    #: (wall-clock milliseconds; None: unknown, or not a session's).
    since: int | None = None


def _nothing(packet_id: int, state: list[object] | None) -> None:
    """(A clean session keeps nothing of its QoS 2 deliveries.)"""


class _Sent:
    """A broker subscription's deliveries in flight at QoS 1: numbers sent,
    oldest first, and those the client acknowledged out of order."""

    __slots__ = ("acked", "numbers")

    def __init__(self) -> None:
        self.numbers: deque[int] = deque()
        self.acked: set[int] = set()


class MQTTDeliveries:
    """The connection as its broker subscriptions see it (a
    ``SubscribingConnection`` and a ``PatternConnection``): every method
    only queues, on the sans-IO MQTT connection, and wakes the writer.

    A subscription that finds no room (the client's Receive Maximum, or
    ``max_unsent`` bytes not written) is noted in :attr:`stalled` and is
    pumped again by :meth:`pump_stalled` once PUBACKs or the writer free
    room.
    """

    def __init__(
        self,
        name: str,
        protocol: ServerConnection,
        wake: Callable[[], None],
        *,
        lossy_budget: int,
        max_unsent: int,
        root_account: Account,
    ) -> None:
        self.name = name
        self.protocol = protocol
        self._wake = wake
        self.lossy_budget = lossy_budget
        self.max_unsent = max_unsent
        self.root_account = root_account
        self.counters = DeliveryCounters()
        #: The client's id (what its No Local subscriptions skip: see ``_messages``).
        self.client_id = ""
        #: The broker subscriptions, by handle.
        self.subscriptions: dict[int, Subscription] = {}
        #: The MQTT subscription each handle serves.
        self.filter_of: dict[int, FilterState] = {}
        #: The MQTT subscriptions, by topic filter as the client gave it.
        self.filters: dict[str, FilterState] = {}
        #: Plain subscriptions' MQTT topic names, by handle.
        self.topic_names: dict[int, str] = {}
        #: Pattern subscriptions' matched topics (MQTT names), by handle and match.
        self.matches: dict[int, dict[int, str]] = {}
        #: QoS 1 deliveries in flight: packet id -> (handle, number).
        self.in_flight: dict[int, tuple[int, int]] = {}
        self._sent: dict[int, _Sent] = {}
        #: What PUBACKs of the read being applied acknowledge, by handle.
        self._ack_upto: dict[int, int] = {}
        #: Group members' deliveries to settle done (PUBACKs, or QoS 0 ones
        #: sent), by handle: applied by :meth:`apply_acks`.
        self._settle: dict[int, list[int]] = {}
        #: What the lossy queues hold (bounded by ``lossy_budget`` together).
        self.dropping_bytes = 0
        #: Loans of what is queued to send, repaid once written (:meth:`take_written`).
        self.writing: list[LoanedItem[Any]] = []
        #: Bytes queued on the protocol not taken by the writer yet.
        self.unsent = 0
        #: Subscriptions waiting for what only this client's reading clears
        #: (PUBACKs), by handle.
        self.stalled: set[int] = set()
        #: Subscriptions that found no room (the output or the Receive
        #: Maximum), by handle: pumped again once there is.
        self.want_room: set[int] = set()
        #: Deliveries in flight: packet id -> ((filter, topic, log offset), QoS).
        self.sent_as: dict[int, tuple[tuple[str, str, int], int]] = {}
        #: A resumed session's deliveries to send again with their packet ids:
        #: (filter, topic, log offset) -> (packet id, QoS).
        self.resend: dict[tuple[str, str, int], tuple[int, int]] = {}
        #: Told a QoS 2 delivery's state: (filter, topic, offset, 2) in
        #: flight, ``[]`` released (PUBREC), None done (a persistent session
        #: keeps it in the journal).
        self.outbound_changed: Callable[[int, list[object] | None], None] = _nothing
        #: Retained messages to send first: (subscription, topic, QoS, tail).
        self.retained: deque[tuple[FilterState, str, int, bytes]] = deque()
        #: The reader's wait for the connection's account, while it waits.
        self.funds_scope: trio.CancelScope | None = None
        self.closed = False
        self._pumping = False

    # ---------------------------------------------------------------- as a subscriber

    @property
    def open(self) -> bool:
        return not self.closed

    def room(self, subscription: Subscription) -> int:
        """The bytes it may queue now (0: none): ``max_unsent`` less what
        waits to be written; none at QoS 1 while the client's Receive
        Maximum is used up."""
        if self.closed:
            return 0
        handle = subscription.handle
        state = self.filter_of.get(handle)
        if state is None:
            return 0
        room = self.max_unsent - self.unsent
        quota = self.protocol.send_quota or self.resend
        if room <= 0 or self.retained or (state.qos and not quota):
            self.want_room.add(handle)
            return 0
        return room

    def has_room(self, subscription: Subscription, size: int) -> bool:
        return self.room(subscription) > 0

    def send_deliveries(self, subscription: Subscription, tails: list[bytes]) -> int | None:
        """PUBLISH ``tails`` (numbered from the subscription's ``next_seq``)
        as far as there is room; how many went, or None if the
        subscription is gone (unsubscribed)."""
        handle = subscription.handle
        topic = self.topic_names.get(handle)
        if topic is None:
            return None
        if self.closed:
            return 0
        first = subscription.next_seq
        count = self._publish(handle, topic, first, first, tails)
        subscription.next_seq += count
        subscription.delivered += count
        return count

    def send_timed(
        self, subscription: Subscription, tails: list[bytes], times: list[int]
    ) -> int | None:
        """(MQTT subscriptions ask for no timestamps: as :meth:`send_deliveries`.)"""
        return self.send_deliveries(subscription, tails)

    def send_matched(
        self, subscription: Subscription, tails: list[bytes], match: int, first: int
    ) -> int | None:
        """A pattern subscription's deliveries of the topic matched as ``match``."""
        handle = subscription.handle
        topics = self.matches.get(handle)
        if topics is None:
            return None
        topic = topics.get(match)
        if topic is None or self.closed:
            return 0
        count = self._publish(handle, topic, subscription.next_seq, first, tails)
        subscription.next_seq += count
        subscription.delivered += count
        return count

    def send_group(
        self,
        subscription: Subscription,
        first_seq: int,
        tails: list[bytes],
        offsets: list[int],
        delivered: list[int],
    ) -> int | None:
        """A shared subscription's deliveries (its group's records, numbered
        from ``first_seq``), as far as there is room; how many went, or
        None if the subscription is gone."""
        handle = subscription.handle
        topic = self.topic_names.get(handle)
        if topic is None:
            return None
        if self.closed:
            return 0
        return self._publish(handle, topic, first_seq, offsets[0], tails, group=True)

    def matched(self, subscription: Subscription, match: int, topic: str | None) -> bool:
        """A pattern subscription names the topic of a match (None: it is gone)."""
        topics = self.matches.get(subscription.handle)
        if topics is None or self.closed:
            return False
        if topic is None:
            topics.pop(match, None)
        else:
            topics[match] = mqtt_topic_name(topic)
        return True

    def matched_gap(self, subscription: Subscription, match: int, first: int, count: int) -> bool:
        """Records of a matched topic were dropped (MQTT cannot say so)."""
        return not self.closed and subscription.handle in self.matches

    def gap(self, subscription: Subscription, first_seq: int, count: int) -> bool:
        """Deliveries were dropped (MQTT cannot say so: counted by the queue)."""
        return not self.closed and subscription.handle in self.filter_of

    def deliver(self, subscription: Subscription, loans: list[LoanedItem[bytes]]) -> int:
        """:meth:`send_deliveries` whose loans are repaid once written."""
        count = self.send_deliveries(subscription, [loan.item for loan in loans])
        if count is None:
            for loan in loans:
                loan.repay()
            return len(loans)
        if count:
            self.writing.extend(loans[:count])
        return count

    def written_later(self, loan: LoanedItem[Any]) -> None:
        """Repay ``loan`` once what is queued now is written."""
        self.writing.append(loan)

    def subscription_stalled(self, subscription: Subscription) -> None:
        """It waits for room that only this client's reading (PUBACKs) or
        the writer frees: the reader must not stop on debt meanwhile."""
        self.stalled.add(subscription.handle)
        if self.funds_scope is not None:
            self.funds_scope.cancel()

    def waits_for_client(self) -> bool:
        """Whether a subscription waits for what only this client clears
        (it holds deliveries not acknowledged, or queued for room)."""
        if self.stalled:
            subscriptions = self.subscriptions
            self.stalled = {
                handle
                for handle in self.stalled
                if (sub := subscriptions.get(handle)) is not None and (sub.queued or sub.unacked)
            }
        return bool(self.stalled)

    # ---------------------------------------------------------------- sending

    def _publish(
        self,
        handle: int,
        topic: str,
        first: int,
        offset: int,
        tails: list[bytes],
        *,
        group: bool = False,
    ) -> int:
        """Queue PUBLISHes of ``tails`` (numbers from ``first``, topic log
        offsets from ``offset``) while there is room; how many were taken
        (a delivery too large for the client is taken and dropped, as MQTT
        says). A delivery a resumed session had in flight goes with its
        packet id again, DUP set. ``group``: a group member's deliveries
        (their numbers are settled, not acknowledged; a session keeps none
        of them)."""
        state = self.filter_of[handle]
        taken = 0
        if not group and not self.resend and state.identifier is None and not state.no_local:
            taken, stopped = self._publish_plain(handle, state, topic, first, offset, tails)
            if stopped or taken == len(tails):
                return taken
        protocol = self.protocol
        version = protocol.version or 4
        qos = state.qos
        counters = self.counters
        resend = None if group else self.resend
        now = wall_ms()
        for tail in tails[taken:] if taken else tails:
            key = (state.topic_filter, topic, offset + taken)
            again = resend.pop(key, None) if resend else None
            if again is None and resend:
                self._forget_passed(key)
            message = delivered(bytes(tail), version, now)
            if message.expired or (state.no_local and message.origin == self.client_id):
                # Not delivered: taken, and acknowledged (settled) at once.
                counters.deliveries_expired += message.expired
                if again is not None:
                    protocol.forget_outbound(again[0])
                    self.outbound_changed(again[0], None)
                self._skipped(handle, first + taken, group)
                taken += 1
                continue
            if (
                self.unsent >= self.max_unsent
                or self.retained
                or (qos and again is None and not protocol.send_quota)
            ):
                if again is not None and resend is not None:
                    resend[key] = again
                self.want_room.add(handle)  # (pumped again once there is room)
                break
            payload, properties, retained = message.payload, message.properties, message.retained
            if state.identifier is not None:
                properties = replace(properties, subscription_identifiers=(state.identifier,))
            retain = retained and state.retain_as_published
            before = protocol.bytes_to_send
            # (MQTT: at the QoS published or the subscription's, the lower.)
            sent_qos = min(qos, message.qos) if again is None else again[1]
            try:
                packet_id = protocol.publish(
                    topic,
                    payload,
                    sent_qos,
                    retain=retain,
                    properties=properties,
                    packet_id=None if again is None else again[0],
                )
            except PacketTooLargeForPeer:
                counters.deliveries_too_large += 1
                packet_id = None
                if again is not None:
                    protocol.forget_outbound(again[0])
            except MQTTUsageError:
                break  # (closed meanwhile)
            number = first + taken
            taken += 1
            if group:
                if packet_id is not None:
                    self.in_flight[packet_id] = (handle, number)
                else:  # (QoS 0, or dropped as too large: settled at once)
                    self._settle.setdefault(handle, []).append(number)
            elif packet_id is not None:
                self.in_flight[packet_id] = (handle, number)
                self.sent_as[packet_id] = (key, sent_qos)
                if sent_qos == 2:
                    self.outbound_changed(packet_id, [*key, 2])
                sent = self._sent.get(handle)
                if sent is None:
                    sent = self._sent[handle] = _Sent()
                sent.numbers.append(number)
            else:
                self._skipped(handle, number, False)  # (QoS 0, too large: none to wait for)
            size = protocol.bytes_to_send - before
            self.unsent += size
            counters.messages_out += 1
            counters.bytes_out += size
        if taken:
            self._wake()
        return taken

    def _publish_plain(
        self,
        handle: int,
        state: FilterState,
        topic: str,
        first: int,
        offset: int,
        tails: list[bytes],
    ) -> tuple[int, bool]:
        """:meth:`_publish` of the usual deliveries (tails of
        :func:`plain_delivery`, on a subscription with no identifier and
        no No Local, nothing to resend), the cheaper way: how many were
        taken, and whether it stopped for lack of room (else at the first
        delivery of another kind, which :meth:`_publish` then takes on)."""
        protocol = self.protocol
        qos = state.qos
        max_unsent = self.max_unsent - self.unsent
        start = protocol.bytes_to_send
        quota = protocol.send_quota
        in_flight = self.in_flight
        sent_as = self.sent_as
        topic_filter = state.topic_filter
        sent: _Sent | None = None
        taken = 0
        stopped = False
        for tail in tails:
            plain = plain_delivery(tail)
            if plain is None:
                break
            if protocol.bytes_to_send - start >= max_unsent or self.retained or (qos and not quota):
                self.want_room.add(handle)  # (pumped again once there is room)
                stopped = True
                break
            payload, published = plain
            sent_qos = qos if qos < published else published
            try:
                packet_id = protocol.publish(topic, payload, sent_qos)
            except MQTTUsageError:  # (too large for the client, or closed: as _publish says)
                break
            number = first + taken
            if packet_id is not None:
                quota -= 1
                in_flight[packet_id] = (handle, number)
                sent_as[packet_id] = ((topic_filter, topic, offset + taken), sent_qos)
                if sent_qos == 2:
                    self.outbound_changed(packet_id, [topic_filter, topic, offset + taken, 2])
                if sent is None:
                    sent = self._sent.get(handle)
                    if sent is None:
                        sent = self._sent[handle] = _Sent()
                sent.numbers.append(number)
            else:
                self._skipped(handle, number, False)  # (QoS 0: none to wait for)
            taken += 1
        if taken:
            size = protocol.bytes_to_send - start
            self.unsent += size
            counters = self.counters
            counters.messages_out += taken
            counters.bytes_out += size
            self._wake()
        return taken, stopped

    def _skipped(self, handle: int, number: int, group: bool) -> None:
        """Delivery ``number`` of ``handle`` is not made (expired, or the
        client's own on a No Local subscription): done with at once."""
        if group:
            self._settle.setdefault(handle, []).append(number)
        elif self.filter_of[handle].qos:
            sent = self._sent.get(handle)
            if sent is None:
                sent = self._sent[handle] = _Sent()
            sent.numbers.append(number)
            self._acked(handle, number)

    def queue_retained(self, state: FilterState, messages: list[tuple[str, int, bytes]]) -> None:
        """Send ``messages`` (a new subscription's retained ones: topic,
        QoS, tail) first, at most at the subscription's QoS."""
        for topic, qos, tail in messages:
            self.retained.append((state, topic, min(qos, state.qos), tail))

    def send_retained(self) -> None:
        """Send the queued retained messages as far as there is room (a
        subscription gone meanwhile has its dropped)."""
        queue = self.retained
        protocol = self.protocol
        version = protocol.version or 4
        counters = self.counters
        sent = False
        while queue and not self.closed:
            state, topic, qos, tail = queue[0]
            if self.filters.get(state.topic_filter) is not state:
                queue.popleft()
                continue
            if self.unsent >= self.max_unsent or (qos and not protocol.send_quota):
                break
            queue.popleft()
            payload, properties, _, _, gone, _ = delivered(tail, version, wall_ms())
            if gone:
                counters.deliveries_expired += 1
                continue
            if state.identifier is not None:
                properties = replace(properties, subscription_identifiers=(state.identifier,))
            before = protocol.bytes_to_send
            try:
                packet_id = protocol.publish(
                    topic, payload, qos, retain=True, properties=properties
                )
            except PacketTooLargeForPeer:
                counters.deliveries_too_large += 1
                continue
            except MQTTUsageError:
                break  # (closed meanwhile)
            if packet_id is not None:
                self.in_flight[packet_id] = (RETAINED_HANDLE, 0)
            size = protocol.bytes_to_send - before
            self.unsent += size
            counters.messages_out += 1
            counters.bytes_out += size
            sent = True
        if sent:
            self._wake()

    def puback(self, packet_id: int) -> None:
        """The client acknowledged QoS 1 delivery ``packet_id``: its
        subscription is acknowledged up to the oldest number still in flight."""
        found = self.in_flight.pop(packet_id, None)
        self.sent_as.pop(packet_id, None)
        if found is not None:
            self._acked(*found)

    def pubrec(self, packet_id: int, refused: bool) -> None:
        """The client received QoS 2 delivery ``packet_id`` (or, ``refused``,
        ended its flow): the message is its own now, so its subscription is
        acknowledged as by a PUBACK; PUBREL goes out (PUBCOMP ends it)."""
        self.puback(packet_id)
        if refused:
            self.outbound_changed(packet_id, None)
            return
        self.outbound_changed(packet_id, [])
        self.protocol.pubrel(packet_id)

    def pubcomp(self, packet_id: int) -> None:
        """PUBCOMP: the QoS 2 delivery's packet id is free again."""
        self.outbound_changed(packet_id, None)

    def resume(
        self,
        outbound: dict[int, tuple[tuple[str, str, int], int]],
        released: frozenset[int],
    ) -> None:
        """A resumed session's deliveries in flight (packet id -> (filter,
        topic, log offset), QoS): sent again with their packet ids when their
        subscriptions read them again; those of no subscription are given
        up. Its released QoS 2 packet ids get their PUBREL again."""
        protocol = self.protocol
        for packet_id, (key, qos) in outbound.items():
            if key[0] in self.filters:
                self.resend[key] = (packet_id, qos)
            else:
                protocol.forget_outbound(packet_id)
                self.outbound_changed(packet_id, None)
        for packet_id in sorted(released):
            protocol.pubrel(packet_id)

    def _forget_passed(self, key: tuple[str, str, int]) -> None:
        """A subscription reads past resends it had (their records were
        deleted meanwhile): they are given up."""
        for passed in [k for k in self.resend if k[:2] == key[:2] and k[2] < key[2]]:
            packet_id, _ = self.resend.pop(passed)
            self.protocol.forget_outbound(packet_id)
            self.outbound_changed(packet_id, None)

    def outbound(self) -> dict[int, tuple[tuple[str, str, int], int]]:
        """The deliveries in flight and those still to resend: packet id ->
        (filter, topic, log offset), QoS (what a kept session keeps)."""
        found = dict(self.sent_as)
        for key, (packet_id, qos) in self.resend.items():
            found[packet_id] = (key, qos)
        return found

    def _acked(self, handle: int, number: int) -> None:
        sent = self._sent.get(handle)
        if sent is None:
            subscription = self.subscriptions.get(handle)
            if subscription is not None and subscription.group_member:
                self._settle.setdefault(handle, []).append(number)
            return
        numbers = sent.numbers
        if numbers and numbers[0] == number and not sent.acked:
            numbers.popleft()  # (the usual case: acknowledged in order)
            self._ack_upto[handle] = number
            return
        sent.acked.add(number)
        upto = 0
        while numbers and numbers[0] in sent.acked:
            upto = numbers.popleft()
            sent.acked.discard(upto)
        if upto:
            self._ack_upto[handle] = upto  # (applied by :meth:`apply_acks`)

    def apply_acks(self) -> None:
        """Acknowledge each subscription up to what its PUBACKs of the read
        cover: once per read (a durable cursor writes its position once)."""
        if self._settle:
            self._apply_settles()
        acks = self._ack_upto
        if acks:
            self._ack_upto = {}
            subscriptions = self.subscriptions
            for handle, upto in acks.items():
                subscription = subscriptions.get(handle)
                if subscription is not None:
                    subscription.ack(upto)

    def _apply_settles(self) -> None:
        """Settle done what group members' clients acknowledged (or were
        sent, at QoS 0): each member once, its numbers as ranges."""
        settles, self._settle = self._settle, {}
        subscriptions = self.subscriptions
        for handle, numbers in settles.items():
            subscription = subscriptions.get(handle)
            if not isinstance(subscription, GroupSubscription):
                continue  # (gone: what it held went back to its group)
            ranges: list[tuple[int, int]] = []
            for number in sorted(numbers):
                if ranges and ranges[-1][0] + ranges[-1][1] == number:
                    ranges[-1] = (ranges[-1][0], ranges[-1][1] + 1)
                else:
                    ranges.append((number, 1))
            subscription.settle(ranges, Outcome.DONE, None)

    def pump_stalled(self) -> None:
        """Room opened (PUBACKs, or the writer wrote): the subscriptions
        that waited for it send on, in turn."""
        if self._pumping or self.closed or not (self.stalled or self.want_room or self.retained):
            return
        self._pumping = True
        try:
            if self.retained:
                self.send_retained()
                if self.retained:
                    return
            waiting = self.want_room | self.stalled
            self.want_room = set()
            for handle in waiting:
                if self.unsent >= self.max_unsent:
                    self.want_room.add(handle)
                    continue
                subscription = self.subscriptions.get(handle)
                if subscription is None:
                    continue
                subscription.pump()
                if isinstance(subscription, PatternSubscription):
                    # (Its lossy members wait in their own queues, unmarked.)
                    for member in list(subscription.members.values()):
                        if member.queued and not member.reads_log:
                            member.pump()
        finally:
            self._pumping = False

    def take_written(self) -> list[LoanedItem[Any]]:
        """The writer takes what is queued: the loans it repays once written."""
        loans = self.writing
        self.writing = []
        self.unsent = 0
        return loans

    # ---------------------------------------------------------------- subscriptions

    def add(
        self, state: FilterState, handle: int, subscription: Subscription, topic: str | None
    ) -> None:
        """Serve broker subscription ``subscription`` under ``handle`` for
        MQTT subscription ``state``: a topic's (its MQTT name ``topic``), or
        a pattern's (``topic`` None)."""
        self.subscriptions[handle] = subscription
        self.filter_of[handle] = state
        if topic is not None:
            self.topic_names[handle] = topic
        else:
            self.matches[handle] = {}
        state.handles.append(handle)

    def drop_filter(self, topic_filter: str) -> bool:
        """Unsubscribe MQTT subscription ``topic_filter``: its broker
        subscriptions leave their topics, repaid; whether there was one."""
        state = self.filters.pop(topic_filter, None)
        if state is None:
            return False
        for handle in state.handles:
            self._drop(handle)
        return True

    def _drop(self, handle: int) -> None:
        subscription = self.subscriptions.pop(handle, None)
        self.filter_of.pop(handle, None)
        self.topic_names.pop(handle, None)
        self.matches.pop(handle, None)
        self._sent.pop(handle, None)
        self._ack_upto.pop(handle, None)
        self._settle.pop(handle, None)
        self.stalled.discard(handle)
        self.want_room.discard(handle)
        if subscription is not None:
            subscription.close()

    def end(self, handle: int) -> None:
        """A subscription's topic was deleted: it ends (the MQTT
        subscription goes on with its other handles, if any)."""
        state = self.filter_of.get(handle)
        self._drop(handle)
        if state is not None and handle in state.handles:
            state.handles.remove(handle)

    def close_all(self) -> None:
        """The connection is done: every subscription leaves its topic,
        and what was never written is repaid."""
        self.closed = True
        for handle in list(self.subscriptions):
            self._drop(handle)
        self.filters.clear()
        self.in_flight.clear()
        self.sent_as.clear()
        self.resend.clear()
        self.retained.clear()
        for loan in self.writing:
            loan.repay()
        self.writing = []
