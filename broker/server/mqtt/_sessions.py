"""MQTT sessions that outlive their connection (Clean Start 0): what a
client subscribed to, kept by client id, and where each QoS 1 subscription
is, kept as the broker's durable cursors.

A session kept is its topic filters (each with its granted QoS and
subscription identifier) and the inbound QoS 2 packet ids awaiting
PUBREL, in memory, until it is resumed, replaced by a clean start, or
expires (5.0's Session Expiry Interval; 3.1.1's never). Its QoS 1
subscriptions read their topics' logs through durable cursors named after
the client id and the filter (:func:`cursor_name`): a position is stored
at each PUBACK, written to the state journal at once, so it survives the
connection, and the broker too. While the client is away its subscriptions
hold nothing in memory: what is published meanwhile waits in the topic
logs, and a resumed subscription reads it from the cursor on.

Only a broker with topic logs keeps sessions (a memory-only one has no
cursors): there every connection is a clean start.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field

from ..topics._log_subscription import CursorBook

__all__ = ["KeptSession", "MQTTSessions", "cursor_name", "cursor_prefix"]

#: 5.0's Session Expiry Interval that means "never".
NEVER = 0xFFFF_FFFF


def cursor_prefix(client_id: str) -> str:
    """What the names of a client's cursors start with."""
    return "mqtt-" + hashlib.sha256(client_id.encode()).hexdigest()[:24] + "-"


def cursor_name(client_id: str, topic_filter: str) -> str:
    """The durable cursor a persistent session's subscription to
    ``topic_filter`` reads through (one per topic it matches)."""
    return cursor_prefix(client_id) + hashlib.sha256(topic_filter.encode()).hexdigest()[:16]


@dataclass(slots=True)
class KeptSession:
    """A session while its client is away (see the module)."""

    #: Topic filter -> (granted QoS, subscription identifier, Retain As
    #: Published), in subscription order.
    filters: dict[str, tuple[int, int | None, bool]] = field(default_factory=dict)
    #: Inbound QoS 2 packet ids whose PUBREC was sent and PUBCOMP not yet.
    inbound_qos2: frozenset[int] = frozenset()
    #: When it expires (monotonic seconds; ``inf``: never).
    expires: float = math.inf


class MQTTSessions:
    """The kept sessions by client id, and their cursors (``cursors``; None:
    a memory-only broker, which keeps no session)."""

    def __init__(self, cursors: CursorBook | None) -> None:
        self.cursors = cursors
        self.kept: dict[str, KeptSession] = {}
        self._next_expiry = math.inf

    @property
    def available(self) -> bool:
        """Whether sessions can be kept at all (a broker with topic logs)."""
        return self.cursors is not None

    def take(self, client_id: str, now: float) -> KeptSession | None:
        """The session kept for ``client_id`` (it is the caller's now), or
        None (none, or it expired: then its cursors are deleted)."""
        self.expire(now)
        return self.kept.pop(client_id, None)

    def keep(self, client_id: str, session: KeptSession) -> None:
        """Keep ``session`` until its client comes back or it expires."""
        self.kept[client_id] = session
        self._next_expiry = min(self._next_expiry, session.expires)

    def end(self, client_id: str) -> None:
        """The session of ``client_id`` is over (a clean start, or it
        expired): forget it and delete its cursors."""
        self.kept.pop(client_id, None)
        self.forget_cursors(cursor_prefix(client_id))

    def forget_cursors(self, prefix: str) -> None:
        """Delete every durable cursor whose name starts with ``prefix``."""
        cursors = self.cursors
        if cursors is None:
            return
        for key, _ in cursors.items():
            parts = key.split("\x00")
            if len(parts) == 3 and parts[2].startswith(prefix):
                cursors.delete(key)

    def expire(self, now: float) -> None:
        """End the sessions whose time is up."""
        if now < self._next_expiry:
            return
        self._next_expiry = math.inf
        for client_id, session in list(self.kept.items()):
            if session.expires <= now:
                self.end(client_id)
            else:
                self._next_expiry = min(self._next_expiry, session.expires)


def expiry_of(interval: int | None, version5: bool, now: float) -> float | None:
    """When a session with Session Expiry Interval ``interval`` expires once
    its connection ends (None: it ends with it). 3.1.1's Clean Session 0
    session never expires."""
    if not version5:
        return math.inf
    if not interval:
        return None
    if interval >= NEVER:
        return math.inf
    return now + interval
