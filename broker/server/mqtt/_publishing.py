"""An MQTT connection's publishes: forwarded to their topics, charged to the
connection's account as a native publish channel's are, and acknowledged
(QoS 1 PUBACK, QoS 2 PUBREC) only once routed: where a native ``Confirm``
would say they are (with topic logs: appended and written to the log, or
fsynced with ``flush = "always"``).

The publishes of one read go to each topic as one batch (one actor message
and one loan, like ``connection/_publishing.py``'s); a topic routes its
batches in order, and the acknowledgements go out in the order the
publishes came, whichever topic routes first.

A batch with QoS 2 publishes tells :attr:`MQTTPublishing.qos2_placed`,
before its topic appends it to its log, where each of them goes (a
persistent session writes that to the state journal: see ``_sessions``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from accounts import Account
from broker.config import BrokerConfig

from .._services import Lifecycle, TopicDirectory
from ..topics._topic import DELIVER_HEAD_ESTIMATE, Routed, Topic

__all__ = ["MAX_BOUND_TOPICS", "Acknowledge", "MQTTPublishing", "Pending"]

#: Topics one connection keeps bound with nothing on its way to them: more
#: are let go once idle (a client may publish to any number of topics).
MAX_BOUND_TOPICS = 256

#: Told the publishes routed (each's ``packet_id`` and ``qos``), in the
#: order received.
Acknowledge = Callable[[list["Pending"]], None]
#: Told, before a batch is appended to its topic's log, the topic and the
#: ``(packet id, log offset)`` of each QoS 2 publish of it; may raise
#: :class:`~broker.log.LogError` (the batch then waits, and is tried again).
Qos2Placed = Callable[[str, list[tuple[int, int]]], None]


class Pending:
    """A QoS 1 or 2 publish on its way to its topic (``index``: in its batch)."""

    __slots__ = ("index", "packet_id", "qos", "routed")

    def __init__(self, packet_id: int, qos: int, index: int) -> None:
        self.packet_id = packet_id
        self.qos = qos
        self.index = index
        self.routed = False


@dataclass(slots=True, eq=False)
class _Binding:
    """The connection's publishing to one topic (it keeps the topic alive)."""

    index: int
    topic: Topic
    #: This read's publishes to it: tails, keys, their bytes, and the
    #: acknowledgements they wait for.
    tails: list[bytes] = field(default_factory=list)
    keys: list[bytes | None] = field(default_factory=list)
    size: int = 0
    acks: list[Pending] = field(default_factory=list)
    #: Batches forwarded and not routed yet, oldest first: their
    #: acknowledgements and the fan-out estimated for them.
    unrouted: deque[tuple[list[Pending], int]] = field(default_factory=deque)


class MQTTPublishing:
    """One MQTT connection's publishing (a :class:`~..topics._topic.RouteOrigin`).

    :meth:`add` takes a publish of the read being handled; :meth:`flush`
    forwards the read's publishes, a batch per topic, charged to
    :attr:`account` (the connection's: its reader stops while it is in
    debt); ``acknowledge`` is called for each QoS 1 and 2 publish once its
    topic routed it, in the order they were received.
    """

    def __init__(
        self,
        config: BrokerConfig,
        life: Lifecycle,
        topics: TopicDirectory,
        account: Account,
        acknowledge: Acknowledge,
    ) -> None:
        self.config = config
        self.life = life
        self.topics = topics
        self.account = account
        self._acknowledge = acknowledge
        self._bindings: dict[str, _Binding] = {}
        self._by_index: dict[int, _Binding] = {}
        self._next_index = 1
        #: This read's bindings with publishes to forward.
        self._touched: list[_Binding] = []
        #: Every QoS 1 and 2 publish not acknowledged yet, in arrival order.
        self._order: deque[Pending] = deque()
        self.messages_in = 0
        self.bytes_in = 0
        #: Told where QoS 2 publishes go in the logs (None: nobody asks).
        self.qos2_placed: Qos2Placed | None = None

    @property
    def unacknowledged(self) -> int:
        """QoS 1 and 2 publishes received and not routed yet."""
        return len(self._order)

    def pending_qos2(self) -> frozenset[int]:
        """The packet ids of QoS 2 publishes received and not acknowledged
        yet (forwarded all the same if the connection ends: a session that
        goes on counts them as received, so that a resend is not routed twice)."""
        return frozenset(p.packet_id for p in self._order if p.qos == 2)

    def add(
        self, topic_name: str, tail: bytes, key: bytes | None, packet_id: int | None, qos: int
    ) -> None:
        """A publish of the read being handled (forwarded by :meth:`flush`)."""
        binding = self._bindings.get(topic_name)
        if binding is None:
            topic = self.topics.topic(topic_name)
            topic.publishers += 1
            topic.publishing += 1
            binding = _Binding(self._next_index, topic)
            self._next_index += 1
            self._bindings[topic_name] = binding
            self._by_index[binding.index] = binding
        if not binding.tails:
            self._touched.append(binding)
        index = len(binding.tails)
        binding.tails.append(tail)
        binding.keys.append(key)
        binding.size += len(tail)
        if packet_id is not None:
            pending = Pending(packet_id, qos, index)
            binding.acks.append(pending)
            self._order.append(pending)
        self.messages_in += 1
        self.bytes_in += len(tail)

    def flush(self) -> None:
        """Forward this read's publishes: one batch per topic, in order,
        each one loan on the connection's account (what routing it will
        charge estimated, as a publish channel's)."""
        touched = self._touched
        if not touched:
            return
        self._touched = []
        account = self.account
        per_delivery = DELIVER_HEAD_ESTIMATE + account.event_cost
        for binding in touched:
            tails, keys, size, acks = binding.tails, binding.keys, binding.size, binding.acks
            binding.tails, binding.keys, binding.size, binding.acks = [], [], 0, []
            topic = binding.topic
            fan_out = topic.charging * (size + per_delivery * len(tails))
            binding.unrouted.append((acks, fan_out))
            routed = Routed(tails, self, binding.index, fan_out, keys)
            placed = self.qos2_placed
            if placed is not None:
                qos2 = [(p.packet_id, p.index) for p in acks if p.qos == 2]
                if qos2:
                    routed.before_append = _placing(placed, topic.topic_name, qos2)
            topic.send_nowait(routed, account=account, cost=size)

    def routed(self, routed: Routed) -> None:
        """A topic routed a batch of ours: its publishes are acknowledged,
        in arrival order (those behind a publish not routed yet wait for it)."""
        binding = self._by_index.get(routed.handle)
        if binding is None or not binding.unrouted:
            return
        acks, _ = binding.unrouted.popleft()
        for pending in acks:
            pending.routed = True
        order = self._order
        done: list[Pending] = []
        while order and order[0].routed:
            done.append(order.popleft())
        if done:
            self._acknowledge(done)
        if len(self._bindings) > MAX_BOUND_TOPICS and not binding.unrouted and not binding.tails:
            self._unbind(binding)

    def _unbind(self, binding: _Binding) -> None:
        topic = binding.topic
        del self._bindings[topic.topic_name]
        del self._by_index[binding.index]
        topic.publishers -= 1
        topic.publishing -= 1
        topic.release_if_unused()

    def close(self) -> None:
        """The connection ends: what it received is forwarded all the same
        (unless the broker shuts down), never acknowledged; its topics are
        let go."""
        if not self.life.closing:
            self.flush()
        self._touched = []
        self._order.clear()
        for binding in list(self._bindings.values()):
            self._unbind(binding)
        self._acknowledge = _nobody


def _placing(placed: Qos2Placed, topic: str, qos2: list[tuple[int, int]]) -> Callable[[int], None]:
    """A batch's ``before_append``: tells ``placed`` where its QoS 2
    publishes (packet id, index in the batch) go from ``offset`` on."""

    def before_append(offset: int) -> None:
        placed(topic, [(packet_id, offset + index) for packet_id, index in qos2])

    return before_append


def _nobody(routed: list[Pending]) -> None:
    """Acknowledgements after the connection closed go nowhere."""
