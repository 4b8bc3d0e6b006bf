"""SUBSCRIBE and UNSUBSCRIBE of an MQTT connection: each topic filter made
into the broker's subscriptions (see ``broker.mqtt``'s ``broker_topic_filter``:
a filter is one or two broker topics or patterns), each answered with its
reason code.

- A filter without wildcards subscribes to its topic; ``+`` and ``#`` make
  pattern subscriptions (every matching topic, now and later); ``a/#`` is
  the topic ``a`` and the pattern ``a.>``.
- The granted QoS is the one asked: QoS 1 and 2 are ``reliable``
  subscriptions, QoS 0 a ``lossy`` one (see ``_delivery``).
- A subscription starts at the end of each topic (what is published from
  now on), as MQTT's do; a persistent session's QoS 1 or 2 subscription reads
  through a durable cursor of its own (see ``_sessions``), from where it
  was acknowledged.
- A filter subscribed again replaces its subscription.
- The retained messages its filter matches (and the principal may read)
  are sent first, with the retain flag, as 5.0's Retain Handling says (0:
  at every SUBSCRIBE; 1: if the subscription is new; 2: never; 3.1.1: at
  every SUBSCRIBE); a resumed session's subscriptions get none.
- ``$share/GROUP/TOPIC`` (a topic filter without wildcards) is a member of
  the topic's consumer group named GROUP, the principal's, as a native
  ``Subscribe`` with ``"group": GROUP`` is (see ``_delivery``): granted at
  most QoS 1 (a group delivers at least once: a record its member did not
  settle goes to another), with no retained messages and no durable
  cursor (the group keeps its position). 0x9E (Shared Subscriptions not
  supported) for a filter with wildcards (a group is one topic's) and on a
  broker without topic logs (no groups); 0x8F for a GROUP the broker's
  group names refuse.
- With auth, a topic the principal may not subscribe to is refused (0x87);
  a pattern only matches the topics it may.
"""

from __future__ import annotations

from collections.abc import Callable

from broker.mqtt import (
    ReasonCode,
    SharedSubscription,
    Subscribe,
    Subscription,
    TopicError,
    Unsubscribe,
    broker_topic_filter,
    broker_topic_name,
    mqtt_topic_name,
    parse_shared,
)
from broker.protocol import DeliveryMode, TopicPattern, is_topic_pattern, topic_name_problem

from .._peer_logging import shown
from .._services import Storage, TopicDirectory
from ..topics._subscribe import OptionError, make_pattern_subscription, make_subscription
from ._delivery import FilterState, MQTTDeliveries
from ._messages import wall_ms
from ._retained import RetainedStore
from ._sessions import Filters, MQTTSessions, cursor_name

__all__ = ["MAX_GRANTED_QOS", "MAX_SHARED_QOS", "MQTTSubscribing"]

#: The highest QoS a subscription is granted.
MAX_GRANTED_QOS = 2
#: The highest QoS a shared subscription is granted: its group delivers at
#: least once (a record a member did not settle goes to another member).
MAX_SHARED_QOS = 1
#: What starts a shared subscription's filter.
SHARE_PREFIX = "$share/"

R = ReasonCode


class MQTTSubscribing:
    """Makes and ends one MQTT connection's subscriptions (see the module)."""

    def __init__(
        self,
        topics: TopicDirectory,
        storage: Storage,
        deliveries: MQTTDeliveries,
        *,
        max_subscriptions: int,
    ) -> None:
        self.topics = topics
        self.storage = storage
        self.deliveries = deliveries
        self.max_subscriptions = max_subscriptions
        #: Whether the client's principal may subscribe to a broker topic.
        self.may_subscribe: Callable[[str], bool] = _anything
        #: The principal's name (None without auth): its durable cursors' namespace.
        self.principal: str | None = None
        #: A persistent session's client id: its QoS 1 subscriptions read
        #: through durable cursors (None: a clean session, none).
        self.session_client: str | None = None
        #: Where the cursors of persistent sessions are kept.
        self.sessions: MQTTSessions | None = None
        #: The retained messages new subscriptions get first (None: none).
        self.retained: RetainedStore | None = None
        #: Why the last subscription was refused by the broker (for the log).
        self.problem = ""
        #: What starts the subscriptions made, once their SUBACK is queued.
        self._starts: list[tuple[int, Callable[[], None]]] = []
        self._next_handle = 1

    def start(self) -> None:
        """Start sending on the subscriptions made since the last call (after
        their SUBACK: MQTT lets PUBLISHes come first, clients prefer not)."""
        self.deliveries.send_retained()  # (first: the retained messages)
        starts, self._starts = self._starts, []
        subscriptions = self.deliveries.subscriptions
        for handle, start in starts:
            if handle in subscriptions:  # (not replaced meanwhile)
                start()

    @property
    def shares(self) -> bool:
        """Whether shared subscriptions are available (the broker has groups)."""
        return self.storage.groups is not None

    def subscribe(self, event: Subscribe) -> list[ReasonCode]:
        """Make each subscription of ``event``; the SUBACK's reason codes
        (:meth:`start` starts them)."""
        identifiers = event.properties.subscription_identifiers
        identifier = identifiers[0] if identifiers else None
        reasons = []
        for subscription in event.subscriptions:
            existed = subscription.topic_filter in self.deliveries.filters
            reason = self._subscribe(subscription, identifier)
            reasons.append(reason)
            handling = subscription.retain_handling
            shared = subscription.topic_filter.startswith(SHARE_PREFIX)
            if (
                not reason.is_error
                and not shared
                and (handling == 0 or (handling == 1 and not existed))
            ):
                self._queue_retained(subscription.topic_filter)
        return reasons

    def restore(self, filters: Filters) -> None:
        """Subscribe again to a resumed session's filters (each goes on from
        its cursors once :meth:`start` starts them)."""
        for topic_filter, (qos, identifier, as_published, no_local, since) in filters.items():
            subscription = Subscription(topic_filter, qos, no_local, as_published)
            self._subscribe(subscription, identifier, since)

    def _queue_retained(self, topic_filter: str) -> None:
        """The retained messages ``topic_filter`` matches go first."""
        store = self.retained
        state = self.deliveries.filters.get(topic_filter)
        if store is None or state is None or not len(store):
            return
        may_subscribe = self.may_subscribe

        def may_read(topic: str) -> bool:
            try:
                return may_subscribe(broker_topic_name(topic))
            except TopicError:  # pragma: no cover - a stored topic is valid
                return False

        self.deliveries.queue_retained(state, store.matching(topic_filter, may_read))

    def _cursor(self, topic_filter: str, granted: int) -> str | None:
        """The durable cursor of ``topic_filter``'s subscription (None: none:
        a clean session, or QoS 0); a QoS 0 subscription lets go of any."""
        client = self.session_client
        if client is None:
            return None
        name = cursor_name(client, topic_filter)
        if not granted:
            if self.sessions is not None:
                self.sessions.forget_cursors(name)
            return None
        return name

    def _subscribe(
        self, subscription: Subscription, identifier: int | None, since: int | None = None
    ) -> ReasonCode:
        """Make one subscription; ``since``: a resumed session's, when it
        was first subscribed (None: now)."""
        topic_filter, qos = subscription.topic_filter, subscription.qos
        deliveries = self.deliveries
        try:
            share = parse_shared(topic_filter)
            if share is not None:
                return self._subscribe_shared(subscription, share, identifier)
            mapped = broker_topic_filter(topic_filter)
        except TopicError as error:
            return error.reason
        replaced = deliveries.filters.get(topic_filter)
        if since is None and replaced is not None:
            since = replaced.since  # (subscribed again: its topics start as before)
        deliveries.drop_filter(topic_filter)  # (subscribed again: replaced)
        if len(deliveries.subscriptions) + len(mapped.topics) > self.max_subscriptions:
            return R.QUOTA_EXCEEDED
        names = [name for name in mapped.topics if not is_topic_pattern(name)]
        if not all(self.may_subscribe(name) for name in names):
            return R.NOT_AUTHORIZED
        granted = min(qos, MAX_GRANTED_QOS)
        mode = DeliveryMode.RELIABLE if granted else DeliveryMode.LOSSY
        cursor = self._cursor(topic_filter, granted)
        options: dict[str, object] = {} if cursor is None else {"cursor": cursor}
        if self.session_client is not None and since is None:
            since = wall_ms()
        if cursor is not None and since is not None:
            # A wildcard's topics are matched after the SUBACK (those on
            # disk, in the background), or not before the client comes
            # back (those made while it is away): each starts where the
            # subscription did, not at its end when matched.
            options["from_time"] = since
        state = FilterState(
            topic_filter,
            granted,
            identifier,
            retain_as_published=subscription.retain_as_published,
            no_local=subscription.no_local,
            since=since,
        )
        deliveries.filters[topic_filter] = state
        try:
            self._make(state, mapped.topics, mapped.skip_dollar, mode, options)
        except OptionError as error:  # (a bug of ours: the options are the broker's)
            deliveries.drop_filter(topic_filter)
            self.problem = f"SUBSCRIBE {shown(topic_filter)}: {error}"
            return R.IMPLEMENTATION_SPECIFIC_ERROR
        return R(granted)

    def _subscribe_shared(
        self, subscription: Subscription, share: SharedSubscription, identifier: int | None
    ) -> ReasonCode:
        """``$share/GROUP/TOPIC``: a member of ``TOPIC``'s group ``GROUP``."""
        topic_filter = subscription.topic_filter
        groups = self.storage.groups
        if groups is None or _has_wildcard(share.topic_filter):
            return R.SHARED_SUBSCRIPTIONS_NOT_SUPPORTED
        if topic_name_problem(share.group) is not None:
            return R.TOPIC_FILTER_INVALID
        (name,) = broker_topic_filter(share.topic_filter).topics  # (TopicError: 0x8F)
        deliveries = self.deliveries
        deliveries.drop_filter(topic_filter)  # (subscribed again: replaced)
        if len(deliveries.subscriptions) + 1 > self.max_subscriptions:
            return R.QUOTA_EXCEEDED
        if not self.may_subscribe(name):
            return R.NOT_AUTHORIZED
        granted = min(subscription.qos, MAX_SHARED_QOS)
        state = FilterState(
            topic_filter,
            granted,
            identifier,
            retain_as_published=subscription.retain_as_published,
            shared=True,
        )
        deliveries.filters[topic_filter] = state
        handle = self._next_handle
        self._next_handle += 1
        topic = self.topics.topic(name)
        try:
            member = make_subscription(
                deliveries,
                handle,
                topic,
                DeliveryMode.RELIABLE,
                {"group": share.group},
                principal=self.principal,
                groups=groups,
            )
        except OptionError as error:  # (a bug of ours: the options are the broker's)
            topic.release_if_unused()
            deliveries.drop_filter(topic_filter)
            self.problem = f"SUBSCRIBE {shown(topic_filter)}: {error}"
            return R.IMPLEMENTATION_SPECIFIC_ERROR
        deliveries.add(state, handle, member, mqtt_topic_name(name))
        topic.subscribe(member)
        self._starts.append((handle, member.pump))
        return R(granted)

    def _make(
        self,
        state: FilterState,
        topics: tuple[str, ...],
        skip_dollar: bool,
        mode: str,
        options: dict[str, object],
    ) -> None:
        """The broker subscriptions of ``state``, one per topic or pattern."""
        deliveries = self.deliveries
        may_read = self.may_subscribe
        if skip_dollar:
            may_read = _skipping_dollar(may_read)
        # (A topic's cursor position is stored as it is made: from its end.)
        topic_options = {k: v for k, v in options.items() if k != "from_time"}
        for name in topics:
            handle = self._next_handle
            self._next_handle += 1
            if is_topic_pattern(name):
                pattern = make_pattern_subscription(
                    deliveries,
                    handle,
                    TopicPattern(name),
                    mode,
                    options,
                    host=self.topics,
                    cursors=self.storage.cursors,
                    principal=self.principal,
                    may_read=may_read,
                )
                deliveries.add(state, handle, pattern, None)
                self._starts.append((handle, pattern.start))
                continue
            topic = self.topics.topic(name)
            try:
                made = make_subscription(
                    deliveries,
                    handle,
                    topic,
                    mode,
                    topic_options,
                    cursors=self.storage.cursors,
                    principal=self.principal,
                    groups=self.storage.groups,
                )
            except OptionError:
                topic.release_if_unused()
                raise
            deliveries.add(state, handle, made, mqtt_topic_name(name))
            topic.subscribe(made)
            self._starts.append((handle, made.pump))

    def unsubscribe(self, event: Unsubscribe) -> list[ReasonCode]:
        """End each subscription of ``event`` (and a persistent session's
        cursors of it); the UNSUBACK's reason codes."""
        reasons = []
        for topic_filter in event.topic_filters:
            found = self.deliveries.drop_filter(topic_filter)
            if self.session_client is not None and self.sessions is not None:
                self.sessions.forget_cursors(cursor_name(self.session_client, topic_filter))
            reasons.append(R.SUCCESS if found else R.NO_SUBSCRIPTION_EXISTED)
        return reasons


def _has_wildcard(topic_filter: str) -> bool:
    return any(level in ("+", "#") for level in topic_filter.split("/"))


def _anything(name: str) -> bool:
    return True


def _skipping_dollar(may_read: Callable[[str], bool]) -> Callable[[str], bool]:
    """``may_read`` less the topics whose names start with ``$`` (an MQTT
    filter whose first level is a wildcard does not match them)."""

    def reads(name: str) -> bool:
        return not name.startswith("$") and may_read(name)

    return reads
