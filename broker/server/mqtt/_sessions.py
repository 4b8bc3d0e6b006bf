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

The session itself is in the state journal too, so that it survives a
broker restart (and a ``kill -9``): space ``mqtt.sessions``, key the client
id, value ``{"f": [[filter, qos, identifier, retain as published, no
local, since], ...],
"exp": Session Expiry Interval (None: never), "gone": when its client
left (wall-clock seconds; None: connected)}``, put when a persistent
session is accepted, at each SUBSCRIBE and UNSUBSCRIBE and when its client
leaves; and its inbound QoS 2 packet ids, space ``mqtt.qos2``, key
``client id NUL packet id``, value ``[broker topic, log offset]`` (or
``[]``): put before the PUBLISH's record is appended to the topic's log
(the log's next offset then), deleted at PUBCOMP. The connection writes
the journal before anything it sends, so nothing that a PUBREC or SUBACK
said is lost. After a restart a packet id whose record did not reach its
log (the log ends at or before its offset) is dropped: the client's
resend of it is routed, once.

A session whose client was connected when the broker stopped expires its
interval after the restart; one already kept, at its time (wall clock).

Only a broker with topic logs keeps sessions (a memory-only one has no
cursors): there every connection is a clean start.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from broker.log import StateJournal

from ..topics._log_subscription import CursorBook

__all__ = [
    "OUTBOUND",
    "QOS2",
    "SESSIONS",
    "KeptSession",
    "MQTTSessions",
    "cursor_name",
    "cursor_prefix",
]

log = logging.getLogger("broker.server")

#: The journal spaces of the sessions and of their inbound QoS 2 packet ids.
SESSIONS = "mqtt.sessions"
QOS2 = "mqtt.qos2"
#: ... and of its outbound deliveries in flight (QoS 2 always; QoS 1 when
#: its client leaves) and released (PUBREC received, PUBCOMP not yet).
OUTBOUND = "mqtt.out"

#: Deliveries in flight: packet id -> ((filter, topic, log offset), QoS).
Outbound = dict[int, tuple[tuple[str, str, int], int]]

#: A session's filters: topic filter -> (granted QoS, subscription
#: identifier, Retain As Published, No Local, since: when it was first
#: subscribed, wall-clock milliseconds, None if unknown), in subscription
#: order. ``since`` is where a wildcard subscription's topics that have no
#: cursor position yet start (see ``_subscribing``).
Filters = dict[str, tuple[int, int | None, bool, bool, int | None]]

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
    #: Published, No Local, since), in subscription order.
    filters: Filters = field(default_factory=dict)
    #: Inbound QoS 2 packet ids whose PUBREC was sent and PUBCOMP not yet.
    inbound_qos2: frozenset[int] = frozenset()
    #: When it expires (monotonic seconds; ``inf``: never).
    expires: float = math.inf
    #: Deliveries in flight, sent again with their packet ids on resume.
    outbound: Outbound = field(default_factory=dict)
    #: Outbound QoS 2 packet ids released (PUBREL sent again on resume).
    released: frozenset[int] = frozenset()


class MQTTSessions:
    """The kept sessions by client id, and their cursors (``cursors``; None:
    a memory-only broker, which keeps no session), in ``journal`` (None:
    in memory only).

    ``log_end``: the next offset of a broker topic's log (None: unknown),
    to resolve the QoS 2 packet ids a restart finds; ``now``: the
    monotonic clock the expiry times are on.
    """

    def __init__(
        self,
        cursors: CursorBook | None,
        journal: StateJournal | None = None,
        *,
        log_end: Callable[[str], int | None] = lambda _topic: None,
        now: float = 0.0,
    ) -> None:
        self.cursors = cursors
        self.journal = journal if cursors is not None else None
        self.kept: dict[str, KeptSession] = {}
        self._next_expiry = math.inf
        #: QoS 2 packet ids a restart dropped: their records were not in the log.
        self.qos2_dropped = 0
        if self.journal is not None:
            self._load(self.journal, log_end, now)

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
        expired): forget it and delete its cursors and journal entries."""
        self.kept.pop(client_id, None)
        self.forget_cursors(cursor_prefix(client_id))
        self.forget_record(client_id)

    def forget_record(self, client_id: str) -> None:
        """Delete the journal's entries of ``client_id``'s session (its
        cursors stay): a restart finds no session of it."""
        journal = self.journal
        if journal is not None and journal.get(SESSIONS, client_id) is not None:
            journal.delete(SESSIONS, client_id)
            prefix = client_id + "\x00"
            for space in (QOS2, OUTBOUND):
                for key, _ in journal.items(space):
                    if key.startswith(prefix):
                        journal.delete(space, key)

    # ---------------------------------------------------------------- the journal

    def record(
        self, client_id: str, filters: Filters, interval: int | None, *, gone: bool = False
    ) -> None:
        """Put a persistent session in the journal: its filters, its expiry
        interval (None: never) and whether its client left (now)."""
        if self.journal is None:
            return
        value = {
            "f": [
                [f, qos, ident, rap, nl, since]
                for f, (qos, ident, rap, nl, since) in filters.items()
            ],
            "exp": interval,
            "gone": time.time() if gone else None,
        }
        self.journal.put(SESSIONS, client_id, value)

    def qos2_received(self, client_id: str, packet_id: int, place: list[object]) -> None:
        """Inbound QoS 2 ``packet_id`` of ``client_id`` is received: its record
        goes to ``place`` (``[broker topic, log offset]``), or (``[]``) it
        is in its topic already. Only for a session in the journal."""
        journal = self.journal
        if journal is None or journal.get(SESSIONS, client_id) is None:
            return
        key = f"{client_id}\x00{packet_id}"
        if place or journal.get(QOS2, key) is None:
            journal.put(QOS2, key, place)

    def outbound_changed(self, client_id: str, packet_id: int, value: list[object] | None) -> None:
        """A delivery of ``client_id``'s is in flight (``[filter, topic,
        offset, qos]``), released (``[]``) or done (None)."""
        journal = self.journal
        if journal is None:
            return
        key = f"{client_id}\x00{packet_id}"
        if value is None:
            journal.delete(OUTBOUND, key)
        else:
            journal.put(OUTBOUND, key, value)

    def record_outbound(
        self, client_id: str, outbound: Outbound, released: frozenset[int], *, qos2_only: bool
    ) -> None:
        """Put what is in flight to ``client_id`` in the journal (when it
        leaves: its QoS 1 deliveries too); ``qos2_only``: only drop the
        QoS 1 ones (a session resumed: they are in memory now)."""
        journal = self.journal
        if journal is None or journal.get(SESSIONS, client_id) is None:
            return
        prefix = client_id + "\x00"
        for key, value in journal.items(OUTBOUND):
            if key.startswith(prefix) and (
                not qos2_only or (isinstance(value, list) and len(value) == 4 and value[3] == 1)
            ):
                journal.delete(OUTBOUND, key)
        if qos2_only:
            return
        for packet_id, ((topic_filter, topic, offset), qos) in outbound.items():
            journal.put(OUTBOUND, prefix + str(packet_id), [topic_filter, topic, offset, qos])
        for packet_id in released:
            journal.put(OUTBOUND, prefix + str(packet_id), [])

    def qos2_done(self, client_id: str, packet_id: int) -> None:
        """PUBCOMP: the packet id is free again."""
        journal = self.journal
        if journal is not None:
            journal.delete(QOS2, f"{client_id}\x00{packet_id}")

    def _load(
        self, journal: StateJournal, log_end: Callable[[str], int | None], now: float
    ) -> None:
        """The sessions the journal holds (a broker restart): kept, until
        their clients come back or they expire."""
        wall = time.time()
        inbound: dict[str, set[int]] = {}
        for key, value in journal.items(QOS2):
            client_id, _, number = key.rpartition("\x00")
            if not number.isdigit() or not isinstance(value, list):
                journal.delete(QOS2, key)
                continue
            if len(value) == 2 and isinstance(value[0], str) and type(value[1]) is int:
                end = log_end(value[0])
                if end is None or end <= value[1]:
                    self.qos2_dropped += 1  # (not in the log: the resend is routed)
                    journal.delete(QOS2, key)
                    continue
            inbound.setdefault(client_id, set()).add(int(number))
        outbound: dict[str, Outbound] = {}
        released: dict[str, set[int]] = {}
        for key, value in journal.items(OUTBOUND):
            client_id, _, number = key.rpartition("\x00")
            if number.isdigit() and value == []:
                released.setdefault(client_id, set()).add(int(number))
            elif (
                number.isdigit()
                and isinstance(value, list)
                and len(value) == 4
                and isinstance(value[0], str)
                and isinstance(value[1], str)
                and type(value[2]) is int
                and value[3] in (1, 2)
            ):
                place = (value[0], value[1], value[2])
                outbound.setdefault(client_id, {})[int(number)] = (place, value[3])
            else:
                journal.delete(OUTBOUND, key)
        for client_id, value in journal.items(SESSIONS):
            session = _parse_session(value, now, wall)
            if session is None:
                log.warning("MQTT session %r in the journal is malformed: dropped", client_id)
                self.end(client_id)
                continue
            session.inbound_qos2 = frozenset(inbound.pop(client_id, ()))
            session.outbound = outbound.pop(client_id, {})
            session.released = frozenset(released.pop(client_id, ()))
            self.keep(client_id, session)
        for client_id in {*outbound, *released}:  # (of no session: stray)
            for packet_id in [*outbound.get(client_id, ()), *released.get(client_id, ())]:
                journal.delete(OUTBOUND, f"{client_id}\x00{packet_id}")
        for client_id, packet_ids in inbound.items():  # (of no session: stray)
            for packet_id in packet_ids:
                journal.delete(QOS2, f"{client_id}\x00{packet_id}")

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


def _parse_session(value: object, now: float, wall: float) -> KeptSession | None:
    """A session of the journal (None: malformed), expiring on the
    monotonic clock whose time is ``now`` (wall clock: ``wall``)."""
    if not isinstance(value, dict):
        return None
    interval, gone, listed = value.get("exp"), value.get("gone"), value.get("f")
    if interval is not None and type(interval) is not int:
        return None
    if gone is not None and not isinstance(gone, (int, float)):
        return None
    if not isinstance(listed, list):
        return None
    filters: Filters = {}
    for item in listed:
        if not isinstance(item, list) or len(item) not in (4, 5, 6):
            return None  # (4: written before No Local was kept; 5: before since)
        topic_filter, qos, identifier, as_published = item[:4]
        no_local = len(item) >= 5 and bool(item[4])
        since = item[5] if len(item) == 6 else None
        if not isinstance(topic_filter, str) or qos not in (0, 1, 2):
            return None
        if identifier is not None and type(identifier) is not int:
            return None
        if since is not None and (type(since) is not int or since < 0):
            return None
        filters[topic_filter] = (qos, identifier, bool(as_published), no_local, since)
    if interval is None or interval >= NEVER:
        expires = math.inf
    elif gone is None:
        expires = now + interval  # (connected when the broker stopped)
    else:
        expires = now + (gone + interval - wall)
    return KeptSession(filters, frozenset(), expires)


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
