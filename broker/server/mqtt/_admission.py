"""CONNECT: who the client is and what its CONNACK says.

- Without an auth file anybody connects. With one, the CONNECT's password
  is a principal's token (as a native client's ``BROKER_TOKEN``); the
  username is not checked (give the principal's name, for your logs).
  Without a password, a client certificate verified over mutual TLS
  (``tls_client_ca``) is the principal whose ``identity`` is its common
  name. Neither: 0x87 Not authorized (3.1.1: return code 5); a password
  that is no token: 0x86 Bad User Name or Password (3.1.1: 4), answered
  after the delay failures from the address earn (``auth_failure_delay``);
  a principal at its ``max_connections``: 0x97 Quota exceeded (3.1.1: 3).
- The client id is the session's name: an empty one (5.0) is assigned one
  (``Assigned Client Identifier``). A second connection with a client id
  in use takes it over (the first is closed: 0x8E Session taken over).
- Sessions (``_sessions``) are kept only by a broker with topic logs: on a
  memory-only one, a 5.0 client that asks for a Session Expiry Interval is
  told 0 in CONNACK.
- CONNACK tells a 5.0 client when shared subscriptions are not available
  (a broker without topic logs has no consumer groups).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from broker.auth import AuthFailure
from broker.mqtt import MQTT_5, NO_PROPERTIES, Connect, Properties, ReasonCode

from .._peers import peer_key
from .._principal_usage import PrincipalUsage
from .._services import Gate

__all__ = ["Admitted", "MQTTAdmission"]

R = ReasonCode


@dataclass(frozen=True, slots=True)
class Admitted:
    """The answer to a CONNECT: its reason (0x00: accepted), a line for
    the log and the client (a refusal's), the CONNACK properties, and how
    long to hold a refusal back."""

    reason: ReasonCode
    message: str = ""
    properties: Properties = NO_PROPERTIES
    hold: float = 0.0


class MQTTAdmission:
    """One connection's CONNECT, checked against the broker's gate."""

    def __init__(self, gate: Gate, peer: str, name: str, identity: str | None = None) -> None:
        self.gate = gate
        self.peer = peer
        self.name = name
        #: The verified client certificate's common name (mutual TLS), if any.
        self.identity = identity
        #: The client identifier (assigned if the client gave none).
        self.client_id = ""
        #: The authenticated principal's usage (None without auth).
        self.principal: PrincipalUsage | None = None

    @property
    def principal_name(self) -> str | None:
        return None if self.principal is None else self.principal.principal.name

    def admit(
        self, connect: Connect, now: float, *, keeps_sessions: bool, shares: bool = False
    ) -> Admitted:
        """Check ``connect`` (see the module); an accepted client counts
        against its principal's connections until :meth:`leave`.
        ``keeps_sessions``: whether the broker can keep a session;
        ``shares``: whether it has shared subscriptions (consumer groups)."""
        refused = self._authenticate(connect, now)
        if refused is not None:
            return refused
        client_id = connect.client_id
        assigned = None
        if not client_id:
            client_id = assigned = f"auto-{self.name}-{secrets.token_hex(6)}"
        self.client_id = client_id
        if connect.protocol_version != MQTT_5:
            return Admitted(R.SUCCESS)
        properties = Properties(
            assigned_client_identifier=assigned,
            session_expiry_interval=(
                0 if connect.properties.session_expiry_interval and not keeps_sessions else None
            ),
            shared_subscription_available=None if shares else 0,
        )
        return Admitted(R.SUCCESS, properties=properties)

    def _authenticate(self, connect: Connect, now: float) -> Admitted | None:
        gate = self.gate
        if gate.auth is None:
            return None
        token: str | None = None
        if connect.password is not None:
            try:
                token = connect.password.decode()
            except UnicodeDecodeError:
                token = "\ufffd"  # (no token: refused as bad credentials)
        found = gate.auth.authenticate(token, self.identity)
        if isinstance(found, AuthFailure):
            gate.auth_failed(found)
            hold = gate.peers.failed(peer_key(self.peer), now)
            if token is None:
                return Admitted(R.NOT_AUTHORIZED, "credentials required", hold=hold)
            return Admitted(R.BAD_USER_NAME_OR_PASSWORD, "bad credentials", hold=hold)
        usage = gate.principals[found.name]
        limit = found.max_connections
        if limit and usage.whole_broker_connections() >= limit:
            gate.auth_failed(AuthFailure.CONNECTION_LIMIT)
            return Admitted(R.QUOTA_EXCEEDED, f"{found.name!r} already has {limit} connection(s)")
        usage.connected(1)
        self.principal = usage
        return None

    def may_publish(self, topic: str) -> bool:
        """Whether the client's principal may publish to broker topic ``topic``."""
        return self.principal is None or self.principal.principal.may_publish(topic)

    def may_subscribe(self, topic: str) -> bool:
        """Whether the client's principal may subscribe to broker topic ``topic``."""
        return self.principal is None or self.principal.principal.may_subscribe(topic)

    def leave(self) -> None:
        """The connection is over: its principal has one connection fewer."""
        if self.principal is not None:
            self.principal.connected(-1)
            self.principal = None
