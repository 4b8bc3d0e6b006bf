"""Restoring the sessions a broker recorded before it stopped (see
``_session_records``): each comes back detached, waiting for its client for
``lease`` seconds, its reliable subscriptions reading their topics' logs
from after the last offset their client processed."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from accounts import Account, LoanedItem
from broker.groups import GroupOptionError, group_request
from broker.protocol import DeliveryMode, TopicNameError, TopicPattern
from broker.protocol.connection import BrokerSessionState

from .._services import BrokerServices
from ..cluster._forward import ForwardTopic, forwarded_subscription
from ..cluster._forward_group import ForwardedGroupMember
from ..cluster._origin_dedup import SeenOrigins
from ..patterns._subscription import PatternSubscription
from ..storage._publish_marks import PublishMarks
from ..topics._groups import GroupSubscription
from ..topics._log_subscription import LogSubscription, cursor_key, start_request
from ..topics._lossy import DropCounts, OptionError
from ..topics._subscribe import make_pattern_subscription
from ..topics._topic import Subscription, Topic
from ._cluster_records import ClaimedSession
from ._records import SavedSession, SessionRecords, decode_session, load_sessions
from ._session import Session

log = logging.getLogger("broker.server")


class _NoDrops:
    """The drop counters of a subscriber that keeps no dropping queue."""

    deliveries_overflowed = 0
    deliveries_replaced = 0


_NO_DROPS = _NoDrops()


class Unattached:
    """The subscriber of a restored subscription until its client resumes:
    it can send nothing (``open`` is False); what it would send waits in the log."""

    name = "restored"

    def __init__(self, root_account: Account) -> None:
        self.root_account = root_account
        self.subscriptions: dict[int, Subscription] = {}

    @property
    def open(self) -> bool:
        return False

    def send_deliveries(self, subscription: Subscription, tails: list[bytes]) -> int | None:
        return 0

    def send_timed(
        self, subscription: Subscription, tails: list[bytes], times: list[int]
    ) -> int | None:
        return 0

    def deliver(self, subscription: Subscription, loans: list[LoanedItem[bytes]]) -> int:
        return 0

    def has_room(self, subscription: Subscription, size: int) -> bool:
        return False

    def room(self, subscription: Subscription) -> int:
        return 0

    def gap(self, subscription: Subscription, first_seq: int, count: int) -> bool:
        return False

    def subscription_stalled(self, subscription: Subscription) -> None:
        pass

    def end(self, handle: int) -> None:
        """(A restored subscription's topic deleted before its client came
        back: see ``_admin._end``, which forgets it in its session.)"""

    def written_later(self, loan: LoanedItem[Any]) -> None:
        loan.repay()

    def send_group(
        self,
        subscription: Subscription,
        first_seq: int,
        tails: list[bytes],
        offsets: list[int],
        delivered: list[int],
    ) -> int | None:
        return 0

    def send_matched(
        self, subscription: Subscription, tails: list[bytes], match: int, first: int
    ) -> int | None:
        return 0

    def matched(self, subscription: Subscription, match: int, topic: str | None) -> bool:
        return False

    def matched_gap(self, subscription: Subscription, match: int, first: int, count: int) -> bool:
        return False

    #: (A restored subscription is reliable: it keeps no dropping queue.)
    dropping_bytes = 0
    lossy_budget = 0

    @property
    def counters(self) -> DropCounts:
        return _NO_DROPS


def restore_sessions(
    services: BrokerServices,
    seen: SeenOrigins,
    records: SessionRecords,
    marks: PublishMarks | None = None,
) -> set[bytes]:
    """Bring back every recorded session, detached; returns their ids.

    A session's publish counts (``received``) are raised to what the
    staging area holds of its publishes (and, when it resumes, to what the
    logs hold: :func:`~..storage._publish_marks.held_publishes`): the client then sends again only
    what the broker does not have, and nothing is stored twice. The publish
    ``marks`` of sessions not restored here are other workers' clients'
    (forwarded): the broker's ``seen`` table takes them."""
    loaded = [] if marks is None else marks.load()
    table = services.sessions
    unattached = Unattached(services.resources.account)
    restored: set[bytes] = set()
    staged = services.commits.staging.held_origins()
    for saved in load_sessions(records):
        if saved.id in table.sessions:
            continue
        _restore(services, saved, unattached, _received(saved, staged))
        restored.add(saved.id)
    for topic, origin, handle in loaded:
        if origin not in restored:
            seen.restore(topic, origin, handle)
    if restored:
        log.info(
            "restored %d sessions: each waits %.0f s for its client", len(restored), table.linger
        )
    return restored


def _restore(
    services: BrokerServices, saved: SavedSession, unattached: Unattached, received: dict[int, int]
) -> Session:
    """Bring ``saved`` back, detached, its publish counts ``received``."""
    session = Session(saved.client_name, saved.principal)
    session.id = saved.id
    subscriptions = _subscriptions(services, saved, unattached)
    session.subscriptions = subscriptions
    state = saved.state
    kept = {h: v for h, v in state.subscriptions.items() if h in subscriptions}
    state = BrokerSessionState(
        state.topics, kept, state.next_topic, state.next_subscription, received, state.stages
    )
    services.sessions.sessions[session.id] = session
    services.sessions.detach(session, state)
    return session


def claimed_topics(claimed: ClaimedSession) -> dict[int, str]:
    """Per topic handle of a claimed session's record: its topic (none if
    the record is malformed: :func:`restore_claimed` reports it)."""
    try:
        record: Any = claimed.record
        return {int(h): str(name) for h, name, _ in record["topics"]}
    except (TypeError, ValueError, KeyError, IndexError):
        return {}


def restore_claimed(
    services: BrokerServices,
    session_id: bytes,
    claimed: ClaimedSession,
    stored: Mapping[int, int],
) -> Session | None:
    """Cluster mode: bring back, detached, a session another front end
    served (its keys as :meth:`~._cluster_records.ClusterRecords.claim` read
    them); None if its record is malformed. Each topic handle's publish
    count is the larger of the bucket's (written lazily) and ``stored``,
    what the topic's stream holds of them (its runs name their origins):
    at least what the client saw confirmed, since a Confirm follows the
    stream's acknowledgement. Its client sends again only what no stream
    has, and what it sends that a stream holds after all is recognised
    there by its origin."""
    counts = {f"p/{h}": n for h, n in claimed.routed.items()}
    counts |= {f"s/{h}": n for h, n in claimed.acked.items()}
    try:
        saved = decode_session(session_id.hex(), claimed.record, counts)
    except (TypeError, ValueError, KeyError, IndexError):
        log.error("cluster session record of %s is malformed: not resumed", session_id[:4].hex())
        return None
    received = dict(saved.state.received)
    for handle, count in stored.items():
        if handle in saved.state.topics:
            received[handle] = max(received.get(handle, 0), count)
    session = _restore(services, saved, Unattached(services.resources.account), received)
    records = services.storage.session_records
    if records is not None and session.state is not None:
        records.save(session, session.state, session.subscriptions)
    return session


def _received(saved: SavedSession, staged: Mapping[tuple[bytes, int], int]) -> dict[int, int]:
    """Per topic handle of ``saved``: how many of its publishes the broker
    has (its record's count, or more: staged)."""
    received = dict(saved.state.received)
    for handle in saved.state.topics:
        received[handle] = max(received.get(handle, 0), staged.get((saved.id, handle), 0))
    return received


def _subscriptions(
    services: BrokerServices, saved: SavedSession, unattached: Unattached
) -> dict[int, Subscription]:
    """The saved session's reliable subscriptions, reading from their logs
    after the last offset processed (forwarded ones: see
    ``ForwardedSubscription.attach``)."""
    subscriptions: dict[int, Subscription] = {}
    for handle, (info, _) in saved.state.subscriptions.items():
        if info.mode != DeliveryMode.RELIABLE:
            continue
        if info.topic is None:  # a pattern's (with a durable cursor: its positions)
            pattern = _pattern(services, unattached, handle, info.topic_name, info.options, saved)
            if pattern is not None:
                subscriptions[handle] = pattern
            continue
        topic = services.topics.topic(info.topic_name)
        if "group" in info.options:
            member = _member(services, unattached, handle, topic, info.options, saved)
            if member is not None:
                topic.subscribe(member)
                subscriptions[handle] = member
            else:
                topic.release_if_unused()
            continue
        if isinstance(topic, ForwardTopic):  # another worker's: made there on resume
            subscription: Subscription = forwarded_subscription(
                unattached,
                handle,
                topic,
                info.mode,
                info.options,
                saved.principal,
                restored=saved.acked.get(handle, 0),
            )
            topic.subscribe(subscription)
            subscriptions[handle] = subscription
            continue
        topic_log = topic.log
        if topic_log is None:  # (cannot be: sessions are recorded only with logs)
            topic.release_if_unused()
            continue
        position = saved.acked.get(handle, topic_log.next_offset - 1) + 1
        request = start_request(info.options)  # (its options were accepted once)
        name = request.cursor
        key = cursor_key(saved.principal, info.topic_name, name) if name is not None else None
        subscription = LogSubscription(
            unattached,
            handle,
            topic,
            info.mode,
            topic_log,
            position,
            cursors=services.storage.cursors,
            cursor_key=key,
            until=request.until,
            timestamps=request.timestamps,
        )
        topic.subscribe(subscription)
        subscriptions[handle] = subscription
    return subscriptions


def _pattern(
    services: BrokerServices,
    unattached: Unattached,
    handle: int,
    pattern: str,
    options: Mapping[str, object],
    saved: SavedSession,
) -> PatternSubscription | None:
    """A pattern subscription, back over the topics it matches, each member
    after its durable cursor's position."""
    try:
        subscription = make_pattern_subscription(
            unattached,
            handle,
            TopicPattern(pattern),
            DeliveryMode.RELIABLE,
            options,
            host=services.topics,
            cursors=services.storage.cursors,
            principal=saved.principal,
            may_read=services.gate.reader_of(saved.principal),
        )
    except (OptionError, TopicNameError) as error:
        log.warning("a restored session's pattern subscription is left out: %s", error)
        return None
    subscription.next_seq = saved.acked.get(handle, 0) + 1
    subscription.acked = subscription.next_seq - 1
    subscription.start()
    return subscription


def _member(
    services: BrokerServices,
    unattached: Unattached,
    handle: int,
    topic: Topic,
    options: Mapping[str, object],
    saved: SavedSession,
) -> GroupSubscription | ForwardedGroupMember | None:
    """A consumer group's member, back in its group (holding nothing: what
    it held went back to the group with the restart), numbering its
    deliveries after the last its client processed."""
    if isinstance(topic, ForwardTopic):  # (its group is another worker's)
        return ForwardedGroupMember(
            unattached,
            handle,
            topic,
            options,
            saved.principal,
            restored=saved.acked.get(handle, 0),
        )
    if services.storage.groups is None:
        return None
    try:
        request, rest = group_request(options)
        member = services.storage.groups.join(
            unattached, handle, topic, request, start_request(rest).start, saved.principal
        )
    except (GroupOptionError, OptionError) as error:
        log.warning("a restored session's group member is left out: %s", error)
        return None
    member.restored(saved.acked.get(handle, 0))
    return member
