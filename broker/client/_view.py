"""What a client shows of its session: counters and advisories, read-only."""

from __future__ import annotations

from broker.protocol import Channel, Connection

from ._core import ClientSession


class SessionView:
    """The counters a client shows of its session (read-only)."""

    _session: ClientSession

    @property
    def name(self) -> str:
        return self._session.name

    @property
    def throttled(self) -> set[Channel]:
        """Channels the broker says it withholds guarantees on (advisory)."""
        return self._session.throttled

    @property
    def throttled_topics(self) -> set[str]:
        """Topics the broker says it withholds guarantees on, for longer than
        its notice threshold (advisory: publishing to them waits)."""
        session = self._session
        names = {session.topic_of(channel) for channel in session.throttled}
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
    def _conn(self) -> Connection:
        """The current protocol connection (for tests and tools)."""
        return self._session.conn
