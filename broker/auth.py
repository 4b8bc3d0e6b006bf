"""Who may connect, and what each client may do: principals, tokens, limits.

A broker started with ``auth_file`` authenticates every client at ``Hello``.
The file is TOML; each ``[principals.NAME]`` table is one principal::

    [principals.spark-etl]
    token_sha256 = "5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8"
    max_connections = 32        # live connections at once (0: no limit)
    budget_share = 0.25         # its connections reserve at most this share of global_budget
    publish = ["events.*"]      # topic patterns it may publish to (default: all)
    subscribe = []              # ... and subscribe to (default: all)
    admin = false               # may list, delete and purge topics and cursors (default: false)

    [principals.dashboard]
    identities = ["dashboard"]  # client-certificate common names (mutual TLS)
    publish = []

A client proves a principal by the ``token`` of its ``Hello`` (compared by
SHA-256 digest; ``token`` in the file is accepted too, ``token_sha256`` keeps
the secret out of it), or, with mutual TLS, by a certificate whose subject
common name is one of the principal's ``identities``. A token, when given,
decides: a wrong token is refused even if the certificate would do. Topic
patterns are shell-style (``fnmatch``, case-sensitive): ``*`` matches any
run of characters, dots included. A pattern that could never match a valid
topic name (a character no name may hold, not NFC, or a shortest match
longer than the name limit; see :func:`broker.protocol.topic_pattern_problem`)
is refused when the file is read.

Nothing here does I/O beyond reading the file; the server applies the
answers (see ``docs/operations.md``).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from fnmatch import fnmatchcase
from typing import Any, Final

from broker.config import read_toml
from broker.errors import BrokerError
from broker.protocol import topic_pattern_problem

__all__ = [
    "AUTH_FAILURE_REASONS",
    "AuthError",
    "AuthFailure",
    "AuthTable",
    "Principal",
    "check_principal_name",
    "load_auth_file",
    "token_digest",
]


class AuthError(BrokerError):
    """The authentication file is missing, malformed or inconsistent."""


class AuthFailure(Enum):
    """Why a client was refused (the ``reason`` label of ``broker_auth_failures_total``)."""

    #: Neither a token nor a known certificate identity.
    NO_CREDENTIALS = "no_credentials"
    #: A token that names no principal.
    BAD_CREDENTIALS = "bad_credentials"
    #: The principal already has ``max_connections`` connections.
    CONNECTION_LIMIT = "connection_limit"
    #: A topic the principal may not publish or subscribe to.
    TOPIC_DENIED = "topic_denied"


#: Every value of the ``reason`` label, in a fixed order.
AUTH_FAILURE_REASONS: Final = tuple(reason.value for reason in AuthFailure)

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}")
_HEX_DIGEST = re.compile(r"[0-9a-f]{64}")
_KEYS: Final = frozenset(
    {
        "token",
        "token_sha256",
        "identities",
        "max_connections",
        "budget_share",
        "publish",
        "subscribe",
        "admin",
    }
)


def token_digest(token: str) -> str:
    """The hex SHA-256 of ``token`` (UTF-8): what ``token_sha256`` holds."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class Principal:
    """One authenticated client identity and its limits."""

    name: str
    #: Live connections at once; 0 means no limit.
    max_connections: int = 0
    #: The share of the broker's global buffer budget its connections may reserve.
    budget_share: float = 1.0
    #: Topic patterns it may publish to and subscribe to.
    publish: tuple[str, ...] = ("*",)
    subscribe: tuple[str, ...] = ("*",)
    #: May administer topics and cursors (list, delete, purge): ``admin = true``.
    admin: bool = False

    def may_publish(self, topic: str) -> bool:
        """Whether this principal may publish to ``topic``."""
        return _matches(topic, self.publish)

    def may_subscribe(self, topic: str) -> bool:
        """Whether this principal may subscribe to ``topic``."""
        return _matches(topic, self.subscribe)

    def budget(self, global_budget: int) -> int:
        """The buffer bytes its connections may reserve together."""
        return int(global_budget * self.budget_share)


def _matches(topic: str, patterns: Iterable[str]) -> bool:
    return any(fnmatchcase(topic, pattern) for pattern in patterns)


class AuthTable:
    """The principals of an auth file, looked up by token or certificate identity."""

    def __init__(self, principals: Iterable[tuple[Principal, Iterable[str], Iterable[str]]]):
        """``principals``: each principal with its token digests and identities."""
        self.principals: dict[str, Principal] = {}
        self._by_digest: dict[str, Principal] = {}
        self._by_identity: dict[str, Principal] = {}
        for principal, digests, identities in principals:
            if principal.name in self.principals:
                raise AuthError(f"principal {principal.name!r} is defined twice")
            self.principals[principal.name] = principal
            for digest in digests:
                _claim(self._by_digest, digest, principal, "a token")
            for identity in identities:
                _claim(self._by_identity, identity, principal, f"an identity {identity!r}")

    def has_identities(self) -> bool:
        """Whether some principal is proved by a certificate identity."""
        return bool(self._by_identity)

    def authenticate(self, token: str | None, identity: str | None) -> Principal | AuthFailure:
        """The principal that ``token`` (if given) or else the certificate
        ``identity`` proves, or why the client is refused."""
        if token is not None:
            principal = self._by_digest.get(token_digest(token))
            return principal if principal is not None else AuthFailure.BAD_CREDENTIALS
        if identity is not None:
            principal = self._by_identity.get(identity)
            if principal is not None:
                return principal
        return AuthFailure.NO_CREDENTIALS


def _claim(table: dict[str, Principal], key: str, principal: Principal, what: str) -> None:
    other = table.setdefault(key, principal)
    if other is not principal:
        raise AuthError(f"principals {other.name!r} and {principal.name!r} share {what}")


def load_auth_file(path: str | os.PathLike[str]) -> AuthTable:
    """Read and check the auth file at ``path`` (raises :class:`AuthError`)."""
    data = read_toml(path, "auth file", AuthError)
    table = data.get("principals")
    if set(data) - {"principals"} or not isinstance(table, dict) or not table:
        raise AuthError(f"auth file {path}: needs [principals.NAME] tables and nothing else")
    return AuthTable(_principal(str(path), name, entry) for name, entry in table.items())


def check_principal_name(name: str, where: str = "principal") -> None:
    """Raise :class:`AuthError` unless ``name`` may name a principal: 1-64 of
    ``A-Z a-z 0-9 _ . -``, starting with a letter or digit (it is a metrics label)."""
    if not _NAME.fullmatch(name):
        raise AuthError(
            f"{where}: names are 1-64 of A-Z a-z 0-9 _ . - (starting with a letter or digit)"
        )


def _principal(source: str, name: str, entry: Any) -> tuple[Principal, list[str], list[str]]:
    where = f"auth file {source}: principal {name!r}"
    check_principal_name(name, where)
    if not isinstance(entry, Mapping):
        raise AuthError(f"{where} must be a table")
    unknown = set(entry) - _KEYS
    if unknown:
        raise AuthError(f"{where}: unknown setting(s) {sorted(unknown)}")
    digests = [token_digest(t) for t in _strings(entry, "token", where, single=True)]
    for digest in _strings(entry, "token_sha256", where, single=True):
        if not _HEX_DIGEST.fullmatch(digest):
            raise AuthError(f"{where}: token_sha256 must be 64 lower-case hex digits")
        digests.append(digest)
    identities = _strings(entry, "identities", where)
    if not digests and not identities:
        raise AuthError(f"{where}: needs a token, token_sha256 or identities")
    max_connections = entry.get("max_connections", 0)
    if type(max_connections) is not int or max_connections < 0:
        raise AuthError(f"{where}: max_connections must be an integer >= 0")
    share = entry.get("budget_share", 1.0)
    if type(share) not in (int, float) or not 0 < share <= 1:
        raise AuthError(f"{where}: budget_share must be a number in (0, 1]")
    admin = entry.get("admin", False)
    if type(admin) is not bool:
        raise AuthError(f"{where}: admin must be true or false")
    principal = Principal(
        name,
        max_connections=max_connections,
        budget_share=float(share),
        publish=_patterns(entry, "publish", where),
        subscribe=_patterns(entry, "subscribe", where),
        admin=admin,
    )
    return principal, digests, identities


def _patterns(entry: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
    """``entry[key]``: topic patterns (default: all), each one able to match a topic name."""
    patterns = _strings(entry, key, where, default=["*"])
    for pattern in patterns:
        problem = topic_pattern_problem(pattern)
        if problem is not None:
            raise AuthError(f"{where}: {key} pattern {pattern[:40]!r}: {problem}")
    return tuple(patterns)


def _strings(
    entry: Mapping[str, Any],
    key: str,
    where: str,
    *,
    single: bool = False,
    default: list[str] | None = None,
) -> list[str]:
    """``entry[key]`` as a list of non-empty strings (one string, if ``single``)."""
    if key not in entry:
        return list(default or [])
    value = entry[key]
    values = [value] if single else value
    if not isinstance(values, list) or not all(isinstance(v, str) and v for v in values):
        kind = "a non-empty string" if single else "a list of non-empty strings"
        raise AuthError(f"{where}: {key} must be {kind}")
    return list(values)
