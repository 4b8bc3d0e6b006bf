"""What a client shows of its session: counters and advisories, read-only."""

from __future__ import annotations

from broker.protocol import Channel, Cluster, Connection

from ._core import ClientSession


class SessionView:
    """The counters a client shows of its session (read-only)."""

    _session: ClientSession

    @property
    def name(self) -> str:
        return self._session.name

    @property
    def cluster(self) -> Cluster | None:
        """The membership of a broker of several workers, from the last
        Welcome (each topic's owner and its direct address); None from a
        single-process broker. :func:`~broker.client.open_cluster_client`
        uses it to reach every topic's owner from one address."""
        welcome = self._session.conn.welcome_message
        return None if welcome is None else welcome.cluster

    def reconnect_through(self, address: str) -> None:
        """Resume through ``address`` (``HOST:PORT``, a multi-worker broker's
        public address) whenever this client's own address cannot be
        reached while reconnecting: a worker's direct address changes when
        its broker restarts (with ``worker_port = 0``), its public address
        does not, and the broker sends the resume on to the session's
        worker. The cluster clients set it for the client of each worker."""
        self._session.fallback = address

    @property
    def throttled(self) -> set[Channel]:
        """Channels the broker says it withholds guarantees on (advisory)."""
        return self._session.throttled

    @property
    def throttled_topics(self) -> set[str]:
        """Topics the broker says it withholds guarantees on, for longer than
        its notice threshold (advisory: publishing to them waits)."""
        session = self._session
        names = {session.cache.topic_of(channel) for channel in session.throttled}
        return {name for name in names if name is not None}

    @property
    def drops_announced(self) -> int:
        return self._session.drops_announced

    @property
    def frames_resent(self) -> int:
        """Frames sent again after the broker dropped them (optimistic mode)."""
        return self._session.frames_resent

    @property
    def resumes(self) -> int:
        """Sessions resumed on a new connection."""
        return self._session.resumes

    @property
    def frames_resent_on_resume(self) -> int:
        return self._session.frames_resent_on_resume

    @property
    def sessions_lost(self) -> int:
        """Times the broker no longer knew the session (subscribed again)."""
        return self._session.sessions_lost

    @property
    def duplicates_dropped(self) -> int:
        """Deliveries not handed to the application because their offset
        was at or below the last one it was handed (or that was queued for
        it) on their subscription: records delivered again after a lost
        session (a durable cursor's unacknowledged ones)."""
        return self._session.duplicates_dropped

    @property
    def _conn(self) -> Connection:
        """The current protocol connection (for tests and tools)."""
        return self._session.conn
