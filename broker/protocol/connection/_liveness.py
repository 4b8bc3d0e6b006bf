"""Heartbeat and lease bookkeeping, with time passed in by the caller."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Liveness:
    """When to send a ``Ping`` and when the peer counts as gone.

    Any frame counts as liveness in either direction. A side sends a ``Ping``
    once it has sent nothing for ``heartbeat`` seconds; the peer is gone after
    ``lease`` seconds without a frame from it. Time spent with reading
    *suspended* (the broker not reading a socket because its account is in
    debt) does not count against the peer: :meth:`suspend` and :meth:`resume`
    bracket it.
    """

    heartbeat: float
    lease: float
    last_sent: float = 0.0
    last_received: float = 0.0
    suspended_at: float | None = None

    def on_sent(self, now: float) -> None:
        self.last_sent = now

    def on_received(self, now: float) -> None:
        self.last_received = now

    def suspend(self, now: float) -> None:
        """This side stopped reading; the peer's silence no longer counts."""
        if self.suspended_at is None:
            self.suspended_at = now

    def resume(self, now: float) -> None:
        """This side reads again; the suspended time is forgiven."""
        if self.suspended_at is not None:
            self.last_received += max(now - self.suspended_at, 0.0)
            self.suspended_at = None

    def ping_due(self, now: float) -> bool:
        """This side has been silent for a heartbeat interval (due exactly at
        the time :meth:`next_deadline` gives, whatever the float rounding)."""
        return now >= self.last_sent + self.heartbeat

    def silence(self, now: float) -> float:
        """Seconds of the peer's silence that count against its lease."""
        until = now if self.suspended_at is None else self.suspended_at
        return max(until - self.last_received, 0.0)

    def peer_gone(self, now: float) -> bool:
        """The peer has been silent for the whole lease (gone exactly at the
        time :meth:`next_deadline` gives, whatever the float rounding)."""
        until = now if self.suspended_at is None else self.suspended_at
        return until >= self.last_received + self.lease

    def next_deadline(self) -> float:
        """The earliest time at which :meth:`ping_due` or :meth:`peer_gone` may change."""
        ping_at = self.last_sent + self.heartbeat
        if self.suspended_at is not None:
            return ping_at
        return min(ping_at, self.last_received + self.lease)
