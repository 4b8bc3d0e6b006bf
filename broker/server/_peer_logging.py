"""Client input in the broker's log: cut short, escaped, and rate-limited per
client address, so that no client can make the log grow faster than a few
small lines a second.

Use :func:`shown` for every piece of client input (a topic name, a client
name, a Goodbye reason, a batch name) put into a log line or a reason, and
:class:`PeerLog` for every log line a client can cause.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ._peers import BoundedTable, peer_key

#: Characters of one piece of client input shown in a log line.
SHOWN_CHARS = 64
#: Characters of a whole log line a client caused (a safety net: each piece
#: of client input in it is already cut to ``SHOWN_CHARS``).
LINE_CHARS = 512
#: Lines a client address may cause at once...
LOG_BURST = 50
#: ...and per second after that; the rest are counted and the count logged
#: with the address's next line.
LOG_RATE = 5.0
#: Addresses whose log rate is tracked (the least recently seen go first).
LOG_ADDRESSES = 4096


def shown(text: str | bytes | None, limit: int = SHOWN_CHARS) -> str:
    """``text`` from a client as it may appear in a log line or a reason:
    quoted and escaped (``repr``: no newline, control or bidi character gets
    through), at most ``limit`` characters of it, with its length if cut."""
    if text is None:
        return "None"
    if len(text) <= limit:
        return repr(text)
    unit = "bytes" if isinstance(text, bytes) else "characters"
    return f"{text[:limit]!r}... ({len(text)} {unit})"


class _Bucket:
    __slots__ = ("at", "suppressed", "tokens")

    def __init__(self, now: float) -> None:
        self.tokens = float(LOG_BURST)
        self.at = now
        self.suppressed = 0


class PeerLog:
    """Log lines that clients cause, at most ``burst`` at once and ``rate`` a
    second per client address (an IPv6 /64 counts as one), each at most
    :data:`LINE_CHARS` long. Memory is bounded: ``addresses`` are tracked."""

    def __init__(
        self,
        logger: logging.Logger,
        clock: Callable[[], float],
        *,
        rate: float = LOG_RATE,
        burst: int = LOG_BURST,
        addresses: int = LOG_ADDRESSES,
    ) -> None:
        self.logger = logger
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._buckets: BoundedTable[_Bucket] = BoundedTable(addresses)
        #: Lines not logged because their address was over its rate.
        self.suppressed_total = 0

    def info(self, peer: str, message: str, *args: object) -> None:
        self.log(logging.INFO, peer, message, *args)

    def warning(self, peer: str, message: str, *args: object) -> None:
        self.log(logging.WARNING, peer, message, *args)

    def log(self, level: int, peer: str, message: str, *args: object) -> None:
        """Log ``message % args`` for the client at ``peer`` (``host:port``),
        unless its address is over its rate."""
        if not self.logger.isEnabledFor(level):
            return
        key = peer_key(peer)
        now = self._clock()
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets.put(key, _Bucket(now))
        bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.at) * self.rate)
        bucket.at = now
        if bucket.tokens < 1:
            bucket.suppressed += 1
            self.suppressed_total += 1
            return
        bucket.tokens -= 1
        line = message % args if args else message
        if len(line) > LINE_CHARS:
            line = f"{line[:LINE_CHARS]}... ({len(line)} characters)"
        if bucket.suppressed:
            line += f" ({bucket.suppressed} more lines from {key} not logged)"
            bucket.suppressed = 0
        self.logger.log(level, "%s", line)


class ConnectionLog:
    """Log lines about one connection, through its broker's :class:`PeerLog`
    (rate-limited per client address): each line starts with the
    connection's name and peer. Client input in ``args`` goes through
    :func:`shown` first."""

    __slots__ = ("_name", "_peer", "_peer_log")

    def __init__(self, peer_log: PeerLog, name: str, peer: str) -> None:
        self._peer_log = peer_log
        self._name = name
        self._peer = peer

    def __call__(self, level: int, message: str, *args: object) -> None:
        self._peer_log.log(level, self._peer, "%s %s: " + message, self._name, self._peer, *args)
