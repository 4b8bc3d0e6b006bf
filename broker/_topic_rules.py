"""The ``[[topics]]`` tables of the broker's configuration (:class:`TopicRule`:
retention and flush policy per topic pattern, first match wins), and what
they share with the rest of it: sizes, :class:`ConfigError`, addresses."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, Any, cast

from broker.errors import BrokerError

if TYPE_CHECKING:
    from broker.log import LogConfig

__all__ = [
    "DEFAULT_TOPIC_RULE",
    "FLUSH",
    "TOPIC_KEYS",
    "WHEN_FULL",
    "ConfigError",
    "GiB",
    "KiB",
    "MiB",
    "TopicRule",
    "parse_address",
    "parse_topic_rules",
]

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB


class ConfigError(BrokerError):
    """A configuration value is missing, malformed or inconsistent."""


def parse_address(text: str, *, default_port: int | None = None) -> tuple[str, int]:
    """``"host:port"`` (or ``"[v6]:port"``) -> ``(host, port)``."""
    host, sep, port = text.rpartition(":")
    if not sep:
        if default_port is None:
            raise ConfigError(f"address {text!r} needs a port (HOST:PORT)")
        host, port = text, str(default_port)
    host = host.strip("[]") or "127.0.0.1"
    try:
        number = int(port)
    except ValueError:
        raise ConfigError(f"address {text!r}: port {port!r} is not a number") from None
    if not 0 <= number <= 65535:
        raise ConfigError(f"address {text!r}: port out of range")
    return host, number


#: What ``when_full`` and ``flush`` of a ``[[topics]]`` table may say.
WHEN_FULL = ("block", "drop-oldest")
FLUSH = ("batch", "always")
#: A term's size limits: a u32 position, and room for more than a few records.
MIN_TERM_BYTES = 4 * KiB
MAX_TERM_BYTES = 0xFFFFFFFF


@dataclass(frozen=True)
class TopicRule:
    """How the logs of the topics whose name matches ``pattern`` (an
    :mod:`fnmatch` glob, case-sensitive: ``*``, ``?``, ``[abc]``) keep their
    records: one ``[[topics]]`` table of the config file. A key the table
    leaves out takes the default below, which is also what a topic that no
    table matches gets.

    ``retain_bytes`` and ``retain_seconds`` of 0 mean no limit of that kind.
    Invalid values raise :class:`ConfigError` naming the key and what it allows.
    """

    pattern: str = "*"
    #: Whole terms are deleted, oldest first, once the log (its active term
    #: counted at full size) would pass this many bytes.
    retain_bytes: int = 1 * GiB
    #: A sealed term whose newest record is older than this is deleted.
    retain_seconds: float = 7 * 24 * 3600.0
    #: Over ``retain_bytes`` with a reader still needing the oldest term:
    #: "block" throttles publishers, "drop-oldest" deletes it (the reader gets a Gap).
    when_full: str = "block"
    #: "batch": a record is written with the next batch (fsynced at most
    #: ``flush_interval_ms`` later) before its Confirm; "always": fsynced first.
    flush: str = "batch"
    flush_interval_ms: int = 1000
    #: Size of one term file (the largest record is ``term_bytes - 24``).
    term_bytes: int = 16 * MiB

    def __post_init__(self) -> None:
        where = f"[[topics]] pattern {self.pattern!r}"
        if not isinstance(self.pattern, str) or not self.pattern:
            raise ConfigError(
                '[[topics]]: pattern must be a non-empty glob over topic names, e.g. "metrics.*"'
            )
        from broker.protocol import topic_pattern_problem  # (here: the config loads without it)

        problem = topic_pattern_problem(self.pattern)
        if problem is not None:  # (a rule that could never apply: a typo, surely)
            raise ConfigError(f"{where}: {problem}")
        for name in ("retain_bytes", "flush_interval_ms", "term_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ConfigError(f"{where}: {name} must be an integer, got {value!r}")
        if isinstance(self.retain_seconds, bool) or not isinstance(
            self.retain_seconds, (int, float)
        ):
            raise ConfigError(
                f"{where}: retain_seconds must be a number, got {self.retain_seconds!r}"
            )
        if self.retain_bytes < 0:
            raise ConfigError(f"{where}: retain_bytes must be >= 0 (0: no size limit)")
        if not self.retain_seconds >= 0 or math.isinf(self.retain_seconds):
            raise ConfigError(
                f"{where}: retain_seconds must be a finite number >= 0 (0: no time limit)"
            )
        if self.when_full not in WHEN_FULL:
            raise ConfigError(
                f'{where}: when_full must be "block" or "drop-oldest", got {self.when_full!r}'
            )
        if self.flush not in FLUSH:
            raise ConfigError(f'{where}: flush must be "batch" or "always", got {self.flush!r}')
        if self.flush_interval_ms < 0:
            raise ConfigError(f"{where}: flush_interval_ms must be >= 0")
        if not MIN_TERM_BYTES <= self.term_bytes <= MAX_TERM_BYTES:
            raise ConfigError(
                f"{where}: term_bytes must be {MIN_TERM_BYTES} to {MAX_TERM_BYTES} "
                f"(got {self.term_bytes})"
            )

    def matches(self, topic: str) -> bool:
        """Whether ``topic`` is one of this rule's topics."""
        return fnmatchcase(topic, self.pattern)

    def log_config(self) -> LogConfig:
        """The :class:`broker.log.LogConfig` of this rule's topics."""
        from broker.log import LogConfig

        return LogConfig(
            term_bytes=self.term_bytes,
            retain_bytes=self.retain_bytes or None,
            retain_seconds=float(self.retain_seconds) or None,
            when_full=cast(Any, self.when_full),
            flush=cast(Any, self.flush),
            flush_interval_ms=self.flush_interval_ms,
        )


#: The keys of a ``[[topics]]`` table.
TOPIC_KEYS = tuple(f.name for f in fields(TopicRule))
#: What a topic that no ``[[topics]]`` table matches gets.
DEFAULT_TOPIC_RULE = TopicRule()


def parse_topic_rules(tables: Any, source: str) -> tuple[TopicRule, ...]:
    """The ``[[topics]]`` tables of a config document (``source`` names it in
    errors), in order; raises :class:`ConfigError` for anything else than an
    array of tables, a table without ``pattern``, an unknown key or a bad value."""
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise ConfigError(f'{source}: topics must be [[topics]] tables (pattern = "...", ...)')
    rules = []
    for number, table in enumerate(tables, 1):
        values = {str(key).replace("-", "_"): value for key, value in table.items()}
        unknown = sorted(set(values) - set(TOPIC_KEYS))
        if unknown:
            raise ConfigError(
                f"{source}: [[topics]] #{number}: unknown key {unknown[0]!r} "
                f"(allowed: {', '.join(TOPIC_KEYS)})"
            )
        if "pattern" not in values:
            raise ConfigError(
                f"{source}: [[topics]] #{number} needs a pattern: a glob over topic "
                'names, e.g. pattern = "metrics.*" ("*" for every topic)'
            )
        try:
            rules.append(TopicRule(**values))
        except ConfigError as error:
            raise ConfigError(f"{source}: {error}") from None
    return tuple(rules)
