"""The broker: a listener, its connections, the topic actors, budgets, shutdown."""

from __future__ import annotations

import contextlib
import hmac
import itertools
import logging
import secrets
import ssl
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import trio

from accounts import Account, unlimited
from actors import ActorSystem, open_system
from broker.auth import (
    AuthTable,
    load_auth_file,
)
from broker.config import LOOPBACK, BrokerConfig, ConfigError
from broker.nats import JetStreamError
from broker.protocol import Cluster, GoodbyeCode, Hello
from broker.protocol import Goodbye as GoodbyeMessage
from broker.protocol.connection._core import MAX_HELLO_FRAME
from broker.protocol.frames import encode
from broker.tls import certificate_identity, server_context, server_handshake

from ._accept_logging import quiet_accept_errors
from ._loop_counters import LoopCounters
from ._memory import MemoryReturn
from ._peer_logging import LINE_CHARS, PeerLog, shown
from ._peers import AddressTable, address_key, peer_key
from ._principal_usage import PrincipalUsage, SecurityCounters, check_budget_shares
from ._services import (
    BrokerServices,
    Commits,
    ConnectionResources,
    Gate,
    Lifecycle,
    Storage,
    TopicDirectory,
)
from ._shutdown import drain, queued_deliveries
from ._view import ConnectionView
from .cluster._connection_counts import SharedCounts
from .cluster._front_ends import FrontEndPlacement, FrontEndSetup, KeptListener
from .cluster._handover import (
    first_hello,
    hand_over,
    hello_session,
    home_address,
    peek_hello,
    receive_sockets,
    session_prefix,
)
from .cluster._link import LinkStatistics
from .cluster._link_table import Links
from .cluster._origin_dedup import SeenOrigins
from .cluster._placement import WorkerSetup
from .cluster._stored_counts import OwnedCounts, StoredCounts, StoredCountsUnavailable
from .connection._budget_pool import BudgetPool
from .connection._connection import ServerConnection
from .connection._reassembly import ReassemblyRoom
from .mqtt._listener import MQTTCannotListen, MQTTServer, MQTTTotals
from .sessions._cluster_records import (
    ClaimedSession,
    ClusterRecords,
    RecordBucket,
    RecordsUnavailable,
)
from .sessions._kv_bucket import BUCKET, JetStreamRecordBucket, open_record_bucket
from .sessions._records import SessionRecords, forget_sessions
from .sessions._restore import claimed_topics, restore_claimed, restore_sessions
from .sessions._session import SessionTable
from .staging._area import BatchKey, StagedPublish, StagingArea
from .staging._commit import CommitInFlight, complete_unfinished, start_commit
from .staging._registry import BUCKET as COMMITS_BUCKET
from .staging._registry import CommitRegistry
from .staging._stream import STREAM as STAGING_STREAM
from .staging._stream import (
    StagingCounters,
    StagingStore,
    StagingUnavailable,
    drop_quietly,
    open_staging_stream,
)
from .storage._cluster_cursors import BUCKET as CURSORS_BUCKET
from .storage._cluster_groups import BUCKET as GROUPS_BUCKET
from .storage._jetstream import ClusterUnavailable, JetStreamRuns, open_jetstream_runs
from .storage._kv_state import KeyedBucket, StateBuckets
from .storage._replication import RunStreams
from .storage._topic_logs import Replication, TopicLogs, patiently
from .topics._groups import Groups
from .topics._log_subscription import CursorBook
from .topics._topic import Topic
from .transport._replayed import ReplayedStream
from .transport._wake import Outbox

log = logging.getLogger("broker.server")

#: The most time spent refusing a connection (its TLS handshake included).
REFUSAL_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class BrokerStatistics:
    """A snapshot of a running broker."""

    connections: int
    connections_total: int
    refused_total: int
    topics: int
    subscriptions: int
    buffer_reserved_bytes: int
    buffer_budget_bytes: int
    debt: int


class Broker:
    """A running broker; obtained from :func:`serve_broker`'s ``task_status``."""

    def __init__(
        self,
        config: BrokerConfig,
        system: ActorSystem,
        *,
        ssl_context: ssl.SSLContext | None = None,
        auth: AuthTable | None = None,
        logs: TopicLogs | None = None,
        worker: WorkerSetup | None = None,
        front_end: FrontEndPlacement | None = None,
        commit_records: KeyedBucket | None = None,
        staged: StagingStore | None = None,
    ) -> None:
        self.config = config
        #: Cluster mode with several front ends: this one's place among them
        #: (None: a standalone broker, a worker, or a front end alone).
        self.front_end = front_end
        #: This broker's place among the workers of a multi-worker broker
        #: (None: a single-process broker, which owns every topic).
        self.worker = worker
        #: The topic logs (None: a memory-only broker).
        self.logs = logs
        #: The event loop's counters (None unless ``loop_counters``).
        self.loop: LoopCounters | None = None
        #: TLS for the client listener (None: plain TCP).
        self.ssl_context = ssl_context
        #: Who may connect (None: anybody, unauthenticated).
        self.auth = auth
        #: Per principal of ``auth``: its connections and buffer reservations.
        self.principals: dict[str, PrincipalUsage] = {
            name: PrincipalUsage(principal, buffer_budget=principal.budget(config.global_budget))
            for name, principal in (auth.principals.items() if auth else ())
        }
        self.security = SecurityCounters()
        #: Per client address: connections not welcomed yet, failed authentications.
        self.peers = AddressTable(
            config.max_unwelcomed_per_address,
            config.auth_failure_delay,
            config.auth_failure_delay_max,
        )
        #: True while the listener accepts clients (readiness).
        self.accepting = False
        #: TLS handshakes in progress (they count against ``max_connections``).
        self.handshaking = 0
        self.epoch = secrets.token_bytes(8)
        self.system = system
        #: The root account: all connections' debt rolls up here (never blocks).
        self.account: Account = unlimited("broker", kind="broker")
        #: Connections' shared resources (budget pool, reassembly, outbox, peer log).
        self.resources = ConnectionResources(config, self.account, PeerLog(log, trio.current_time))
        #: Whether the broker is shutting down, and its nursery.
        self.life = Lifecycle()
        #: The topic actors, made on first use (see ``_services.TopicDirectory``).
        self.directory = TopicDirectory(system, logs, self.life)
        self.topics = self.directory.topics
        #: Live pattern subscriptions: told of each topic made and deleted.
        self.patterns = self.directory.patterns
        #: Client sessions: they outlive a broken connection by ``lease`` seconds.
        self.sessions = SessionTable(
            config.lease, b"" if worker is None else session_prefix(worker.cluster)
        )
        #: Connections handed over to the worker holding their session.
        self.handed_over_total = 0
        #: Where sessions are recorded to survive a restart (None: memory-only).
        self.session_records = SessionRecords(logs.journal, logs.marks) if logs else None
        self.sessions.records = self.session_records
        #: Cluster mode: the sessions' records in the cluster (None: elsewhere).
        self.copies: ClusterRecords | None = None
        #: Consumer groups (None: a memory-only broker keeps none).
        self.groups = Groups(self, logs.group_journal) if logs else None
        #: Commits being routed, by batch.
        self.commits_in_flight: dict[BatchKey, CommitInFlight] = {}
        #: What this worker took of forwarded publishes.
        self.seen = SeenOrigins.kept_in(logs.marks if logs else None)
        #: Staged publishes waiting for their batch's commit (exactly-once publishing).
        self.staging = StagingArea(
            self.account,
            limit=config.staging_limit,
            ttl=config.staging_ttl,
            remember=config.staging_remember,
            journal=logs.journal if logs is not None else None,
        )
        #: Hands freed heap memory back once the debt falls after a burst.
        self.memory = MemoryReturn(self.account)
        self.connections: dict[int, ServerConnection] = {}
        #: Called with each connection forgotten, its counters final (metrics fold
        #: them into broker-wide totals). A hook must be quick and must not raise.
        self.connection_closed_hooks: list[Callable[[ConnectionView], None]] = []
        self.connections_total = 0
        self.refused_total = 0
        #: Connections ended by an error of the broker's own (each logged).
        self.internal_errors = 0
        #: The shutdown sent every confirmed reliable delivery queued for a
        #: connected subscriber before its Goodbyes (False: time ran out first).
        self.shutdown_drained = False
        #: Connections the shutdown cut at its deadline (they had not drained).
        self.shutdown_cut = 0
        #: The address the listener is bound to (useful with port 0).
        self.address: tuple[str, int] = ("", 0)
        #: This worker's links to the others (None: a single process).
        placement: WorkerSetup | FrontEndPlacement | None = worker or front_end
        self.links = (
            None
            if placement is None
            else Links(self, placement, front_end.token if front_end else None)
        )
        self.directory.placement = self.links
        if logs is not None and self.links is not None:
            logs.owns = lambda topic: self.not_owned(topic) is None
        #: Cluster mode: per (topic, session, handle), the highest publish
        #: index the topic's stream holds (stored, not only taken): what a
        #: session resumed here or at another front end is counted from.
        self.stored = SeenOrigins()
        #: Several front ends: asks the others what their streams hold.
        self.stored_counts_asked: StoredCounts | None = None
        #: Cluster mode: what the streams of the topics owned here hold.
        self.owned_counts: OwnedCounts | None = None
        if logs is not None and logs.replication is not None:
            self.owned_counts = OwnedCounts(logs, self.stored)
            self.seen.notes_local = True
            # (What the streams' runs say of whose publishes they hold.)
            logs.origins_restored = self._origins_restored
            logs.replication.replicator.origins_stored = self.stored.stored
            logs.replication.replicator.outbox = self.outbox
        #: What the broker offers its parts (each connection part gets the ones it uses).
        self.services = BrokerServices(
            config=config,
            life=self.life,
            topics=self.directory,
            storage=Storage(logs, self.groups, self.session_records),
            sessions=self.sessions,
            commits=Commits(
                self.staging,
                self.commits_in_flight,
                self.start_commit,
                None if commit_records is None else CommitRegistry(commit_records, staged),
                staged,
            ),
            gate=Gate(
                auth,
                self.principals,
                self.peers,
                self.security,
                self.epoch,
                self.cluster,
                self.home_address,
            ),
            resources=self.resources,
            seen=self.seen,
        )
        #: The MQTT listener's clients (None: no ``mqtt_listen``).
        self.mqtt: MQTTServer | None = (
            MQTTServer(self.services, self._busy, self.ssl_context) if config.mqtt_listen else None
        )
        self._serials = itertools.count(1)
        #: Numbers the peers of connections that are no sockets (``handle_stream``).
        self._memory_peers = itertools.count(1)
        self._idle = trio.Event()
        self._idle.set()
        self._accept_scope = trio.CancelScope()

    # The directory's, the storage's and the gate's own, for the broker's
    # other users (its links, session restore, commits, tests).
    @property
    def closing(self) -> bool:
        """A shutdown began."""
        return self.life.closing

    @property
    def buffer_reserved(self) -> int:
        """Receive-buffer capacity reserved by all connections."""
        return self.resources.buffer_reserved

    @property
    def peer_log(self) -> PeerLog:
        return self.resources.peer_log

    @property
    def outbox(self) -> Outbox:
        return self.resources.outbox

    @property
    def budget_pool(self) -> BudgetPool:
        return self.resources.budget_pool

    @property
    def reassembly(self) -> ReassemblyRoom:
        return self.resources.reassembly

    @reassembly.setter
    def reassembly(self, room: ReassemblyRoom) -> None:
        self.resources.reassembly = room

    def topic(self, name: str) -> Topic:
        """The topic actor for ``name`` (see ``TopicDirectory.topic``)."""
        return self.directory.topic(name)

    def open_topics(self) -> list[str]:
        return self.directory.open_topics()

    async def stored_topics(self, match: Callable[[str], bool]) -> list[str]:
        return await self.directory.stored_topics(match)

    def store_cursors(self) -> None:
        self.directory.store_cursors()

    def start_soon(self, job: Callable[[], Awaitable[object]]) -> None:
        self.life.start_soon(job)

    def not_owned(self, topic: str) -> str | None:
        return self.directory.not_owned(topic)

    def start_commit(
        self,
        batch: BatchKey,
        account: Account,
        publishes: list[StagedPublish],
        done: Callable[[], None],
    ) -> None:
        """Route a committed batch's ``publishes`` (charged to ``account``) in
        the broker's own nursery (see ``_commit.start_commit``)."""
        assert self.life.nursery is not None
        start_commit(self.services, self.life.nursery, batch, account, publishes, done)

    def persist_state(self) -> None:
        self.services.storage.persist_state()

    @property
    def offsets(self) -> bool:
        return self.services.storage.offsets

    @property
    def cursors(self) -> CursorBook | None:
        return self.services.storage.cursors

    async def _expire_staging(self) -> None:
        """Discard staged batches left uncommitted for longer than ``staging_ttl``."""
        interval = min(self.config.staging_ttl / 4, 60.0)
        staged = self.services.commits.staged

        def dropped(batch: BatchKey, topics: set[str]) -> None:
            if staged is not None:
                self.life.start_soon(partial(drop_quietly, staged, batch, topics))

        while True:
            await trio.sleep(interval)
            self.staging.expire(trio.current_time(), dropped)

    def _busy(self) -> int:
        """Connections served or in their TLS handshake, of every protocol
        (what ``max_connections`` bounds)."""
        mqtt = 0 if self.mqtt is None else len(self.mqtt.connections)
        return len(self.connections) + self.handshaking + mqtt

    def mqtt_totals(self) -> MQTTTotals | None:
        """What the MQTT clients did (None: no MQTT listener)."""
        return None if self.mqtt is None else self.mqtt.totals()

    def forget(self, connection: ServerConnection) -> None:
        if self.connections.pop(connection.serial, None) is not None:
            for hook in self.connection_closed_hooks:
                hook(connection)
        self.peers.remove(peer_key(connection.peer), connection.protocol)
        if not self.connections:
            self._idle.set()

    def connection_views(self) -> list[ConnectionView]:
        """The live connections as observers read them (a list of its own:
        safe to walk across checkpoints, while connections come and go)."""
        return list(self.connections.values())

    def statistics(self) -> BrokerStatistics:
        return BrokerStatistics(
            connections=sum(not c.link for c in self.connections.values()),
            connections_total=self.connections_total,
            refused_total=self.refused_total,
            topics=len(self.topics),
            subscriptions=sum(len(t.subscriptions) for t in self.topics.values()),
            buffer_reserved_bytes=self.buffer_reserved,
            buffer_budget_bytes=self.config.global_budget,
            debt=self.account.debt,
        )

    def link_statistics(self) -> tuple[LinkStatistics, ...] | None:
        """A worker's links, per owner it forwards to (None: a single process)."""
        return self.links.statistics() if self.links is not None else None

    @property
    def ready(self) -> bool:
        """Whether the broker accepts new clients now (listening, not shutting down)."""
        return self.accepting and not self.closing

    @property
    def cluster(self) -> Cluster | None:
        """The membership a Welcome carries to clients that ask (None: one process)."""
        if self.front_end is not None:
            return self.front_end.cluster
        return None if self.worker is None else self.worker.cluster

    @property
    def front_ends(self) -> int:
        """Cluster mode: front ends in the membership it serves with (1: alone)."""
        return 1 if self.front_end is None else len(self.front_end.cluster.members)

    @property
    def staging_counters(self) -> StagingCounters | None:
        """Cluster mode: the staging stream's totals (None: not in cluster mode)."""
        staged = self.services.commits.staged
        return None if staged is None else staged.counters

    @property
    def sessions_claimed(self) -> int:
        """Cluster mode: sessions claimed from the bucket (see :meth:`_claim`)."""
        return 0 if self.copies is None else self.copies.claimed

    @property
    def sessions_taken(self) -> int:
        """Cluster mode: sessions another front end claimed from this one."""
        return 0 if self.copies is None else self.copies.taken

    def session_taken(self, session_id: bytes) -> None:
        """Another front end took session ``session_id`` over (cluster mode):
        its connection here lets go of it and closes, and it is forgotten
        here (its records are the other front end's now)."""
        session = self.sessions.sessions.get(session_id)
        if session is None:
            return
        if session.connection is not None:
            session.connection.hand_over()
        self.sessions.end(session, elsewhere=True)

    def _origins_restored(self, topic: str, held: dict[tuple[bytes, int], int]) -> None:
        """``topic``'s stream, restored, holds these publishes (by origin)."""
        self.seen.seed(topic, held)
        self.stored.seed(topic, held)

    async def stored_counts(self, session: bytes, pairs: list[tuple[int, str]]) -> dict[int, int]:
        """Cluster mode: per (handle, topic) of ``pairs`` whose topic this
        front end owns, how many of ``session``'s publishes on that handle
        the topic's stream holds (others, and all while shutting down, are
        left out: the asker asks again; see ``cluster._stored_counts``)."""
        if self.closing or self.owned_counts is None:
            await trio.lowlevel.checkpoint()
            return {}
        return await self.owned_counts.counts(
            session, pairs, lambda topic: self.not_owned(topic) is None
        )

    async def _claim(self, stream: trio.SocketStream) -> bool:
        """Cluster mode: if ``stream``'s Hello resumes a session this front
        end does not hold, claim it from the cluster and restore it
        (detached: the Hello then resumes it as usual), its publish counts
        raised to what the topics' streams hold (asked of their owners).
        Waits at most ``hello_timeout`` for the Hello; a session the
        cluster does not have is left to the Hello's own answer. False if
        the client was told to come back (Goodbye 5): the cluster cannot
        say now what it holds of the session."""
        session: bytes | None = None
        with trio.move_on_after(self.config.hello_timeout):
            session = await hello_session(stream.socket)
        return await self._claim_session(session, stream)

    async def _claim_secured(
        self, stream: trio.SSLStream[trio.abc.Stream]
    ) -> trio.abc.Stream | None:
        """:meth:`_claim` over TLS: the Hello is read from ``stream`` (after
        its handshake) and given again to the connection; the stream to
        serve, or None if the client was told to come back."""
        data = b""
        hello: Hello | None = None
        with trio.move_on_after(self.config.hello_timeout):
            done = False
            while not done:
                try:
                    chunk = await stream.receive_some(MAX_HELLO_FRAME + 4)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    break
                if not chunk:
                    break
                data += chunk
                done, hello = first_hello(data)
        session = None if hello is None else hello.session
        if not await self._claim_session(session, stream):
            return None
        return ReplayedStream(stream, data)

    def _shutdown_began(self) -> bool:
        """Whether the broker no longer takes connections (asked again after
        an await: a check before it does not hold after)."""
        return not self.ready

    async def _claim_session(self, session: bytes | None, stream: trio.abc.Stream) -> bool:
        """See :meth:`_claim`: claim ``session`` (None: nothing to claim),
        counted among the connections in their handshake meanwhile."""
        copies = self.copies
        assert copies is not None
        if session is None or session in self.sessions.sessions:
            return True
        self.handshaking += 1
        try:
            return await self._claimed(copies, session, stream)
        finally:
            self.handshaking -= 1

    async def _claimed(
        self, copies: ClusterRecords, session: bytes, stream: trio.abc.Stream
    ) -> bool:
        deadline = trio.current_time() + self.config.hello_timeout
        stored: dict[int, int] = {}

        async def count(claimed: ClaimedSession) -> None:
            # (Before the claim: a session claimed is one the front end that
            # held it lets go of. What the streams held then is at least what
            # the client saw confirmed: it lost its connection before this.)
            stored.clear()
            stored.update(await self._stored_of(session, claimed_topics(claimed), deadline))

        try:
            with trio.fail_at(deadline):
                claimed = await copies.claim(session.hex(), count)
            if claimed is None or session in self.sessions.sessions:
                return True
        except (RecordsUnavailable, StoredCountsUnavailable, trio.TooSlowError) as error:
            log.warning(
                "session %s: cannot be read from the cluster now: %s", session[:4].hex(), error
            )
            await self._refuse(stream, "the cluster cannot give this session now: try again", True)
            return False
        if session not in self.sessions.sessions:
            restore_claimed(self.services, session, claimed, stored)
        return True

    async def _stored_of(
        self, session: bytes, topics: dict[int, str], deadline: float
    ) -> dict[int, int]:
        """Per topic handle of ``topics``: what its topic's stream holds of
        ``session``'s publishes on it (here, or asked of its owner)."""
        mine = [(h, name) for h, name in topics.items() if self.not_owned(name) is None]
        stored = await self.stored_counts(session, mine)
        owners: dict[str, list[tuple[int, str]]] = {}
        for handle, name in topics.items():
            if handle not in stored:
                if self.front_end is None:  # (its own topic, whose stream did not answer)
                    raise StoredCountsUnavailable(f"the stream of {name[:64]!r} did not answer")
                owner = self.front_end.cluster.owner(name).id
                owners.setdefault(owner, []).append((handle, name))
        if owners:
            if self.stored_counts_asked is None:
                raise StoredCountsUnavailable("no way to ask the other front ends")
            stored |= await self.stored_counts_asked.ask(owners, session, deadline)
        return stored

    def home_address(self, session: bytes) -> str | None:
        """Where a resume of ``session`` belongs, if another worker holds it."""
        return None if self.worker is None else home_address(session, self.worker.cluster)

    async def handle_stream(
        self, stream: trio.abc.Stream, peer_address: tuple[str, int] | None = None
    ) -> None:
        """Serve one accepted connection until it closes.

        ``stream`` is any trio stream: a TCP connection (``SocketStream``,
        served with raw socket I/O), or another kind (a test's in-memory
        stream; served through the stream's own methods). The peer is
        ``peer_address`` (host, port) if given; else a ``SocketStream``'s
        peer name, and for other streams the placeholder ``("memory", n)``,
        ``n`` counting such connections."""
        busy = self._busy()
        if self.closing or busy >= self.config.max_connections:
            await self._refuse(stream)
            return
        host, peer = self._peer_of(stream, peer_address)
        address = address_key(host)
        worker = self.worker
        if (
            worker is not None
            and self.ssl_context is None
            and worker.handover_paths
            and isinstance(stream, trio.SocketStream)
            and await hand_over(stream, worker, self.config.hello_timeout)
        ):
            self.handed_over_total += 1
            return
        if (
            self.copies is not None
            and self.ssl_context is None
            and isinstance(stream, trio.SocketStream)
            and not await self._claim(stream)
        ):
            return
        if self._shutdown_began():  # (during the claim)
            await self._refuse(stream)
            return
        # Bounded per address once the broker is half full: then no address
        # can take the slots left from everybody else.
        if 2 * busy >= self.config.max_connections and not self.peers.admits(address):
            self.peer_log.info(peer, "%s: refused: too many connections not welcomed yet", peer)
            await self._refuse(stream, "too many connections from your address before Hello")
            return
        identity: str | None = None
        transport: trio.abc.Stream = stream
        if self.ssl_context is not None:
            self.peers.handshake_started(address)
            try:
                secured = await self._handshake(stream, peer)
            finally:
                self.peers.handshake_ended(address)
            if secured is None:
                return
            if not self.ready:  # the shutdown began during the handshake
                await self._refuse(secured)
                return
            transport = secured
            identity = certificate_identity(secured.getpeercert())
            if self.copies is not None:
                claimed = await self._claim_secured(secured)
                if claimed is None:
                    return
                if self._shutdown_began():  # (during the claim)
                    await self._refuse(secured)
                    return
                transport = claimed
        connection = ServerConnection(
            self.services, self.forget, transport, next(self._serials), peer, identity
        )
        self.peers.add(address, connection.protocol)
        await self._serve_connection(connection)

    def _peer_of(self, stream: trio.abc.Stream, address: tuple[str, int] | None) -> tuple[str, str]:
        """The host (its address counts per-address limits) and the
        ``host:port`` name of ``stream``'s peer (see :meth:`handle_stream`)."""
        if address is None:
            if not isinstance(stream, trio.SocketStream):
                address = ("memory", next(self._memory_peers))
            else:
                try:
                    name = stream.socket.getpeername()
                except OSError:  # pragma: no cover - the peer vanished already
                    return "?", "?"
                if isinstance(name, str | bytes):  # a Unix socket: another worker's link
                    return "unix", "unix"
                address = (name[0], name[1])
        host, port = address
        return host, f"{host}:{port}"

    async def _serve_connection(self, connection: ServerConnection) -> None:
        """Run ``connection`` until it closes (an error of ours ends it, logged)."""
        self.connections[connection.serial] = connection
        self.connections_total += not connection.link  # (clients: links are no clients)
        self._idle = trio.Event()
        self.peer_log.info(connection.peer, "%s %s: connected", connection.name, connection.peer)
        try:
            await connection.run()
        except Exception:
            # A bug of ours: it ends this connection (cleaned up by run()), not
            # the broker. Cancellation is a BaseException and passes through.
            self.internal_errors += 1
            log.exception("%s %s: ended by an internal error", connection.name, connection.peer)

    async def handle_link(self, stream: trio.SocketStream) -> None:
        """Serve another worker's link (accepted on the link listener, which only
        the workers reach): an ordinary client but trusted (no TLS, no credentials).
        Another front end's link (over TCP) must present the link token."""
        if self.closing:
            await self._refuse(stream)
            return
        token = self.front_end.token if self.front_end is not None else ""
        if token:
            hello = None
            with trio.move_on_after(self.config.hello_timeout):
                hello = await peek_hello(stream.socket)
            if hello is None or not hmac.compare_digest(hello.token or "", token):
                self.security.auth_failures["bad_credentials"] += 1
                await self._refuse(stream, "not a front end's link")
                return
        await self._serve_connection(
            ServerConnection(
                self.services, self.forget, stream, next(self._serials), "link", None, trusted=True
            )
        )

    async def _handshake(self, stream: trio.abc.Stream, peer: str) -> trio.SSLStream[Any] | None:
        """The TLS stream over ``stream`` once its handshake completes in time,
        or None (the connection is closed and the failure counted)."""
        assert self.ssl_context is not None
        self.handshaking += 1
        try:
            secured: trio.SSLStream[Any] | str = "timed out"
            with trio.move_on_after(self.config.tls_handshake_timeout):
                secured = await server_handshake(stream, self.ssl_context)
        finally:
            self.handshaking -= 1
        if not isinstance(secured, str):
            return secured
        self.security.tls_handshake_failures += 1
        self.peer_log.info(peer, "%s: TLS handshake failed: %s", peer, shown(secured, LINE_CHARS))
        await trio.aclose_forcefully(stream)
        return None

    async def _refuse(
        self, stream: trio.abc.Stream, reason: str = "too many connections", later: bool = False
    ) -> None:
        """Goodbye 5 (shutting down; ``later``: ``reason``, come back) or 3
        (``reason``: a limit), in TLS on a TLS listener, then close; never
        more than :data:`REFUSAL_SECONDS`."""
        self.refused_total += 1
        come_back = self.closing or later
        code = GoodbyeCode.SHUTTING_DOWN if come_back else GoodbyeCode.LIMIT_EXCEEDED
        reason = "shutting down" if self.closing else reason
        with (
            trio.move_on_after(REFUSAL_SECONDS),
            contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError),
        ):
            if self.ssl_context is not None and not isinstance(stream, trio.SSLStream):
                stream = trio.SSLStream(stream, self.ssl_context, server_side=True)
                await stream.do_handshake()
            await stream.send_all(encode(GoodbyeMessage(int(code), reason)))
            # Read until the client closes, so that closing does not reset the
            # connection (and lose the Goodbye) while its Hello is unread.
            while await stream.receive_some(4096):
                pass
        await trio.aclose_forcefully(stream)

    async def shutdown(self) -> None:
        """Shut down gracefully, within ``shutdown_deadline`` seconds.

        1. Stop accepting clients, and publishes: from now on a publish (or
           a Commit) is neither routed nor confirmed; its client keeps it to
           publish again (see ``docs/operations.md``).
        2. Let commits under way finish, and drain (``_drain.drain``): the
           topics route what was forwarded to them, links between workers
           pass on their last; then send the reliable deliveries queued to
           their connected subscribers as fast as those issue guarantees, for
           at most half the time left: whatever a client saw confirmed reaches
           every connected subscriber that keeps reading.
        3. Send each client its last Confirms and Goodbye 5, and wait for the
           connections to drain; at the deadline the rest are cut.
        """
        if self.closing:
            return
        self.life.closing = True
        self.sessions.keep_records = True  # the sessions are resumed after the restart
        self.accepting = False
        self._accept_scope.cancel()
        log.info("shutting down: %d connections to drain", len(self.connections))
        deadline = trio.current_time() + self.config.shutdown_deadline
        if self.commits_in_flight:
            # A commit cut off half-routed would break exactly-once: let the
            # commits under way finish (and answer) before anyone is told to go.
            log.info("waiting for %d commits to be routed", len(self.commits_in_flight))
            with trio.move_on_at(deadline):
                for running in list(self.commits_in_flight.values()):
                    await running.routed.wait()
            if self.commits_in_flight:
                log.warning(
                    "%d commits were still routing at the shutdown deadline: cut off",
                    len(self.commits_in_flight),
                )
        # Half the time left at most: the Goodbyes and the drain get the rest.
        with trio.move_on_at((trio.current_time() + deadline) / 2):
            await drain(self.topics.values(), self.connections.values(), self.links)
            self.shutdown_drained = True
        if not self.shutdown_drained:
            links = self.link_statistics() or ()
            log.warning(
                "shutting down after half the shutdown deadline: %d deliveries still "
                "queued for connected subscribers are dropped; %d publishes forwarded "
                "to other workers are unconfirmed (their clients keep them)",
                sum(queued for _, queued in queued_deliveries(self.connection_views())),
                sum(link.publishes_in_flight for link in links),
            )
        for connection in list(self.connections.values()):
            connection.shutting_down()
        if self.mqtt is not None:
            self.mqtt.shutting_down()
        self.sessions.end_all()  # the detached ones: nobody can resume them now
        with trio.move_on_at(deadline):
            await self._idle.wait()
            if self.mqtt is not None:
                await self.mqtt.wait_closed()
        self.shutdown_cut = len(self.connections)
        if self.shutdown_cut:
            log.warning("shutdown deadline: %d connections still open are cut", self.shutdown_cut)
        if self.logs is not None:  # (cluster mode: cursors' and groups' last writes)
            with trio.move_on_at(deadline):
                await self.logs.flush_state()
        if self.life.nursery is not None:
            self.life.nursery.cancel_scope.cancel()


async def serve_broker(
    config: BrokerConfig,
    *,
    worker: WorkerSetup | None = None,
    listeners: Sequence[trio.abc.Listener[trio.abc.Stream]] | None = None,
    streams: RunStreams | None = None,
    records: RecordBucket | None = None,
    state: StateBuckets | None = None,
    front_end: FrontEndSetup | None = None,
    task_status: trio.TaskStatus[Broker] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run a broker; ``task_status.started(broker)`` once it is listening.

    ``front_end``: one of several front ends of a cluster (see
    ``_front_end.serve_front_end``), serving with that placement on those
    listeners (which it leaves open).

    With ``config.cluster`` (and no ``streams``) it first connects to the
    NATS servers and checks them (:func:`open_jetstream_runs`: raises
    :class:`ClusterUnavailable` with one line), then serves over the
    topics' streams in their JetStream cluster. Otherwise see
    :func:`_serve_broker`.
    """
    if streams is None and config.cluster:
        async with open_jetstream_runs(config) as runs:
            config = runs.fit(config)
            bucket = await _patiently_open(runs, config.cluster_replicas)
            await _serve_broker(
                config,
                worker=worker,
                listeners=listeners,
                streams=runs,
                records=bucket,
                state=await state_buckets(runs, config),
                task_status=task_status,
            )
        return
    await _serve_broker(
        config,
        worker=worker,
        listeners=listeners,
        streams=streams,
        records=records,
        state=state,
        front_end=front_end,
        task_status=task_status,
    )


async def state_buckets(runs: JetStreamRuns, config: BrokerConfig) -> StateBuckets:
    """The buckets of the cursors, the groups and the commit registry (at
    most ``staging_remember`` values; see :func:`_patiently_open`), and the
    staging stream (:class:`ClusterUnavailable` if it cannot be had)."""
    replicas = config.cluster_replicas
    try:
        staged = await patiently(
            "making the staging stream",
            lambda: open_staging_stream(runs.js, replicas, config.staging_ttl),
            StagingUnavailable,
        )
    except StagingUnavailable as error:
        raise ClusterUnavailable(f"cluster mode: {error}") from None
    except JetStreamError as error:
        raise ClusterUnavailable(
            f"cluster mode: the stream {STAGING_STREAM} cannot be used: {error} "
            "(delete it with `nats stream rm`, or give it its configuration back)"
        ) from None
    return StateBuckets(
        await _patiently_open(runs, replicas, CURSORS_BUCKET),
        await _patiently_open(runs, replicas, GROUPS_BUCKET),
        await _patiently_open(runs, replicas, COMMITS_BUCKET, config.staging_remember),
        staged,
    )


async def _patiently_open(
    runs: JetStreamRuns, replicas: int, bucket: str = BUCKET, max_values: int = -1
) -> JetStreamRecordBucket:
    """The sessions' bucket (or ``bucket``), asked again with a backoff
    while JetStream does not answer (see
    :func:`~.storage._topic_logs.patiently`); raises
    :class:`ClusterUnavailable` (one line) if it cannot be had."""
    try:
        return await patiently(
            f"making the KV bucket {bucket}",
            lambda: open_record_bucket(runs.js, replicas, bucket, max_values),
            RecordsUnavailable,
        )
    except RecordsUnavailable as error:
        raise ClusterUnavailable(f"cluster mode: making the KV bucket {bucket}: {error}") from None
    except JetStreamError as error:
        raise ClusterUnavailable(
            f"cluster mode: the KV bucket {bucket} cannot be used: {error} "
            "(delete it with `nats kv del`, or give it its configuration back)"
        ) from None


async def _serve_broker(
    config: BrokerConfig,
    *,
    worker: WorkerSetup | None,
    listeners: Sequence[trio.abc.Listener[trio.abc.Stream]] | None,
    streams: RunStreams | None,
    records: RecordBucket | None = None,
    state: StateBuckets | None = None,
    front_end: FrontEndSetup | None = None,
    task_status: trio.TaskStatus[Broker],
) -> None:
    """Run a broker; ``task_status.started(broker)`` once it is listening.

    Returns after :meth:`Broker.shutdown` (graceful: stop accepting, Goodbye 5
    to every client, up to ``config.shutdown_deadline`` seconds to drain).
    Cancelling it instead stops at once, cutting every connection.

    Before listening it loads the TLS files (``tls_cert``, ``tls_key``,
    ``tls_client_ca``) and the ``auth_file``: a bad one raises
    :class:`~broker.tls.TLSConfigError` or :class:`~broker.auth.AuthError`.

    A ``worker`` (one of several processes of a broker) listens on the
    sockets its supervisor made instead of ``config.listen``, keeps its
    state in its own directory of the data directory and locks each topic's
    log while it has it open (see :class:`~broker.log.LogStore`).

    With ``streams`` (cluster mode: the replicated streams of the topics,
    JetStream's in ``broker serve --cluster``) every topic's records are
    kept in its stream: the data directory's topic logs are caches, made
    again from the streams before the broker listens, and a record is
    confirmed once its stream holds it (see ``storage/_replicated.py``).

    ``listeners`` (trio listeners of any streams, e.g. a test's in-memory
    listener) are served instead of ``config.listen`` or the worker's client
    sockets; the broker closes them when it stops. ``broker.address`` is
    the first one's socket address, ``("memory", 0)`` if it has no socket.
    """
    ssl_context = (
        server_context(config.tls_cert, config.tls_key, config.tls_client_ca)
        if config.tls
        else None
    )
    auth = load_auth_file(config.auth_file) if config.auth_file else None
    if auth is not None:
        check_budget_shares(auth, config)
    log_dir = config.log_dir
    if streams is not None:
        if log_dir is None:
            raise ConfigError(
                "cluster mode keeps its topics' caches and its state in data_dir: set data_dir"
            )
        # (Apart from a standalone broker's: the caches are deleted at each start.)
        log_dir = log_dir / "cluster"
    # Raises DataDirLocked (one line) if another broker has the directory.
    replication = (
        None
        if streams is None
        else Replication(streams, secrets.token_hex(6), config.cluster_max_topics)
    )
    logs = TopicLogs.open_store(
        log_dir,
        config,
        None if worker is None else worker.worker,
        config.max_open_log_files,
        replication,
    )
    if logs is not None and state is not None:
        logs.keep_state_in(state)  # (read with the streams, before listening)
    link_listeners: list[trio.abc.Listener[trio.SocketStream]] = []
    served: list[trio.abc.Listener[trio.abc.Stream]] = []
    mqtt_served: list[trio.SocketListener] = []
    try:
        host, port = config.listen_address
        if front_end is not None:
            served = [KeptListener(listener) for listener in front_end.listeners]
            link_listeners = [KeptListener(listener) for listener in front_end.link_listeners]
        elif listeners is not None:
            served = list(listeners)
        elif worker is None:
            served = list(await trio.open_tcp_listeners(port, host=host))
        else:
            served = [
                trio.SocketListener(trio.socket.from_stdlib_socket(sock))
                for sock in worker.client_sockets
            ]
        mqtt_address = config.mqtt_address
        if mqtt_address is not None:
            try:
                mqtt_served = await trio.open_tcp_listeners(mqtt_address[1], host=mqtt_address[0])
            except OSError as error:
                raise MQTTCannotListen(mqtt_address, error) from None
        if worker is not None and worker.link_socket is not None:
            link_listeners.append(
                trio.SocketListener(trio.socket.from_stdlib_socket(worker.link_socket))
            )
        if logs is not None and logs.replication is not None:
            # (Bound first: a port taken fails at once, not after the restore.)
            restored = await logs.restore(None if front_end is None else front_end.placement.owns)
            log.info(
                "cluster mode: %d topics restored from their streams (%d records)",
                len(logs.replication.logs),
                restored,
            )
    except BaseException:
        if logs is not None:
            logs.close()
        with trio.CancelScope(shield=True):
            for listener in [*(served if front_end is None else ()), *mqtt_served]:
                with contextlib.suppress(trio.ClosedResourceError):
                    await listener.aclose()
        raise
    async with open_system("broker") as system:
        broker = Broker(
            config,
            system,
            ssl_context=ssl_context,
            auth=auth,
            logs=logs,
            worker=worker,
            front_end=None if front_end is None else front_end.placement,
            commit_records=None if state is None else state.commits,
            staged=None if state is None else state.staged,
        )
        if front_end is not None:
            broker.stored_counts_asked = front_end.stored_counts
        if auth is not None and worker is not None and worker.connection_counts is not None:
            shared = SharedCounts(
                worker.connection_counts, worker.cluster.index, list(auth.principals)
            )
            for usage in broker.principals.values():
                usage.shared = shared
        first = served[0] if front_end is None else front_end.listeners[0]
        if isinstance(first, trio.SocketListener):
            sockname = first.socket.getsockname()
            broker.address = (sockname[0], sockname[1])
        else:
            broker.address = ("memory", 0)
        try:
            async with trio.open_nursery() as nursery:
                broker.life.nursery = nursery
                if broker.links is not None:
                    broker.links.nursery = nursery
                broker.sessions.start(nursery)
                if config.loop_counters:
                    broker.loop = LoopCounters()
                    trio.lowlevel.add_instrument(broker.loop)
                if records is not None and broker.session_records is not None:
                    # Sessions are claimed from the cluster as clients resume
                    # them (``_claim``): the journal's copies may be stale.
                    assert logs is not None
                    forget_sessions(logs.journal)
                    broker.copies = ClusterRecords(records, broker.session_taken)
                    broker.session_records.copies = broker.copies
                    nursery.start_soon(broker.copies.run)
                if logs is not None and broker.session_records is not None:
                    restore_sessions(
                        broker.services, broker.seen, broker.session_records, logs.marks
                    )
                nursery.start_soon(broker._expire_staging)
                nursery.start_soon(broker.memory.run)
                nursery.start_soon(broker.budget_pool.run)
                if logs is not None and broker.groups is not None:
                    nursery.start_soon(logs.run)
                    nursery.start_soon(broker.groups.run)
                    if worker is not None or front_end is not None:
                        # (The other workers' or front ends' new topics: for patterns.)
                        nursery.start_soon(broker.patterns.watch, broker.stored_topics)
                    log.info("topic logs in %s", log_dir)
                await complete_unfinished(broker.services, nursery)  # (commits a stop cut off)
                if worker is not None and worker.handover_socket is not None:
                    # (Sessions handed over are clients too: after the above.)
                    nursery.start_soon(
                        receive_sockets, worker.handover_socket, broker.handle_stream, nursery
                    )
                quiet_accept_errors()  # (no file descriptor left: one line per 10 s)

                async def accept(*, task_status: trio.TaskStatus[Any]) -> None:
                    with broker._accept_scope:
                        await trio.serve_listeners(
                            broker.handle_stream,
                            served,
                            handler_nursery=nursery,
                            task_status=task_status,
                        )

                await nursery.start(accept)
                if link_listeners:
                    serve = partial(trio.serve_listeners, handler_nursery=nursery)
                    nursery.start_soon(serve, broker.handle_link, link_listeners)
                if broker.mqtt is not None and mqtt_served:
                    await nursery.start(broker.mqtt.serve, mqtt_served, nursery)
                    log.info("MQTT listening on %s:%d", *broker.mqtt.address)
                broker.accepting = True
                log.info(
                    "broker listening on %s:%d (%s, %s)",
                    *broker.address,
                    "TLS" if ssl_context else "plain TCP",
                    "clients authenticate" if auth else "no authentication",
                )
                if auth is None and listeners is None and host not in LOOPBACK:
                    log.warning("listening on %s without authentication (set auth_file)", host)
                if auth is not None and not config.tls_client_ca and auth.has_identities():
                    log.warning(
                        "the auth file lists certificate identities, but clients present no "
                        "certificates (set tls_client_ca): those principals need tokens"
                    )
                task_status.started(broker)
        finally:
            broker.sessions.end_all()
            broker.persist_state()
            broker.staging.clear()
            if broker.links is not None:
                broker.links.close()
            for listener in [
                *([*served, *link_listeners] if front_end is None else ()),
                *mqtt_served,
            ]:
                with trio.CancelScope(shield=True):
                    await listener.aclose()
            if logs is not None:
                if broker.groups is not None:
                    broker.groups.close()
                logs.close()
            broker.account.close()
