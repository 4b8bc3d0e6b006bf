"""What the broker counts per principal and about refusals (kept apart from
the broker, so that a connection's parts can name them)."""

from __future__ import annotations

from dataclasses import dataclass, field

from broker.auth import AUTH_FAILURE_REASONS, Principal


@dataclass(slots=True, eq=False)
class PrincipalUsage:
    """What one principal's live connections hold now."""

    principal: Principal
    connections: int = 0
    buffer_reserved: int = 0
    #: The most its connections may reserve together (its share of the global budget).
    buffer_budget: int = 0


@dataclass(slots=True)
class SecurityCounters:
    """Refusals since the broker started (exported as metrics)."""

    auth_failures: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(AUTH_FAILURE_REASONS, 0)
    )
    tls_handshake_failures: int = 0
    lease_expirations: int = 0
