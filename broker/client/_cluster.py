"""Several brokers, each owning a share of the topics: routing by topic name.

A broker is one trio process on one core. To scale out, run several and let
clients route each topic to its owner, computed from the list of brokers by
rendezvous (highest-random-weight) hashing:

- every client with the same *set* of brokers picks the same owner for a
  topic (the order of the list does not matter);
- adding or removing a broker moves only the topics that it gains or loses
  (about 1/n of them), not the rest.

The brokers know nothing of each other: nothing checks that clients agree on
the list, and a topic's messages are only where its owner is. See
``docs/operations.md`` ("Scaling past one process") for what that means.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from typing import Any, Generic, TypeVar

from broker.protocol import Cluster, Headers, Options, Outcome, Stage, check_topic_name

from ._async import Client, Subscription, open_client
from ._blocking import BlockingClient, BlockingSubscription
from ._common import ClientError, split_url
from ._start import Start

log = logging.getLogger("broker.client")

__all__ = [
    "BlockingClusterClient",
    "ClusterClient",
    "open_cluster_client",
    "parse_servers",
    "route",
]


def parse_servers(servers: str | Iterable[str]) -> list[str]:
    """``"a:7400,b:7400"`` (or a list) -> the broker URLs, without blanks or repeats."""
    items = servers.split(",") if isinstance(servers, str) else list(servers)
    result: list[str] = []
    seen: set[tuple[str, int]] = set()
    for item in (item.strip() for item in items):
        if not item:
            continue
        host, port, _ = split_url(item)
        if (host, port) not in seen:
            seen.add((host, port))
            result.append(item)
    if not result:
        raise ClientError("no broker address given")
    return result


def _weight(server: str, topic: str) -> bytes:
    host, port, _ = split_url(server)
    key = f"{host}:{port}\0{topic}".encode()
    return hashlib.blake2b(key, digest_size=8).digest()


def route(topic: str, servers: Sequence[str]) -> str:
    """The broker of ``servers`` that owns ``topic`` (rendezvous hashing on
    ``host:port``, so ``tls://a:7400`` and ``a:7400`` are the same broker)."""
    if not servers:
        raise ClientError("no broker address given")
    return max(servers, key=lambda server: _weight(server, topic))


C = TypeVar("C")


class _Routing(Generic[C]):
    """Clients (of either driver) by broker URL, and which owns a topic;
    what both cluster clients share."""

    def __init__(
        self,
        clients: dict[str, C],
        cluster: Cluster | None = None,
        urls: dict[str, str] | None = None,
    ) -> None:
        self.clients = clients
        self._servers = list(clients)
        #: The membership of the one multi-worker broker these clients are
        #: connected to (one client per worker, keyed by its direct URL);
        #: None: independent brokers, routed by their addresses.
        self.cluster = cluster
        #: With ``cluster``: per worker id, the URL its client is keyed by.
        self._urls: dict[str, str] = urls or {}

    def _route(self, topic: str) -> str:
        if self.cluster is None:
            return route(topic, self._servers)
        return self._urls[self.cluster.owner(topic).id]

    def client_for(self, topic: str) -> C:
        """The client connected to ``topic``'s owner; a ``topic`` that breaks
        the topic-name rule raises :class:`~broker.protocol.TopicNameError`."""
        check_topic_name(topic)
        return self.clients[self._route(topic)]

    def _owned(
        self, server: str, offsets: dict[str, tuple[int, int]]
    ) -> dict[str, tuple[int, int]]:
        """The entries of ``offsets`` (one broker's answer) for the topics
        ``server`` owns: a topic left elsewhere by an earlier set of brokers
        is not this set's."""
        return {t: span for t, span in offsets.items() if self._route(t) == server}

    def _shares(self, counts: Mapping[str, Mapping[str, int]]) -> dict[str, list[tuple[str, int]]]:
        """Per broker, the members of a commit (``counts[member][server]``
        staged there), in the order of ``counts``. A member that staged
        nothing on a broker is listed nowhere: the same to the broker, and
        it keeps the Commit frame small.

        Counts on a broker this client is not connected to raise
        :class:`ClientError` and nothing is committed: each broker discards
        what a commit leaves out, so sending the rest would lose them (the
        workers' direct addresses change at a restart unless ``worker_port``
        fixes them)."""
        for member, per in counts.items():
            unknown = sorted(
                server for server, n in per.items() if n and server not in self.clients
            )
            if unknown:
                raise ClientError(
                    f"commit counts of {member!r} name {', '.join(unknown)}, not a broker of this "
                    f"client ({', '.join(self.clients)}): nothing was committed; commit with the "
                    "addresses that staged it (with --workers, fix them with worker_port)"
                )
        return {
            server: [(member, n) for member, per in counts.items() if (n := per.get(server, 0))]
            for server in self.clients
        }


def member_urls(seed: str, cluster: Cluster) -> dict[str, str]:
    """Per worker id of ``cluster``: the URL of its direct address, in the
    scheme of ``seed`` (the address the membership was learnt from)."""
    _, _, tls = split_url(seed)
    return {m.id: ("tls://" if tls else "") + m.address for m in cluster.members}


def _first_failure(
    batch: str, server: str, error: Exception, failure: Exception | None
) -> Exception:
    """Log that aborting ``batch`` on ``server`` failed; the failure to raise
    once every broker was asked (the first)."""
    log.warning("aborting batch %r on %s failed: %s", batch, server, error)
    return failure or error


class ClusterClient(_Routing[Client]):
    """One :class:`~broker.client.Client` per broker; each topic goes to its owner.

    Obtained from :func:`open_cluster_client`. Per topic, it keeps every
    promise of a single client (order, backpressure, flush); across topics
    on different brokers there is no order. Staging works as with
    :class:`BlockingClusterClient`.
    """

    async def publish(
        self,
        topic: str,
        payload: bytes,
        *,
        key: bytes | None = None,
        headers: Headers | None = None,
        stage: Stage | None = None,
    ) -> None:
        """:meth:`Client.publish` on the owner of ``topic``."""
        await self.client_for(topic).publish(topic, payload, key=key, headers=headers, stage=stage)

    def publish_nowait(
        self,
        topic: str,
        payload: bytes,
        *,
        key: bytes | None = None,
        headers: Headers | None = None,
    ) -> None:
        """:meth:`Client.publish_nowait` on the owner of ``topic``."""
        self.client_for(topic).publish_nowait(topic, payload, key=key, headers=headers)

    def subscribe(
        self,
        topic: str,
        *,
        mode: str = "reliable",
        options: Options | None = None,
        start: Start | None = None,
        cursor: str | None = None,
        timestamps: bool = False,
        group: str | None = None,
        max_outstanding: int | None = None,
    ) -> AbstractAsyncContextManager[Subscription]:
        """:meth:`Client.subscribe` on the owner of ``topic`` (where its
        consumer groups live)."""
        return self.client_for(topic).subscribe(
            topic,
            mode=mode,
            options=options,
            start=start,
            cursor=cursor,
            timestamps=timestamps,
            group=group,
            max_outstanding=max_outstanding,
        )

    async def flush(self) -> None:
        """Wait until every broker has routed everything published to it."""
        for client in self.clients.values():
            await client.flush()

    async def finish_stage(self, stage: Stage) -> dict[str, int]:
        """:meth:`Client.finish_stage` on every broker: the messages
        published with ``stage``, per broker (what each broker's commit lists)."""
        return {server: await client.finish_stage(stage) for server, client in self.clients.items()}

    async def commit(
        self, batch: str, counts: Mapping[str, Mapping[str, int]]
    ) -> dict[str, Outcome]:
        """Commit ``batch`` on every broker, as :meth:`BlockingClusterClient.commit`."""
        shares = self._shares(counts)
        return {
            server: await client.commit(batch, shares[server])
            for server, client in self.clients.items()
        }

    async def abort(self, batch: str) -> dict[str, Outcome]:
        """:meth:`Client.abort` on every broker, as :meth:`BlockingClusterClient.abort`."""
        outcomes: dict[str, Outcome] = {}
        failure: Exception | None = None
        for server, client in self.clients.items():
            try:
                outcomes[server] = await client.abort(batch)
            except Exception as error:  # abort the others first
                failure = _first_failure(batch, server, error, failure)
        if failure is not None:
            raise failure
        return outcomes


@asynccontextmanager
async def open_cluster_client(
    servers: str | Iterable[str], **options: Any
) -> AsyncIterator[ClusterClient]:
    """Connect to every broker of ``servers`` (``"a:7400,b:7400"`` or a list)
    for the duration of the block; ``options`` go to each
    :func:`~broker.client.open_client`. Leaving flushes every connection.

    One address of a broker of several workers (``broker serve --workers``)
    is enough: its Welcome lists the workers, and the client connects to
    each one's direct address and sends every topic to its owner (no
    forwarding between workers)."""
    listed = parse_servers(servers)
    async with AsyncExitStack() as stack:
        clients: dict[str, Client] = {}
        if len(listed) == 1:
            async with AsyncExitStack() as probe:
                first = await probe.enter_async_context(open_client(listed[0], **options))
                cluster = first.cluster
                if cluster is None:  # one broker of one process: this is its client
                    clients[listed[0]] = first
                    stack.push_async_exit(probe.pop_all())
            if cluster is not None:
                urls = member_urls(listed[0], cluster)
                members: dict[str, Client] = {}
                for url in urls.values():
                    member = await stack.enter_async_context(open_client(url, **options))
                    member.reconnect_through(listed[0])
                    members[url] = member
                yield ClusterClient(members, cluster, urls)
                return
        for server in listed:
            if server not in clients:
                clients[server] = await stack.enter_async_context(open_client(server, **options))
        yield ClusterClient(clients)


class BlockingClusterClient(_Routing[BlockingClient]):
    """The blocking counterpart of :class:`ClusterClient` (for threads and
    Spark tasks): one :class:`~broker.client.BlockingClient` per broker."""

    def __init__(self, servers: str | Iterable[str], **options: Any) -> None:
        """Connect to every broker of ``servers``; ``options`` go to each
        :class:`~broker.client.BlockingClient`. If one cannot be reached, the
        others are closed and its :class:`ConnectionLost` is raised. One
        address of a multi-worker broker is enough (as :func:`open_cluster_client`)."""
        super().__init__({})
        listed = parse_servers(servers)
        seed = listed[0] if listed else ""
        try:
            if len(listed) == 1:
                first = BlockingClient(listed[0], **options)
                cluster = first.cluster
                if cluster is not None:
                    first.close()
                    self.cluster = cluster
                    self._urls = member_urls(listed[0], cluster)
                    listed = list(self._urls.values())
                else:
                    self.clients[listed[0]] = first
            for server in listed:
                if server not in self.clients:
                    self.clients[server] = BlockingClient(server, **options)
                    if self.cluster is not None:
                        self.clients[server].reconnect_through(seed)
        except BaseException:
            self.close(flush=False)
            raise
        self._servers = list(self.clients)

    def __enter__(self) -> BlockingClusterClient:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        self.close(flush=exc_type is None)

    def publish(
        self,
        topic: str,
        payload: bytes,
        *,
        key: bytes | None = None,
        headers: Headers | None = None,
        timeout: float | None = None,
        stage: Stage | None = None,
    ) -> None:
        """:meth:`BlockingClient.publish` on the owner of ``topic``."""
        self.client_for(topic).publish(
            topic, payload, key=key, headers=headers, timeout=timeout, stage=stage
        )

    def finish_stage(self, stage: Stage, timeout: float | None = None) -> dict[str, int]:
        """:meth:`BlockingClient.finish_stage` on every broker: the messages
        published with ``stage``, per broker (what each broker's commit lists)."""
        return {
            server: client.finish_stage(stage, timeout) for server, client in self.clients.items()
        }

    def commit(
        self,
        batch: str,
        counts: Mapping[str, Mapping[str, int]],
        *,
        timeout: float | None = None,
    ) -> dict[str, Outcome]:
        """Commit ``batch`` on every broker: ``counts[member]`` is what
        :meth:`finish_stage` returned for that member's stage (a broker not
        in it staged nothing of the member). Members are made visible in the
        order of ``counts``. Each broker commits its own share on its own
        (there is no atomicity across brokers; a commit sent again is a
        ``DUPLICATE`` where it was done)."""
        shares = self._shares(counts)
        return {
            server: client.commit(batch, shares[server], timeout=timeout)
            for server, client in self.clients.items()
        }

    def abort(self, batch: str, *, timeout: float | None = None) -> dict[str, Outcome]:
        """:meth:`BlockingClient.abort` on every broker, each asked even if
        another refuses or fails; then the first failure is raised (a
        :class:`~broker.client.StagingRefused` names a broker where the
        batch was already committed)."""
        outcomes: dict[str, Outcome] = {}
        failure: Exception | None = None
        for server, client in self.clients.items():
            try:
                outcomes[server] = client.abort(batch, timeout=timeout)
            except Exception as error:  # abort the others first
                failure = _first_failure(batch, server, error, failure)
        if failure is not None:
            raise failure
        return outcomes

    def subscribe(
        self,
        topic: str,
        *,
        mode: str = "reliable",
        options: Options | None = None,
        timeout: float | None = None,
        start: Start | None = None,
        cursor: str | None = None,
        timestamps: bool = False,
        group: str | None = None,
        max_outstanding: int | None = None,
    ) -> BlockingSubscription:
        """:meth:`BlockingClient.subscribe` on the owner of ``topic`` (where
        its consumer groups live)."""
        return self.client_for(topic).subscribe(
            topic,
            mode=mode,
            options=options,
            timeout=timeout,
            start=start,
            cursor=cursor,
            timestamps=timestamps,
            group=group,
            max_outstanding=max_outstanding,
        )

    def offsets(
        self, topics: Iterable[str] | None = None, *, timeout: float | None = None
    ) -> dict[str, tuple[int, int]]:
        """:meth:`BlockingClient.offsets`, each topic asked of its owner
        (None: every broker lists the topics it owns)."""
        names = None if topics is None else list(topics)
        found: dict[str, tuple[int, int]] = {}
        for server, client in self.clients.items():
            mine = None if names is None else [t for t in names if self.client_for(t) is client]
            if mine != []:
                found.update(self._owned(server, client.offsets(mine, timeout=timeout)))
        return dict(sorted(found.items()))

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every broker has routed everything published to it."""
        for client in self.clients.values():
            client.flush(timeout)

    def close(self, *, flush: bool = True, timeout: float | None = None) -> None:
        """Close every connection (flushing first, by default, up to
        ``timeout`` seconds each); the first failure is raised once all are
        closed."""
        failure: BaseException | None = None
        for client in self.clients.values():
            try:
                client.close(flush=flush, timeout=timeout)
            except BaseException as error:  # close the others before raising
                failure = failure or error
        if failure is not None:
            raise failure
