"""Restoring the sessions a broker recorded before it stopped (see
``_session_records``): each comes back detached, waiting for its client for
``lease`` seconds, its reliable subscriptions reading their topics' logs
from after the last offset their client processed."""

from __future__ import annotations

import logging
from typing import Any, Protocol

from accounts import Account, LoanedItem
from broker.protocol import BrokerSessionState, DeliveryMode

from ._forward import ForwardTopic, forwarded_subscription
from ._log_subscription import CursorBook, LogSubscription, cursor_key, start_request
from ._session import Session, SessionTable
from ._session_records import SavedSession, SessionRecords, load_sessions
from ._topic import Subscription, Topic

log = logging.getLogger("broker.server")


class RestoringHost(Protocol):
    """What restoring sessions needs of the broker."""

    @property
    def sessions(self) -> SessionTable: ...

    @property
    def account(self) -> Account:
        """The root account (restored subscriptions' accounts roll up to it)."""
        ...

    @property
    def cursors(self) -> CursorBook | None: ...

    def topic(self, name: str) -> Topic: ...


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

    def written_later(self, loan: LoanedItem[Any]) -> None:
        loan.repay()


def restore_sessions(host: RestoringHost, records: SessionRecords) -> int:
    """Bring back every recorded session, detached; returns how many."""
    table = host.sessions
    unattached = Unattached(host.account)
    restored = 0
    for saved in load_sessions(records):
        if saved.id in table.sessions:
            continue
        session = Session(saved.client_name, saved.principal)
        session.id = saved.id
        subscriptions = _subscriptions(host, saved, unattached)
        session.subscriptions = subscriptions
        state = saved.state
        kept = {h: v for h, v in state.subscriptions.items() if h in subscriptions}
        if len(kept) != len(state.subscriptions):
            state = BrokerSessionState(
                state.topics,
                kept,
                state.next_topic,
                state.next_subscription,
                state.received,
                state.stages,
            )
        table.sessions[session.id] = session
        table.detach(session, state)
        restored += 1
    if restored:
        log.info("restored %d sessions: each waits %.0f s for its client", restored, table.linger)
    return restored


def _subscriptions(
    host: RestoringHost, saved: SavedSession, unattached: Unattached
) -> dict[int, Subscription]:
    """The saved session's reliable subscriptions, reading from their logs
    after the last offset processed (forwarded ones: see
    ``ForwardedSubscription.attach``)."""
    subscriptions: dict[int, Subscription] = {}
    for handle, (info, _) in saved.state.subscriptions.items():
        if info.mode != DeliveryMode.RELIABLE:
            continue
        topic = host.topic(info.topic_name)
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
            cursors=host.cursors,
            cursor_key=key,
            until=request.until,
            timestamps=request.timestamps,
        )
        topic.subscribe(subscription)
        subscriptions[handle] = subscription
    return subscriptions
