"""Broker configuration: defaults, a TOML file, environment variables, flags.

Later sources override earlier ones: built-in defaults, then the ``[broker]``
table of a TOML file (or its top level), then ``BROKER_<FIELD>`` environment
variables (``BROKER_LISTEN=0.0.0.0:7400``), then command-line flags.
Every budget and watermark is a field of :class:`BrokerConfig`.

The topic log's settings are ``data_dir`` and ``memory_only`` (where the
logs live, or none at all) and ``[[topics]]`` tables (:class:`TopicRule`:
retention and flush policy per topic pattern, first match wins).
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import math
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from broker._env_names import ENV_PREFIX, mistaken_names, settings_in
from broker._topic_rules import (
    DEFAULT_TOPIC_RULE,
    FLUSH,
    TOPIC_KEYS,
    WHEN_FULL,
    ConfigError,
    GiB,
    KiB,
    MiB,
    TopicRule,
    parse_address,
    parse_topic_rules,
)
from broker.errors import BrokerError

__all__ = [
    "DEFAULT_TOPIC_RULE",
    "FIELDS",
    "FLUSH",
    "LOOPBACK",
    "MAX_WORKERS",
    "TOPIC_KEYS",
    "WHEN_FULL",
    "BrokerConfig",
    "ConfigError",
    "GiB",
    "KiB",
    "MiB",
    "TopicRule",
    "load_config",
    "parse_address",
    "parse_topic_rules",
    "read_toml",
]

if TYPE_CHECKING:
    from broker.log import LogConfig

#: ``max_message`` by default; lowered to what the smallest topic log term
#: holds (``term_bytes - 64``) when a ``[[topics]]`` table's is smaller.
DEFAULT_MAX_MESSAGE = 8 * 1024 * 1024

#: Most worker processes ``broker serve --workers`` runs.
MAX_WORKERS = 256

#: Hosts that do not leave the machine.
LOOPBACK = frozenset({"127.0.0.1", "::1", "localhost"})


@dataclass(frozen=True)
class BrokerConfig:
    """Everything a broker needs to know; all sizes are in bytes, times in seconds."""

    #: Where clients connect (port 0 picks a free port).
    listen: str = "127.0.0.1:7400"
    #: Where Prometheus scrapes ``/metrics`` ("" disables the endpoint).
    metrics_listen: str = "127.0.0.1:9400"
    #: Where MQTT 3.1.1 and 5.0 clients connect ("" = no MQTT listener, the
    #: default; MQTT's usual port is 1883). See docs/mqtt.md.
    mqtt_listen: str = ""
    #: Connections ``/metrics`` exports per-connection series of, and
    #: ``/stat.json`` details: this many with the most debt (blocked ones
    #: first), and up to this many more with the most queued deliveries or
    #: unsent output; ``/stat.json`` lists this many topics (most queued
    #: first). Totals always cover every connection; 0 details none.
    metrics_top: int = 10
    #: Largest frame body a client may send (announced in Welcome).
    max_frame: int = 64 * KiB
    #: Largest message (its Publish body) a client may publish: one larger
    #: than ``max_frame`` is sent in parts of a frame each, on its topic's
    #: channel, and reassembled (see "Messages larger than a frame" in the
    #: protocol description); a connection holds at most this many bytes of
    #: messages in parts. Topic logs' ``term_bytes`` must hold it (the
    #: default is lowered to what the smallest term holds).
    max_message: int = DEFAULT_MAX_MESSAGE
    #: Heartbeat interval and lease announced to clients.
    heartbeat: float = 5.0
    lease: float = 15.0
    #: Buffer capacity of a new publish channel. Idle channels are shrunk, down
    #: to one frame (``max_frame + 64``), to fund new ones.
    publish_capacity: int = 256 * KiB
    #: Buffer capacity of each bind channel (live handles hold their bind bytes,
    #: so this bounds how many topics a connection binds at once; the
    #: subscription bind channel grows past it up to ``max_subscriptions``).
    bind_capacity: int = 16 * KiB
    #: Most subscriptions one connection holds at once: the broker grants room
    #: for no more Subscribe frames (and says Throttled on ``[1, 0]`` near it).
    max_subscriptions: int = 10_000
    #: Buffer budget of one connection, shared by its channels.
    connection_budget: int = 4 * MiB
    #: Buffer budget of the whole broker, shared by its connections.
    global_budget: int = 256 * MiB
    #: A channel's account withholds guarantees above this debt...
    channel_high_watermark: int = 1 * MiB
    #: ...and resumes at or below this one.
    channel_low_watermark: int = 512 * KiB
    #: The connection's account stops the socket reader above this debt (the
    #: backstop; well above one channel's) and resumes at the low one.
    connection_high_watermark: int = 4 * MiB
    connection_low_watermark: int = 2 * MiB
    #: The reader stops while this many bytes wait to be written to a client
    #: that does not read its socket.
    max_unsent: int = 4 * MiB
    #: The most a connection's lossy and latest subscription queues hold together
    #: (each also within its own max_queued_bytes): beyond it, their oldest
    #: deliveries are dropped.
    lossy_budget: int = 16 * MiB
    #: A publish channel withheld (its account above the watermark) for this many
    #: seconds is announced to its client with Throttled (an advisory).
    throttle_notice_after: float = 1.0
    #: Most bytes of staged publishes (exactly-once publishing) held at once,
    #: their bookkeeping included; a publish beyond it ends its connection
    #: with Goodbye 3.
    staging_limit: int = 512 * MiB
    #: Seconds a staged batch that stages nothing more may wait for its commit
    #: or abort before it is discarded.
    staging_ttl: float = 3600.0
    #: Committed and aborted batches remembered, so that committing one again
    #: changes nothing (a retried commit, a streaming batch run twice).
    staging_remember: int = 100_000
    #: Most connections served at once; more are refused with Goodbye 3.
    max_connections: int = 10_000
    #: Seconds a graceful shutdown waits for connections to drain.
    shutdown_deadline: float = 5.0
    #: TLS on the client listener: a PEM certificate chain and its key ("" = plain TCP).
    tls_cert: str = ""
    tls_key: str = ""
    #: PEM file of the CAs that sign client certificates: when set, every client
    #: must present one (mutual TLS); its common name is the client's identity.
    tls_client_ca: str = ""
    #: Seconds a client has to complete the TLS handshake.
    tls_handshake_timeout: float = 10.0
    #: Seconds a new connection has to send its Hello (after any TLS handshake),
    #: however much else it sends meanwhile.
    hello_timeout: float = 10.0
    #: Most connections from one client address (an IPv6 /64) not welcomed yet
    #: (in their TLS handshake, before their Hello, or waiting for a refusal)
    #: while the broker serves half of ``max_connections`` or more; more are
    #: refused with Goodbye 3. 0: no limit.
    max_unwelcomed_per_address: int = 64
    #: A failed authentication is refused after this many seconds, doubled for
    #: each further failure in a row from the same address...
    auth_failure_delay: float = 0.5
    #: ...up to this many (0 and 0: refused at once).
    auth_failure_delay_max: float = 10.0
    #: The broker process's garbage collector runs a young collection after
    #: this many new container objects (Python's default is 700; 0 leaves
    #: Python's settings alone). Every message makes a few short-lived objects
    #: and few cycles, so the default spends about a quarter of the broker's
    #: CPU less on collections that find nothing. ``broker serve`` applies it,
    #: and freezes what start-up allocated out of every collection's way.
    gc_threshold: int = 50_000
    #: TOML file of principals (tokens, certificate identities, limits): when
    #: set, every client must authenticate in its Hello (see ``broker.auth``).
    auth_file: str = ""
    #: Count the event loop's task steps and sleeping I/O waits (metrics
    #: ``broker_loop_*``, ``/stat.json``): a measuring aid; each task step
    #: then costs a Python call.
    loop_counters: bool = False
    #: Directory of the topic logs (and what else survives a restart); ""
    #: here means none (memory-only), and ``broker serve`` fills it with the
    #: default location: $STATE_DIRECTORY, else $XDG_STATE_HOME/broker, else
    #: ~/.local/state/broker. See :attr:`log_dir`.
    data_dir: str = ""
    #: Keep no topic log at all, whatever ``data_dir`` says (what the broker
    #: did before it had logs): topics are not retained, nothing survives a restart.
    memory_only: bool = False
    #: Most topic log files held open at once (a log's active term file, and
    #: its sealed terms mapped for reads): beyond it the least recently used
    #: is closed (synced first) and opens again at its next use. 0: a quarter of the open-file limit
    #: (RLIMIT_NOFILE, as ``broker serve`` raised it), at least 16.
    max_open_log_files: int = 0
    #: Worker processes of ``broker serve``: a number, or "auto" (one per
    #: core). With more than one, a supervisor runs them behind ``listen``
    #: and each owns a share of the topics (see "Workers" in the operations guide).
    workers: str = "1"
    #: The host clients are told to reach each worker's direct address at
    #: (multi-worker brokers; "": the ``listen`` host, or this machine's
    #: hostname when that is a wildcard such as 0.0.0.0).
    advertise_host: str = ""
    #: The first port of the workers' direct addresses (worker i listens on
    #: this + i, on the ``listen`` host); 0: ports of the system's choosing.
    worker_port: int = 0
    #: Cluster mode: the NATS servers of a JetStream cluster that keeps
    #: every topic (``nats://HOST:PORT``, comma-separated; credentials as
    #: ``nats://USER:PASSWORD@HOST:PORT``). Empty: a standalone broker.
    #: The broker is then a front end: the topics' records live in the
    #: cluster, its data directory holds caches (see "Cluster mode" in the
    #: operations guide).
    cluster: str = ""
    #: Cluster mode: copies of each topic's stream (1, 3 or 5; 3 survives
    #: the loss of one server).
    cluster_replicas: int = 3
    #: Cluster mode: the most topics (one replicated stream each); a client
    #: that makes one more is refused with one line.
    cluster_max_topics: int = 1000
    #: Cluster mode: run even if the NATS servers do not fsync every write
    #: (``jetstream { sync_interval: always }``): records confirmed could
    #: then be lost when servers lose power together.
    cluster_unsafe_sync: bool = False
    #: Cluster mode: where this front end takes the other front ends' links
    #: (``HOST:PORT``; "": the ``listen`` host, a port of the system's
    #: choosing). The others reach it at ``advertise_host`` and this port.
    cluster_link_listen: str = ""
    #: The ``[[topics]]`` tables, in order: the first whose pattern matches a
    #: topic gives its log's retention and flush policy (:meth:`log_config`).
    topics: tuple[TopicRule, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "topics", tuple(self.topics))
        object.__setattr__(self, "workers", str(self.workers).strip().lower())
        if self.workers != "auto" and not (
            self.workers.isdigit() and 1 <= int(self.workers) <= MAX_WORKERS
        ):
            raise ConfigError(
                f'workers must be a number from 1 to {MAX_WORKERS} or "auto" '
                f"(one per core), got {self.workers!r}"
            )
        for rule in self.topics:
            if not isinstance(rule, TopicRule):
                raise ConfigError(f"topics: expected TopicRule items, got {rule!r}")
        if "\0" in self.data_dir:
            raise ConfigError("data_dir must not contain a NUL character")
        rules = () if self.memory_only else (*self.topics, DEFAULT_TOPIC_RULE)
        smallest = min((rule.term_bytes for rule in rules), default=0) - 64
        if self.max_message == DEFAULT_MAX_MESSAGE and 0 < smallest < self.max_message:
            # The default follows the smallest term (one set is checked below).
            object.__setattr__(self, "max_message", max(smallest, self.max_frame))
        for rule in rules:
            largest = max(self.max_frame, self.max_message)
            if rule.term_bytes < largest + 64:
                least = (
                    "must hold the largest message: at least "
                    f"{'max_message' if self.max_message > self.max_frame else 'max_frame'}"
                    f" + 64 ({largest + 64})"
                )
                if rule is DEFAULT_TOPIC_RULE:
                    raise ConfigError(
                        f"term_bytes of topics without a [[topics]] table ({rule.term_bytes}, "
                        f'the default) {least}: set it in a [[topics]] table (pattern = "*" for '
                        "every topic)"
                    )
                raise ConfigError(
                    f"term_bytes of [[topics]] pattern {rule.pattern!r} ({rule.term_bytes}) {least}"
                )
        parse_address(self.listen)
        if self.metrics_listen:
            parse_address(self.metrics_listen)
        if self.mqtt_listen:
            parse_address(self.mqtt_listen)
        if self.metrics_top < 0:
            raise ConfigError("metrics_top must be >= 0 (0 exports no per-connection series)")
        if not 0 <= self.worker_port <= 65535 - MAX_WORKERS:
            raise ConfigError(f"worker_port must be 0 (any) or a port up to {65535 - MAX_WORKERS}")
        if self.gc_threshold < 0:
            raise ConfigError("gc_threshold must be >= 0 (0 keeps Python's own)")
        if self.max_frame < 1024:
            raise ConfigError("max_frame must be at least 1024 bytes")
        if self.max_message < 1024:
            raise ConfigError("max_message must be at least 1024 bytes")
        if self.publish_capacity < self.min_publish_capacity:
            raise ConfigError(
                f"publish_capacity ({self.publish_capacity}) must hold a whole frame: "
                f"at least max_frame + 64 ({self.min_publish_capacity})"
            )
        if self.bind_capacity < 1024:
            raise ConfigError("bind_capacity must be at least 1024 bytes")
        if self.max_subscriptions < 1:
            raise ConfigError("max_subscriptions must be at least 1")
        if self.connection_budget < 2 * self.bind_capacity + self.min_publish_capacity:
            raise ConfigError(
                f"connection_budget ({self.connection_budget}) must fund both bind channels and "
                "one publish channel: at least 2 x bind_capacity + max_frame + 64 "
                f"({2 * self.bind_capacity + self.min_publish_capacity})"
            )
        if self.global_budget < self.connection_budget:
            raise ConfigError(
                f"global_budget ({self.global_budget}) must be >= connection_budget "
                f"({self.connection_budget})"
            )
        for low, high in (
            ("channel_low_watermark", "channel_high_watermark"),
            ("connection_low_watermark", "connection_high_watermark"),
        ):
            if not 0 <= getattr(self, low) <= getattr(self, high):
                raise ConfigError(f"need 0 <= {low} <= {high}")
        if self.heartbeat <= 0 or self.lease <= self.heartbeat:
            raise ConfigError(
                f"heartbeat must be above 0 and below lease, got heartbeat {self.heartbeat!r} "
                f"and lease {self.lease!r}"
            )
        if self.throttle_notice_after < 0:
            raise ConfigError("throttle_notice_after must be >= 0")
        for setting, ok, bound in (
            ("staging_limit", self.staging_limit >= 0, ">= 0"),
            ("staging_ttl", self.staging_ttl > 0, "> 0"),
            ("staging_remember", self.staging_remember >= 1, ">= 1"),
            ("max_unsent", self.max_unsent >= 64 * KiB, ">= 64 KiB (65536)"),
            ("max_connections", self.max_connections >= 1, ">= 1"),
            ("max_open_log_files", self.max_open_log_files >= 0, ">= 0 (0: derived)"),
            ("shutdown_deadline", self.shutdown_deadline >= 0, ">= 0"),
            ("tls_handshake_timeout", self.tls_handshake_timeout > 0, "> 0"),
            ("hello_timeout", self.hello_timeout > 0, "> 0"),
        ):
            if not ok:
                raise ConfigError(f"{setting} must be {bound}, got {getattr(self, setting)!r}")
        if self.lossy_budget < 64 * KiB:
            raise ConfigError("lossy_budget must be at least 64 KiB")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError("tls_cert and tls_key go together: set both or neither")
        if self.tls_client_ca and not self.tls_cert:
            raise ConfigError("tls_client_ca (mutual TLS) needs tls_cert and tls_key")
        if self.max_unwelcomed_per_address < 0:
            raise ConfigError("max_unwelcomed_per_address must be >= 0 (0: no limit)")
        if not 0 <= self.auth_failure_delay <= self.auth_failure_delay_max:
            raise ConfigError("need 0 <= auth_failure_delay <= auth_failure_delay_max")
        if self.cluster:
            for server in self.cluster_servers:
                scheme, _, rest = server.partition("://")
                if scheme not in ("nats", "tls") or not rest.rpartition("@")[2]:
                    raise ConfigError(
                        f"cluster: {server!r} is not a NATS server URL "
                        "(nats://HOST:PORT or tls://HOST:PORT, comma-separated)"
                    )
            if self.cluster_replicas not in (1, 3, 5):
                raise ConfigError(
                    f"cluster_replicas must be 1, 3 or 5, got {self.cluster_replicas!r}"
                )
            if self.cluster_max_topics < 1:
                raise ConfigError("cluster_max_topics must be at least 1")
            if self.cluster_link_listen:
                parse_address(self.cluster_link_listen)
            if self.workers not in ("1",):
                raise ConfigError(
                    "cluster mode runs one process per front end: run more front ends "
                    "instead of workers (workers = 1)"
                )
            if self.memory_only:
                raise ConfigError(
                    "cluster mode keeps every topic in the cluster: it cannot be memory_only"
                )
        if self.mqtt_listen and (self.cluster or self.workers != "1"):
            raise ConfigError(
                "mqtt_listen: MQTT is served by a single-process broker only for now "
                "(workers = 1, no cluster)"
            )

    @property
    def cluster_servers(self) -> list[str]:
        """The NATS server URLs of ``cluster`` (none: standalone)."""
        return [server.strip() for server in self.cluster.split(",") if server.strip()]

    @property
    def worker_count(self) -> int:
        """How many worker processes ``workers`` asks for ("auto": the cores
        this process may run on)."""
        if self.workers == "auto":
            return max(1, min(MAX_WORKERS, len(os.sched_getaffinity(0))))
        return int(self.workers)

    @property
    def min_publish_capacity(self) -> int:
        """The smallest useful publish channel: one frame of ``max_frame``."""
        return self.max_frame + 64

    @property
    def listen_address(self) -> tuple[str, int]:
        return parse_address(self.listen)

    @property
    def cluster_link_address(self) -> tuple[str, int]:
        """Where a front end takes the other front ends' links."""
        if self.cluster_link_listen:
            return parse_address(self.cluster_link_listen)
        return self.listen_address[0], 0

    @property
    def mqtt_address(self) -> tuple[str, int] | None:
        """Where MQTT clients connect (None: no MQTT listener)."""
        return parse_address(self.mqtt_listen) if self.mqtt_listen else None

    @property
    def metrics_address(self) -> tuple[str, int] | None:
        return parse_address(self.metrics_listen) if self.metrics_listen else None

    @property
    def tls(self) -> bool:
        """Whether the client listener speaks TLS."""
        return bool(self.tls_cert)

    @property
    def log_dir(self) -> Path | None:
        """Where the topic logs live (``~`` expanded), or ``None`` for a
        memory-only broker: ``memory_only`` set, or ``data_dir`` empty (the
        library default; ``broker serve`` fills in a default location)."""
        if self.memory_only or not self.data_dir:
            return None
        return Path(self.data_dir).expanduser()

    def topic_rule(self, topic: str) -> TopicRule:
        """The first ``[[topics]]`` rule matching ``topic``, else the defaults."""
        for rule in self.topics:
            if rule.matches(topic):
                return rule
        return DEFAULT_TOPIC_RULE

    def log_config(self, topic: str) -> LogConfig:
        """The :class:`broker.log.LogConfig` of ``topic``'s log: from the first
        ``[[topics]]`` table whose pattern matches it, else the defaults."""
        return self.topic_rule(topic).log_config()

    def replace(self, **changes: Any) -> BrokerConfig:
        """A copy with ``changes`` applied (validated like a new config)."""
        return dataclasses.replace(self, **changes)


log = logging.getLogger("broker")

#: The settings given by name (file keys, BROKER_<NAME>, --set); the
#: ``topics`` rules come only from ``[[topics]]`` tables of a config file.
FIELDS = {f.name: f for f in fields(BrokerConfig) if f.name != "topics"}

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})


def _coerce(name: str, value: Any) -> Any:
    coerced = _coerce_type(name, value)
    if type(coerced) is float and not math.isfinite(coerced):
        raise ConfigError(f"{name}: expected a finite number, got {value!r}")
    return coerced


def _coerce_type(name: str, value: Any) -> Any:
    kind = type(getattr(BrokerConfig, name))
    if name == "workers" and isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
        raise ConfigError(f"{name}: expected true or false (1/0, yes/no), got {value!r}")
    if isinstance(value, kind) and not (kind is int and isinstance(value, bool)):
        return value
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return kind(value.replace("_", "") if kind in (int, float) else value)
        except ValueError:
            pass
    raise ConfigError(f"{name}: expected {kind.__name__}, got {value!r}")


def _apply(
    base: dict[str, Any],
    values: Mapping[str, Any],
    source: str,
    origins: dict[str, str] | None = None,
) -> None:
    for key, value in values.items():
        name = key.replace("-", "_")
        if name == "topics":
            raise ConfigError(f"{source}: topics are set by [[topics]] tables of a config file")
        if name not in FIELDS:
            close = difflib.get_close_matches(name, FIELDS, n=1, cutoff=0.8)
            meant = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{source}: unknown setting {key!r}{meant}")
        try:
            base[name] = _coerce(name, value)
        except ConfigError as error:
            shown = f"{ENV_PREFIX}{name.upper()}" if source == "environment" else source
            raise ConfigError(f"{error} (set by {shown})") from None
        if origins is not None:
            origins[name] = source


def _follow_max_frame(values: dict[str, Any]) -> None:
    """A ``max_frame`` set above what the defaults fund raises the budgets
    not set with it: ``publish_capacity`` to one frame (``max_frame +
    64``), ``connection_budget`` to both bind channels and that,
    ``global_budget`` to that; so raising it takes one setting."""
    frame = values.get("max_frame")
    if not isinstance(frame, int):
        return

    def default(name: str) -> int:
        value = FIELDS[name].default
        assert isinstance(value, int)
        return value

    publish = values.setdefault("publish_capacity", max(default("publish_capacity"), frame + 64))
    bind = values.get("bind_capacity", default("bind_capacity"))
    if isinstance(publish, int) and isinstance(bind, int):
        least = 2 * bind + publish
        budget = values.setdefault("connection_budget", max(default("connection_budget"), least))
        if isinstance(budget, int):
            values.setdefault("global_budget", max(default("global_budget"), budget))


def read_toml(path: str | os.PathLike[str], what: str, error: type[BrokerError]) -> dict[str, Any]:
    """The TOML document at ``path`` (UTF-8); any failure to read or parse it
    raises ``error`` with a message naming ``what`` and the file."""
    try:
        return tomllib.loads(Path(path).read_bytes().decode("utf-8"))
    except OSError as failure:
        raise error(f"cannot read {what} {path}: {failure.strerror}") from None
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as failure:
        raise error(f"{what} {path}: {failure}") from None


def load_config(
    path: str | os.PathLike[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> BrokerConfig:
    """Defaults, then the TOML file at ``path``, then the environment, then ``overrides``."""
    values: dict[str, Any] = {}
    #: Where each setting given came from (the last source that gave it).
    origins: dict[str, str] = {}
    if path is not None:
        data = read_toml(path, "config", ConfigError)
        table = data.get("broker", data)
        if not isinstance(table, dict):
            raise ConfigError(f"config {path}: [broker] must be a table")
        if "broker" in data:
            # (Keys above [broker], or a misspelt table, were ignored in silence.)
            outside = sorted(key for key in data if key not in ("broker", "topics"))
            if outside:
                raise ConfigError(
                    f"config {path}: {', '.join(map(repr, outside))} outside the [broker] "
                    "table: a file with a [broker] table takes settings only there "
                    "(and [[topics]] tables)"
                )
        table = dict(table)
        tables = table.pop("topics", None)
        if "broker" in data and "topics" in data:
            if tables is not None:
                raise ConfigError(f"config {path}: both [[topics]] and [[broker.topics]]: use one")
            tables = data["topics"]
        if tables is not None:
            values["topics"] = parse_topic_rules(tables, f"config {path}")
        _apply(values, table, f"config {path}", origins)
    env = os.environ if environ is None else environ
    for key, meant in mistaken_names(env, FIELDS):
        log.warning(
            "ignoring the environment variable %s: no such setting (did you mean %s?)", key, meant
        )
    _apply(
        values,
        settings_in(env, FIELDS),
        "environment",
        origins,
    )
    _apply(values, {k: v for k, v in (overrides or {}).items() if v is not None}, "flags", origins)
    _follow_max_frame(values)
    try:
        return BrokerConfig(**values)
    except TypeError as error:  # pragma: no cover - guarded by _apply
        raise ConfigError(str(error)) from None
    except ConfigError as error:
        # Say where the value the message names came from (file, BROKER_..., a flag).
        message = str(error)
        name = message.split(" ", 1)[0]
        origin = origins.get(name)
        if origin is None or origin == "flags":  # (a flag: the user just typed it)
            raise
        where = f"{ENV_PREFIX}{name.upper()}" if origin == "environment" else origin
        raise ConfigError(f"{message} (set by {where})") from None
