"""The broker: a listener, its connections, the topic actors, budgets, shutdown."""

from __future__ import annotations

import contextlib
import itertools
import logging
import secrets
from dataclasses import dataclass
from typing import Any

import trio

from accounts import Account, unlimited
from actors import ActorSystem, open_system
from broker.config import BrokerConfig
from broker.protocol import Goodbye as GoodbyeMessage
from broker.protocol import GoodbyeCode, encode

from ._connection import ServerConnection
from ._topic import Topic

log = logging.getLogger("broker.server")


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

    def __init__(self, config: BrokerConfig, system: ActorSystem) -> None:
        self.config = config
        self.epoch = secrets.token_bytes(8)
        self.system = system
        #: The root account: all connections' debt rolls up here (never blocks).
        self.account: Account = unlimited("broker", kind="broker")
        self.topics: dict[str, Topic] = {}
        self.connections: dict[int, ServerConnection] = {}
        self.buffer_reserved = 0
        self.connections_total = 0
        self.refused_total = 0
        self.closing = False
        #: The address the listener is bound to (useful with port 0).
        self.address: tuple[str, int] = ("", 0)
        self._serials = itertools.count(1)
        self._idle = trio.Event()
        self._idle.set()
        self._accept_scope = trio.CancelScope()
        self._nursery: trio.Nursery | None = None

    def topic(self, name: str) -> Topic:
        """The topic actor for ``name``, spawned on first use."""
        topic = self.topics.get(name)
        if topic is None:
            topic = Topic(name, self.topics)
            self.topics[name] = topic
            self.system.spawn(topic, name=f"topic:{name[:64]}")
        return topic

    def forget(self, connection: ServerConnection) -> None:
        self.connections.pop(connection.serial, None)
        if not self.connections:
            self._idle.set()

    def statistics(self) -> BrokerStatistics:
        return BrokerStatistics(
            connections=len(self.connections),
            connections_total=self.connections_total,
            refused_total=self.refused_total,
            topics=len(self.topics),
            subscriptions=sum(len(t.subscriptions) for t in self.topics.values()),
            buffer_reserved_bytes=self.buffer_reserved,
            buffer_budget_bytes=self.config.global_budget,
            debt=self.account.debt,
        )

    async def handle_stream(self, stream: trio.SocketStream) -> None:
        """Serve one accepted TCP connection until it closes."""
        if self.closing or len(self.connections) >= self.config.max_connections:
            await self._refuse(stream)
            return
        connection = ServerConnection(self, stream, next(self._serials))
        self.connections[connection.serial] = connection
        self.connections_total += 1
        self._idle = trio.Event()
        log.info("%s %s: connected", connection.name, connection.peer)
        await connection.run()

    async def _refuse(self, stream: trio.SocketStream) -> None:
        self.refused_total += 1
        code = GoodbyeCode.SHUTTING_DOWN if self.closing else GoodbyeCode.LIMIT_EXCEEDED
        reason = "shutting down" if self.closing else "too many connections"
        with trio.move_on_after(1):
            with contextlib.suppress(trio.BrokenResourceError):
                await stream.send_all(encode(GoodbyeMessage(int(code), reason)))
        await stream.aclose()

    async def shutdown(self) -> None:
        """Stop accepting, say Goodbye 5 to every client and wait (up to the
        configured deadline) for their connections to drain."""
        if self.closing:
            return
        self.closing = True
        self._accept_scope.cancel()
        log.info("shutting down: %d connections to drain", len(self.connections))
        for connection in list(self.connections.values()):
            connection.goodbye(GoodbyeCode.SHUTTING_DOWN, "broker shutting down")
        with trio.move_on_after(self.config.shutdown_deadline):
            await self._idle.wait()
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()


async def serve_broker(
    config: BrokerConfig,
    *,
    task_status: trio.TaskStatus[Broker] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run a broker; ``task_status.started(broker)`` once it is listening.

    Returns after :meth:`Broker.shutdown` (graceful: stop accepting, Goodbye 5
    to every client, up to ``config.shutdown_deadline`` seconds to drain).
    Cancelling it instead stops at once, cutting every connection.
    """
    host, port = config.listen_address
    listeners = await trio.open_tcp_listeners(port, host=host)
    async with open_system("broker") as system:
        broker = Broker(config, system)
        sockname = listeners[0].socket.getsockname()
        broker.address = (sockname[0], sockname[1])
        try:
            async with trio.open_nursery() as nursery:
                broker._nursery = nursery

                async def accept(*, task_status: trio.TaskStatus[Any]) -> None:
                    with broker._accept_scope:
                        await trio.serve_listeners(
                            broker.handle_stream,
                            listeners,
                            handler_nursery=nursery,
                            task_status=task_status,
                        )

                await nursery.start(accept)
                log.info("broker listening on %s:%d", *broker.address)
                task_status.started(broker)
        finally:
            for listener in listeners:
                with trio.CancelScope(shield=True):
                    await listener.aclose()
            broker.account.close()
