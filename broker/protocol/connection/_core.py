"""What the connection's parts and its users share: the constants of
its opening, and :class:`ConnectionStatistics` (its snapshot)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .._types import (
    Role,
)
from ..guarantees._receiver import (
    ReceiverStatistics,
    SenderStatistics,
)
from ._handshake import ConnectionState

#: The largest frame body a broker accepts before the client's Hello: what an
#: unauthenticated peer can make it buffer (``max_frame`` applies after it).
MAX_HELLO_FRAME = 16 * 1024
DEFAULT_HEARTBEAT = 5.0
DEFAULT_LEASE = 15.0


@dataclass(slots=True, frozen=True)
class ConnectionStatistics:
    """A snapshot of a connection: counters, channels and handles."""

    role: Role
    state: ConnectionState
    frames_received: int
    bytes_received: int
    frames_sent: int
    bytes_sent: int
    discarded_frames: int
    topics_bound: int
    subscriptions_bound: int
    receivers: list[ReceiverStatistics] = field(default_factory=list)
    senders: list[SenderStatistics] = field(default_factory=list)
