"""What observers (``broker.metrics``: ``/metrics``, ``/stat.json``) read of a
live connection, so that they need not know the connection's class."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import trio

from accounts import Account
from broker.protocol import Connection

from ._principal_usage import PrincipalUsage
from .connection._delivery import ConnectionCounters
from .connection._publishing import PublishChannel
from .topics._topic import Subscription


class ConnectionView(Protocol):
    """One connection, read-only: who it is, its books, its protocol state.

    Reading it is synchronous and changes nothing; a closed connection can
    still be read (its counters are final once the broker forgot it).
    """

    @property
    def serial(self) -> int: ...

    @property
    def link(self) -> bool:
        """Another worker's link (a broker of several workers), not a client."""
        ...

    @property
    def name(self) -> str: ...

    @property
    def peer(self) -> str: ...

    @property
    def client_name(self) -> str: ...

    @property
    def identity(self) -> str | None: ...

    @property
    def principal(self) -> PrincipalUsage | None: ...

    @property
    def account(self) -> Account: ...

    @property
    def counters(self) -> ConnectionCounters: ...

    @property
    def protocol(self) -> Connection:
        """The sans-IO protocol state (read its statistics; do not drive it)."""
        ...

    @property
    def buffer_reserved(self) -> int: ...

    @property
    def channels(self) -> Mapping[int, PublishChannel]:
        """The publish channels, by topic handle."""
        ...

    @property
    def subscriptions(self) -> Mapping[int, Subscription]:
        """The subscriptions it serves, by handle."""
        ...

    @property
    def closed(self) -> trio.Event:
        """Set once the connection is closed and cleaned up."""
        ...
