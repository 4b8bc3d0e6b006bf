"""Sessions: what a client holds on the broker, kept across its connections.

A session owns its subscriptions (queues, unacknowledged deliveries and
their loans) and the record of its handles. When its connection breaks
without the client saying Goodbye, the session is *detached*: its
subscriptions keep queueing (charged, as always, to the publishers, so a
gone subscriber throttles its publishers instead of growing memory) and it
waits ``lease`` seconds for a resume. Then it expires and frees everything.
"""

from __future__ import annotations

import logging
import secrets
from typing import Protocol

import trio

from broker.protocol.connection import BrokerSessionState

from .._peer_logging import shown
from ..topics._topic import Subscription
from ._records import SessionRecords

log = logging.getLogger("broker.server")


class SessionHolder(Protocol):
    """The connection a session is attached to."""

    def hand_over(self) -> None:
        """The session resumes elsewhere: let go of it, and close."""
        ...


class Session:
    """One client session; :class:`SessionTable` creates, resumes and expires them."""

    __slots__ = (
        "_expiry",
        "client_name",
        "connection",
        "detached_at",
        "id",
        "link",
        "principal",
        "state",
        "subscriptions",
    )

    def __init__(self, client_name: str, principal: str | None, prefix: bytes = b"") -> None:
        #: ``prefix`` (a worker's index), then random bits (120 of them for a
        #: worker, else 128): unique across broker restarts, and unguessable.
        self.id = prefix + secrets.token_bytes(16 - len(prefix))
        self.client_name = client_name
        #: The principal that created it; only the same principal may resume it.
        self.principal = principal
        #: Subscription handle -> its queue (shared with the attached connection).
        self.subscriptions: dict[int, Subscription] = {}
        #: The handles as the last connection left them (set on detach).
        self.state: BrokerSessionState | None = None
        self.connection: SessionHolder | None = None
        #: When the last connection broke (None while attached).
        self.detached_at: float | None = None
        self._expiry: trio.CancelScope | None = None
        #: The session of another worker's link (not a client's).
        self.link = False

    @property
    def name(self) -> str:
        """A short, log-safe name: the first bytes of the id in hex."""
        return self.id[:4].hex()

    def close_subscriptions(self) -> None:
        """Leave every topic and repay every queued and unacknowledged delivery."""
        for subscription in self.subscriptions.values():
            subscription.close()
        self.subscriptions.clear()


class Histogram:
    """Cumulative counts of observations per upper bound, and their sum (the
    Prometheus histogram shape, kept without a registry)."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last for +Inf
        self.total = 0.0

    def observe(self, value: float) -> None:
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += 1
        self.counts[-1] += 1
        self.total += value

    def snapshot(self) -> tuple[list[tuple[str, float]], float]:
        """``(buckets, sum)`` for a ``HistogramMetricFamily``."""
        labels = [repr(float(bound)) for bound in self.bounds] + ["+Inf"]
        return list(zip(labels, map(float, self.counts), strict=True)), self.total


#: Seconds of lease left at a resume: most resumes come quickly after a break.
LEASE_LEFT_BOUNDS = (0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0)


class SessionTable:
    """The broker's sessions: created at Hello, detached when their connection
    breaks, resumed within ``linger`` seconds or expired after it."""

    def __init__(self, linger: float, prefix: bytes = b"") -> None:
        self.linger = linger
        #: What every session id created here starts with (a worker's index).
        self.prefix = prefix
        self.sessions: dict[bytes, Session] = {}
        #: Of :attr:`sessions`, those of other workers' links (not counted
        #: as clients' sessions in the metrics).
        self.links = 0
        self.created_total = 0
        self.resumed_total = 0
        #: Hellos that asked to resume a session not here (expired, ended,
        #: or another principal's): a new session each; what its client
        #: publishes again is past deduplication (may be stored twice).
        self.unknown_total = 0
        self.expired_total = 0
        #: Deliveries sent again on resumes (sent before, never acknowledged).
        self.redelivered_total = 0
        #: Seconds of the lease left at each resume.
        self.lease_left = Histogram(LEASE_LEFT_BOUNDS)
        self._nursery: trio.Nursery | None = None
        #: Where sessions are recorded to survive a restart (a broker with a data directory).
        self.records: SessionRecords | None = None
        #: The broker is stopping: sessions ended now stay recorded, to be
        #: resumed after the restart.
        self.keep_records = False

    def start(self, nursery: trio.Nursery) -> None:
        """Run expiry timers in ``nursery`` (the broker's)."""
        self._nursery = nursery

    @property
    def detached(self) -> int:
        return sum(1 for s in self.sessions.values() if s.connection is None)

    def unacked(self) -> int:
        """Deliveries sent and not acknowledged, over every client's session
        (a link's are counted at the worker that relays them, as its client's)."""
        sessions = [s for s in self.sessions.values() if not s.link]
        return sum(sub.unacked_deliveries for s in sessions for sub in s.subscriptions.values())

    def create(
        self,
        connection: SessionHolder,
        client_name: str,
        subscriptions: dict[int, Subscription],
        principal: str | None,
        *,
        link: bool = False,
    ) -> Session:
        """A new session of ``client_name``, attached to ``connection``, whose
        subscriptions are (from now on) ``subscriptions``; ``link``: of
        another worker's link, counted in :attr:`links`, not as created."""
        session = Session(client_name, principal, self.prefix)
        session.subscriptions = subscriptions
        session.connection = connection
        self.sessions[session.id] = session
        session.link = link
        self.links += link
        self.created_total += not link
        return session

    def find(self, session_id: bytes, principal: str | None) -> Session | None:
        """The session a Hello asks to resume, if it lives and is the principal's."""
        session = self.sessions.get(session_id)
        if session is None or session.principal != principal:
            return None
        return session

    def attach(self, session: Session, connection: SessionHolder) -> None:
        """``connection`` resumes ``session`` (the caller detached any earlier one)."""
        assert session.connection is None, "detach the old connection first"
        if session._expiry is not None:
            session._expiry.cancel()
            session._expiry = None
        if session.detached_at is not None:
            left = self.linger - (trio.current_time() - session.detached_at)
            self.lease_left.observe(max(left, 0.0))
        session.connection = connection
        session.detached_at = None
        self.resumed_total += 1

    def detach(self, session: Session, state: BrokerSessionState) -> None:
        """The session's connection broke: keep it for ``linger`` seconds."""
        session.state = state
        session.connection = None
        session.detached_at = trio.current_time()
        if self._nursery is None:  # pragma: no cover - the broker always starts the table
            self.end(session)
            return
        scope = session._expiry = trio.CancelScope()
        self._nursery.start_soon(self._expire_later, session, scope)

    async def _expire_later(self, session: Session, scope: trio.CancelScope) -> None:
        with scope:
            await trio.sleep(self.linger)
            if session.connection is None and self.sessions.get(session.id) is session:
                self.expired_total += 1
                log.info("session %s of %s expired", session.name, shown(session.client_name))
                self.end(session)

    def end(self, session: Session, *, elsewhere: bool = False) -> None:
        """Forget ``session`` and free what it holds; ``elsewhere``: it lives
        on at another front end (cluster mode), whose its records are now."""
        if session._expiry is not None:
            session._expiry.cancel()
            session._expiry = None
        if self.sessions.get(session.id) is session:
            del self.sessions[session.id]
            self.links -= session.link
            if self.records is not None and not session.link:
                if elsewhere:
                    self.records.let_go(session)
                elif not self.keep_records:
                    self.records.forget(session)
        session.close_subscriptions()

    def end_all(self) -> None:
        """The broker stops: end every session (their records stay, see :attr:`keep_records`)."""
        self.keep_records = True
        for session in list(self.sessions.values()):
            self.end(session)
