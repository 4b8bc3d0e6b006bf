"""A front end of a cluster (``broker serve --cluster``): any number of them
serve one JetStream cluster, each owning a share of the topics.

:func:`serve_front_end` connects to the NATS servers (checked at start),
learns the live front ends from their heartbeats (``cluster._members``),
and serves a :class:`~._broker.Broker` with that membership's placement
(``cluster._front_ends``): the topics it owns it writes, the others it
forwards to their owners over links. When the members change (a front end
starts, stops, or falls silent for 2 s) it serves afresh: the broker
shuts down gracefully (what it confirmed is delivered, its clients get
their last Confirms and Goodbye 5 and resume, here or at another front
end, which claims their sessions from the cluster), and a new one starts
with the new placement on the same listeners (a client connecting
meanwhile waits in the listen backlog), restoring the topics it now owns
from their streams.
"""

from __future__ import annotations

import logging
import secrets
import socket
from collections.abc import Callable
from functools import partial

import trio

from broker.config import BrokerConfig
from broker.nats import NatsClient

from ._broker import Broker, _patiently_open, serve_broker, state_buckets
from .cluster._front_ends import FrontEndPlacement, FrontEndSetup, link_token
from .cluster._members import FrontEnd, Membership
from .cluster._members_io import serve_membership
from .cluster._stored_counts import StoredCounts
from .sessions._cluster_records import RecordBucket
from .storage._jetstream import JetStreamRuns, open_jetstream_runs
from .storage._kv_state import StateBuckets

__all__ = ["FrontEndRun", "serve_front_end"]

log = logging.getLogger("broker.server")

#: Listen hosts that are no address another machine can reach.
WILDCARDS = frozenset({"", "0.0.0.0", "::"})

#: The subject of the front ends' heartbeats.
MEMBERS_SUBJECT = "broker.members"
#: Seconds a front end waits after a change of members before it serves
#: afresh: changes that come together (several front ends starting) make
#: one restart.
SETTLE = 0.5
#: Seconds of silence after which a front end nobody answers for on NATS
#: (see ``StoredCounts.on_silent``) is taken as gone: one and a half
#: heartbeats, instead of ``dead_after``'s four (a session it held resumes
#: sooner when it also owned the session's topics).
SUSPECT_AFTER = 0.75
#: Seconds the start waits for its own heartbeat to come back.
JOIN_TIMEOUT = 30.0


class FrontEndRun:
    """A front end as its caller sees it: the broker serving now (another
    after each change of members), and how to stop it."""

    def __init__(self, broker: Broker, front_end: FrontEnd) -> None:
        #: The broker serving now.
        self.broker = broker
        #: This front end, as the others know it.
        self.front_end = front_end
        #: Times it served afresh because the members changed.
        self.restarts = 0
        self._stopping = False

    @property
    def stopping(self) -> bool:
        return self._stopping

    async def shutdown(self) -> None:
        """Stop serving (gracefully: see :meth:`Broker.shutdown`); the front
        end leaves the cluster and :func:`serve_front_end` returns."""
        self._stopping = True
        await self.broker.shutdown()


def _address(host: str, port: int) -> str:
    """``host:port``, an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _advertised(config: BrokerConfig, host: str) -> str:
    """The host the other front ends and clients reach this one at."""
    if config.advertise_host:
        return config.advertise_host
    return socket.gethostname() if host in WILDCARDS else host


async def serve_front_end(
    config: BrokerConfig,
    *,
    on_restart: Callable[[Broker], object] | None = None,
    task_status: trio.TaskStatus[FrontEndRun] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve as a front end of ``config.cluster`` until
    :meth:`FrontEndRun.shutdown`; ``task_status.started(run)`` once it
    serves, and ``on_restart(broker)`` each time it serves afresh with a
    new broker (see the module). Raises
    :class:`~.storage._jetstream.ClusterUnavailable` (one line) if the NATS
    servers cannot be reached or do not keep what the broker promises."""
    async with open_jetstream_runs(config) as runs:
        config = runs.fit(config)
        bucket = await _patiently_open(runs, config.cluster_replicas)
        state = await state_buckets(runs, config)
        host, port = config.listen_address
        link_host, link_port = config.cluster_link_address
        listeners = await trio.open_tcp_listeners(port, host=host)
        try:
            link_listeners = await trio.open_tcp_listeners(link_port, host=link_host)
        except BaseException:
            for listener in listeners:
                await listener.aclose()
            raise
        try:
            buckets = (bucket, state)
            await _serve(config, runs, buckets, listeners, link_listeners, on_restart, task_status)
        finally:
            with trio.CancelScope(shield=True):
                for listener in [*listeners, *link_listeners]:
                    await listener.aclose()


async def _serve(
    config: BrokerConfig,
    runs: JetStreamRuns,
    buckets: tuple[RecordBucket, StateBuckets],
    listeners: list[trio.SocketListener],
    link_listeners: list[trio.SocketListener],
    on_restart: Callable[[Broker], object] | None,
    task_status: trio.TaskStatus[FrontEndRun],
) -> None:
    advertised = _advertised(config, config.listen_address[0])
    me = FrontEnd(
        id=secrets.token_hex(6),
        host=advertised,
        port=listeners[0].socket.getsockname()[1],
        link_host=advertised,
        link_port=link_listeners[0].socket.getsockname()[1],
    )
    membership = Membership(me)
    token = link_token(config.cluster_servers)
    changed = trio.Event()

    def on_change(_cluster: object) -> None:
        changed.set()

    client: NatsClient = runs.js.client
    run: FrontEndRun | None = None

    def silent(owner: str) -> None:  # (its resuming clients wait for it to be gone)
        membership.suspect(owner, trio.current_time(), SUSPECT_AFTER)

    stored = StoredCounts(client, me.id, silent)
    async with trio.open_nursery() as nursery:
        await nursery.start(stored.serve, lambda: None if run is None else run.broker.stored_counts)
        with trio.fail_after(JOIN_TIMEOUT):
            await nursery.start(
                partial(
                    serve_membership,
                    client,
                    membership,
                    subject=MEMBERS_SUBJECT,
                    on_change=on_change,
                )
            )
        while True:
            placement = FrontEndPlacement(
                membership.cluster(),
                {m.id: _address(m.link_host, m.link_port) for m in membership.members},
                token,
            )
            setup = FrontEndSetup(placement, listeners, link_listeners, stored)
            done = trio.Event()
            broker: Broker = await nursery.start(_serve_broker, config, runs, buckets, setup, done)
            log.info(
                "front end %s serving among %d front ends (%s)",
                me.id,
                len(placement.cluster.members),
                ", ".join(m.id for m in placement.cluster.members),
            )
            if run is None:
                run = FrontEndRun(broker, me)
                task_status.started(run)
            else:
                run.broker = broker
                run.restarts += 1
                if on_restart is not None:
                    on_restart(broker)
                if run.stopping:  # (told to stop while it served afresh)
                    await broker.shutdown()
            await _either(changed, done)
            if done.is_set() or run.stopping:
                await done.wait()
                break
            await trio.sleep(SETTLE)  # (more changes may come with this one)
            changed = trio.Event()
            log.info("front end %s: the front ends changed: serving afresh", me.id)
            await broker.shutdown()
            await done.wait()
        nursery.cancel_scope.cancel()  # (the membership: leaving)


async def _either(first: trio.Event, second: trio.Event) -> None:
    """Until ``first`` or ``second`` is set."""
    async with trio.open_nursery() as nursery:

        async def wait(event: trio.Event) -> None:
            await event.wait()
            nursery.cancel_scope.cancel()

        nursery.start_soon(wait, first)
        nursery.start_soon(wait, second)


async def _serve_broker(
    config: BrokerConfig,
    runs: JetStreamRuns,
    buckets: tuple[RecordBucket, StateBuckets],
    setup: FrontEndSetup,
    done: trio.Event,
    *,
    task_status: trio.TaskStatus[Broker],
) -> None:
    records, state = buckets
    try:
        await serve_broker(
            config,
            streams=runs,
            records=records,
            state=state,
            front_end=setup,
            task_status=task_status,
        )
    finally:
        done.set()
