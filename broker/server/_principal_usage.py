"""What the broker counts per principal and about refusals, and what each
connection reserved of the buffer budgets (kept apart from the broker, so
that a connection's parts can name them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from broker.auth import AUTH_FAILURE_REASONS, AuthError, AuthTable, Principal
from broker.config import BrokerConfig


class ConnectionCounter(Protocol):
    """Where a principal's connections are counted over every worker of a
    broker (``_shared_counts.SharedCounts``)."""

    def total(self, name: str) -> int: ...

    def add(self, name: str, delta: int) -> None: ...


@dataclass(slots=True, eq=False)
class PrincipalUsage:
    """What one principal's live connections hold now."""

    principal: Principal
    #: Its connections to this broker (this worker, of a broker of several).
    connections: int = 0
    buffer_reserved: int = 0
    #: The most its connections may reserve together (its share of the global budget).
    buffer_budget: int = 0
    #: Of a worker: the counts of every worker, which its limit applies to.
    shared: ConnectionCounter | None = None

    def whole_broker_connections(self) -> int:
        """Its connections to the whole broker (every worker)."""
        shared = self.shared
        return self.connections if shared is None else shared.total(self.principal.name)

    def connected(self, delta: int) -> None:
        """One more (``delta`` 1) or one fewer (-1) connection."""
        self.connections += delta
        if self.shared is not None:
            self.shared.add(self.principal.name, delta)


@dataclass(slots=True)
class SecurityCounters:
    """Refusals since the broker started (exported as metrics)."""

    auth_failures: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(AUTH_FAILURE_REASONS, 0)
    )
    tls_handshake_failures: int = 0
    lease_expirations: int = 0


class LedgerHost(Protocol):
    """Where all connections' reservations are summed (the broker)."""

    #: Receive-buffer capacity reserved by all connections.
    buffer_reserved: int

    @property
    def config(self) -> BrokerConfig: ...


class ConnectionLedger:
    """The receive-buffer capacity one connection reserved, booked also to
    its broker and (once authenticated) its principal: the ``Ledger`` of its
    :class:`~._budget.ConnectionBudget`."""

    __slots__ = ("_host", "buffer_reserved", "principal")

    def __init__(self, host: LedgerHost) -> None:
        self._host = host
        self.buffer_reserved = 0
        #: The authenticated principal's usage (None while unauthenticated or without auth).
        self.principal: PrincipalUsage | None = None

    def spare_budget(self) -> int:
        """What the broker's and the principal's budgets still allow."""
        host = self._host
        spare = host.config.global_budget - host.buffer_reserved
        principal = self.principal
        if principal is not None:
            spare = min(spare, principal.buffer_budget - principal.buffer_reserved)
        return spare

    def broker_spare(self) -> int:
        """What the broker's budget alone still allows."""
        host = self._host
        return host.config.global_budget - host.buffer_reserved

    def reserve(self, amount: int) -> None:
        """Book ``amount`` more bytes of capacity as reserved by this
        connection (and its broker and principal)."""
        self.buffer_reserved += amount
        self._host.buffer_reserved += amount
        if self.principal is not None:
            self.principal.buffer_reserved += amount

    def bind(self, principal: PrincipalUsage) -> None:
        """The connection authenticated as ``principal``: what it reserved
        counts against the principal's budget from now on."""
        principal.buffer_reserved += self.buffer_reserved
        self.principal = principal


def check_budget_shares(auth: AuthTable, config: BrokerConfig) -> None:
    """Refuse a principal whose share of the global budget cannot fund one
    connection (its clients would wait forever for their first guarantees)."""
    need = 2 * config.bind_capacity + config.min_publish_capacity
    for principal in auth.principals.values():
        budget = principal.budget(config.global_budget)
        if budget < need:
            raise AuthError(
                f"principal {principal.name!r}: budget_share {principal.budget_share} of "
                f"global_budget is {budget} bytes, less than one connection needs ({need}: "
                "two bind channels and one publish channel)"
            )
