"""What the broker offers its parts, grouped by job: :class:`BrokerServices`.

The :class:`~._broker.Broker` makes each service once; a part is handed
only the services it uses (a connection's publishing gets the topic
directory, the commits and the origin filter; its admission the gate, the
sessions and the storage), never the whole broker. Nothing here imports
the broker or its cluster package: a worker's links reach the directory
through :class:`Placement`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import trio

from accounts import Account
from actors import ActorSystem
from broker.auth import AuthFailure, AuthTable
from broker.config import BrokerConfig
from broker.protocol import Cluster, OriginRun
from broker.protocol.connection import BrokerSessionState

from ._peer_logging import PeerLog
from ._peers import AddressTable
from ._principal_usage import PrincipalUsage, SecurityCounters
from .connection._budget_pool import BudgetPool
from .connection._reassembly import ReassemblyRoom
from .patterns._registry import PatternRegistry
from .sessions._records import SessionRecords
from .sessions._session import SessionTable
from .staging._area import BatchKey, StagedPublish, StagingArea
from .staging._in_flight import CommitInFlight
from .staging._registry import CommitRegistry
from .staging._stream import StagingStore
from .storage._publish_marks import held_publishes
from .storage._topic_logs import TopicLogs, TopicUnavailable
from .topics._groups import Groups
from .topics._log_subscription import CursorBook
from .topics._topic import Topic
from .transport._wake import Outbox

__all__ = [
    "BrokerServices",
    "Commits",
    "ConnectionResources",
    "Gate",
    "Lifecycle",
    "OriginFilter",
    "Placement",
    "Storage",
    "TopicDirectory",
]


class Lifecycle:
    """Whether the broker is shutting down, and its nursery for jobs."""

    __slots__ = ("closing", "nursery")

    def __init__(self) -> None:
        #: A shutdown began: nothing more is forwarded, confirmed or accepted.
        self.closing = False
        #: The broker's nursery (None until it runs).
        self.nursery: trio.Nursery | None = None

    def start_soon(self, job: Callable[[], Awaitable[object]]) -> None:
        """Run ``job`` in the broker's nursery (not at all once it stops)."""
        if self.nursery is not None:
            self.nursery.start_soon(job)


class Placement(Protocol):
    """Which worker serves a topic (a worker's links, ``cluster._link_table``)."""

    def not_owned(self, topic: str) -> str | None:
        """Why ``topic`` is not served here without forwarding (None: it is)."""
        ...

    def stand_in(self, name: str, registry: dict[str, Topic]) -> Topic | None:
        """The forwarding stand-in of a topic another worker owns (None: owned here)."""
        ...


class TopicDirectory:
    """The topic actors by name, made on first use, and the pattern
    subscriptions told of each made (see ``patterns``)."""

    __slots__ = ("_life", "_system", "logs", "patterns", "placement", "topics")

    def __init__(self, system: ActorSystem, logs: TopicLogs | None, life: Lifecycle) -> None:
        self._system = system
        self._life = life
        #: The topic logs (None: a memory-only broker).
        self.logs = logs
        self.topics: dict[str, Topic] = {}
        #: Live pattern subscriptions: told of each topic made and deleted.
        self.patterns = PatternRegistry()
        #: Which worker owns a topic (None: a single process, which owns all).
        self.placement: Placement | None = None

    def topic(self, name: str) -> Topic:
        """The topic actor for ``name``, spawned on first use: on a worker
        that does not own it, its forwarding stand-in (``cluster._forward``)."""
        topic = self.topics.get(name)
        if topic is None:
            logs = self.logs
            placement = self.placement
            if placement is not None and (stand_in := placement.stand_in(name, self.topics)):
                topic = stand_in
            elif logs is None:
                topic = Topic(name, self.topics)
            else:
                topic = Topic(name, self.topics, logs.open(name), logs)
            self.topics[name] = topic
            self._system.spawn(topic, name=f"topic:{name[:64]}")
            if self.patterns:
                self.patterns.topic_made(name)
        return topic

    def open_topics(self) -> list[str]:
        """The topics that have an actor now."""
        return list(self.topics)

    def is_open(self, name: str) -> bool:
        return name in self.topics

    async def stored_topics(self, match: Callable[[str], bool]) -> list[str]:
        """The topics on disk whose names ``match``, listed in a thread
        (none on a memory-only broker; on a worker, every worker's; in
        cluster mode, every topic's stream in the cluster, whichever front
        end made it)."""
        logs = self.logs
        if logs is None:
            return []
        if logs.replication is not None:
            names = await logs.replication.replicator.streams.topics()
            return [name for name in names if match(name)]
        stored = await trio.to_thread.run_sync(logs.store.list_topics, match)
        return [topic.name for topic in stored]

    def not_owned(self, topic: str) -> str | None:
        """Why ``topic`` is not served here without forwarding (None: it is)."""
        return self.placement.not_owned(topic) if self.placement else None

    def cannot_commit_to(self, topic: str) -> str | None:
        """Why a commit cannot route to ``topic`` here (None: it can): not
        owned here, or its log cannot be opened now (checked before the
        commit changes anything, so that it is refused, not cut off)."""
        why = self.not_owned(topic)
        if why is None and self.logs is not None:
            try:
                self.logs.open(topic)
            except TopicUnavailable as error:
                return str(error)
        return why

    def store_cursors(self) -> None:
        """Write the durable cursors' positions put since the last write."""
        if self.logs is not None:
            self.logs.cursors.write()

    def start_soon(self, job: Callable[[], Awaitable[object]]) -> None:
        """Run ``job`` (a scan of the stored topics) in the broker's nursery."""
        self._life.start_soon(job)


class Storage:
    """The broker's durable state: topic logs, cursors, groups, session
    records and the state journal (none of them on a memory-only broker)."""

    __slots__ = ("groups", "logs", "session_records")

    def __init__(
        self,
        logs: TopicLogs | None,
        groups: Groups | None,
        session_records: SessionRecords | None,
    ) -> None:
        self.logs = logs
        self.groups = groups
        self.session_records = session_records

    @property
    def offsets(self) -> bool:
        """Whether reliable deliveries are numbered by log offsets (topic logs kept)."""
        return self.logs is not None

    @property
    def cursors(self) -> CursorBook | None:
        """Where durable cursors are kept (None: a memory-only broker)."""
        return self.logs.cursors if self.logs is not None else None

    def persist_state(self) -> None:
        """Write the state journal's pending changes (staged publishes,
        commits, cursors) to its file before anything that relies on them
        is said to a client (no-op for a memory-only broker)."""
        if self.logs is not None:
            self.logs.persist_state()

    def held_publishes(self, session: bytes, state: BrokerSessionState) -> None:
        """Raise ``state``'s publish counts to what the topic logs held of
        them at the start (a session restored after a crash)."""
        if self.logs is not None:
            held_publishes(self.logs.marks, session, state, self.logs.end_of)


#: Route a committed batch's publishes (charged to the account) in the
#: broker's nursery; the callable last is called once they are routed.
StartCommit = Callable[[BatchKey, Account, list[StagedPublish], Callable[[], None]], None]


@dataclass(frozen=True, slots=True)
class Commits:
    """Exactly-once publishing: the staged publishes and the commits routing."""

    staging: StagingArea
    #: Commits being routed, by batch.
    in_flight: dict[BatchKey, CommitInFlight]
    #: Route a committed batch in the broker's nursery; ``done()`` once routed.
    start: StartCommit
    #: Cluster mode: the committed batches in the cluster (None: in the journal only).
    registry: CommitRegistry | None = None
    #: Cluster mode: the staged publishes in the cluster (None: in the journal only).
    staged: StagingStore | None = None


class Gate:
    """Who may connect: credentials, principals, per-address limits, and
    what a Welcome tells (epoch, membership, a session's home)."""

    __slots__ = ("auth", "cluster", "epoch", "home_address", "peers", "principals", "security")

    def __init__(
        self,
        auth: AuthTable | None,
        principals: dict[str, PrincipalUsage],
        peers: AddressTable,
        security: SecurityCounters,
        epoch: bytes,
        cluster: Cluster | None,
        home_address: Callable[[bytes], str | None],
    ) -> None:
        #: Who may connect (None: anybody, unauthenticated).
        self.auth = auth
        self.principals = principals
        self.peers = peers
        self.security = security
        self.epoch = epoch
        #: The membership a Welcome carries to clients that ask (None: one process).
        self.cluster = cluster
        #: Where a resume of a session belongs, if another worker holds it.
        self.home_address = home_address

    def auth_failed(self, reason: AuthFailure) -> None:
        """Count a refused client."""
        self.security.auth_failures[reason.value] += 1

    def reader_of(self, principal: str | None) -> Callable[[str], bool]:
        """Whether ``principal`` may subscribe to a topic (anybody may on a
        broker without authentication)."""
        found = (
            None if self.auth is None or principal is None else self.auth.principals.get(principal)
        )
        return (lambda _topic: True) if found is None else found.may_subscribe


class ConnectionResources:
    """What connections share: the root account, the receive-buffer budget,
    the reassembly slots, the outbox of a read's output and the peer log."""

    __slots__ = (
        "account",
        "budget_pool",
        "buffer_reserved",
        "config",
        "outbox",
        "peer_log",
        "reassembly",
    )

    def __init__(self, config: BrokerConfig, account: Account, peer_log: PeerLog) -> None:
        self.config = config
        #: The root account connections' accounts roll up to.
        self.account = account
        #: Log lines clients cause, rate-limited per client address.
        self.peer_log = peer_log
        #: A read's output, written by the task that handled it (see ``_wake``).
        self.outbox = Outbox()
        #: The connections sharing ``global_budget`` (see ``_budget_pool``).
        self.budget_pool = BudgetPool()
        #: Connections that may hold messages in parts at once (``_reassembly``).
        self.reassembly = ReassemblyRoom(config.global_budget // config.max_message)
        #: Receive-buffer capacity reserved by all connections.
        self.buffer_reserved = 0


class OriginFilter(Protocol):
    """What a topic's owner took of each forwarded origin (the workers'
    dedup, ``broker.server.cluster._origin_dedup.SeenOrigins``)."""

    #: Whether its own clients' publishes are noted too (cluster mode: a
    #: session moves between live front ends, and what one forwards may
    #: come again from the client through another).
    notes_local: bool

    def take(
        self, topic: str, origins: list[OriginRun], tails: list[bytes], keys: list[bytes | None]
    ) -> tuple[list[bytes], list[bytes | None], int, list[OriginRun]] | None:
        """None if none of these publishes was taken before; else the tails
        and keys not taken before, how many were left out, and their runs."""
        ...

    def high(self, topic: str, session: bytes, handle: int) -> int:
        """The highest publish index of (``session``, ``handle``) known taken
        for ``topic`` (0: none known)."""
        ...


@dataclass(frozen=True, slots=True)
class BrokerServices:
    """The broker's services by name, made once by the broker; each part of
    a connection is handed the ones it uses."""

    config: BrokerConfig
    life: Lifecycle
    topics: TopicDirectory
    storage: Storage
    sessions: SessionTable
    commits: Commits
    gate: Gate
    resources: ConnectionResources
    #: What this worker took of forwarded publishes.
    seen: OriginFilter
