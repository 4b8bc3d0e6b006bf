"""What the broker remembers per client address, in bounded memory: the
connections that have not been welcomed yet (a few per address at most) and
recent failed authentications (each refused later than the one before).

An address is a host; IPv6 hosts count per /64 network, the smallest block
one subscriber is usually given.
"""

from __future__ import annotations

import ipaddress
from typing import Generic, Protocol, TypeVar

#: Addresses whose failed authentications are remembered at once (the least
#: recently failed are forgotten first).
FAILURES_REMEMBERED = 10_000
#: An address's failures are forgotten after this many seconds without one
#: (or twice ``auth_failure_delay_max``, if longer).
FAILURES_FORGOTTEN_AFTER = 60.0

V = TypeVar("V")


def address_key(host: str) -> str:
    """The address ``host`` counts as: itself, an IPv4-mapped IPv6 address's
    IPv4 address, or an IPv6 address's /64 network."""
    try:
        address = ipaddress.ip_address(host.strip("[]").split("%")[0])
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


def peer_key(peer: str) -> str:
    """The address (see :func:`address_key`) of a ``host:port`` peer."""
    return address_key(peer.rpartition(":")[0] or peer)


class BoundedTable(Generic[V]):
    """A dict of at most ``size`` entries: putting one more forgets the least
    recently put or looked up."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._entries: dict[str, V] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str) -> V | None:
        value = self._entries.pop(key, None)
        if value is not None:
            self._entries[key] = value  # the most recent now
        return value

    def put(self, key: str, value: V) -> V:
        entries = self._entries
        entries.pop(key, None)
        entries[key] = value
        while len(entries) > self.size:
            del entries[next(iter(entries))]
        return value

    def pop(self, key: str) -> V | None:
        return self._entries.pop(key, None)


class Pending(Protocol):
    """A connection as the table sees it: welcomed or not yet."""

    @property
    def welcome_message(self) -> object | None: ...


class _Failures:
    __slots__ = ("count", "last")

    def __init__(self) -> None:
        self.count = 0
        self.last = 0.0


class AddressTable:
    """Per client address: connections not welcomed yet, and failed
    authentications.

    ``max_unwelcomed`` (0: no limit) bounds the connections of one address
    that are in their TLS handshake, have not had their ``Hello`` answered,
    or wait for a refusal (see :meth:`failed`); the broker applies it while
    it is half full. The n-th failed
    authentication in a row from one address is refused after ``delay x
    2**(n-1)`` seconds, at most ``delay_max``.
    """

    def __init__(self, max_unwelcomed: int, delay: float, delay_max: float) -> None:
        self.max_unwelcomed = max_unwelcomed
        self.delay = delay
        self.delay_max = delay_max
        self._forget_after = max(FAILURES_FORGOTTEN_AFTER, 2 * delay_max)
        #: Per address: its connections not welcomed yet (welcomed ones are
        #: dropped lazily, when the address is looked at).
        self._unwelcomed: dict[str, set[Pending]] = {}
        self._handshaking: dict[str, int] = {}
        self._failures: BoundedTable[_Failures] = BoundedTable(FAILURES_REMEMBERED)
        #: Connections refused because their address had too many unwelcomed ones.
        self.refused_total = 0

    # ---------------------------------------------------------------- unwelcomed connections

    def admits(self, key: str) -> bool:
        """Whether another connection from ``key`` may be served now (if not,
        it is counted as refused)."""
        if not self.max_unwelcomed:
            return True
        if self.unwelcomed(key) < self.max_unwelcomed:
            return True
        self.refused_total += 1
        return False

    def unwelcomed(self, key: str) -> int:
        """Connections from ``key`` not welcomed yet (TLS handshakes included)."""
        pending = self._unwelcomed.get(key)
        if pending:
            pending -= {c for c in pending if c.welcome_message is not None}
            if not pending:
                del self._unwelcomed[key]
        return (len(pending) if pending else 0) + self._handshaking.get(key, 0)

    def handshake_started(self, key: str) -> None:
        self._handshaking[key] = self._handshaking.get(key, 0) + 1

    def handshake_ended(self, key: str) -> None:
        left = self._handshaking[key] - 1
        if left:
            self._handshaking[key] = left
        else:
            del self._handshaking[key]

    def add(self, key: str, connection: Pending) -> None:
        """``connection`` from ``key`` is served (unwelcomed until its protocol says so)."""
        self._unwelcomed.setdefault(key, set()).add(connection)

    def remove(self, key: str, connection: Pending) -> None:
        """``connection`` has closed."""
        pending = self._unwelcomed.get(key)
        if pending is not None:
            pending.discard(connection)
            if not pending:
                del self._unwelcomed[key]

    # ---------------------------------------------------------------- failed authentication

    def failed(self, key: str, now: float) -> float:
        """Count a failed authentication from ``key``; returns how long its
        refusal is held back."""
        failures = self._failures.get(key)
        if failures is None or now - failures.last > self._forget_after:
            failures = self._failures.put(key, _Failures())
        failures.count += 1
        failures.last = now
        if not self.delay:
            return 0.0
        return min(self.delay * 2.0 ** min(failures.count - 1, 64), self.delay_max)

    def failures(self, key: str) -> int:
        """Failed authentications in a row remembered for ``key``."""
        failures = self._failures.get(key)
        return failures.count if failures is not None else 0

    @property
    def addresses_remembered(self) -> int:
        return len(self._failures)
