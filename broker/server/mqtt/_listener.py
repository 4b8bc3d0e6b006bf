"""The MQTT listener: accepts connections, serves each with an
:class:`~._connection.MQTTConnection`, keeps them by client id (a second
connection with an id in use takes it over), and closes them at a shutdown.

TLS: when the broker serves its native clients over TLS (``tls_cert``,
``tls_key``, and ``tls_client_ca`` for client certificates), MQTT clients
are served over TLS too, with the same context: the handshake must end
within ``tls_handshake_timeout``, and a failed one is counted with the
native listener's (``broker_tls_handshake_failures_total``). A verified
client certificate's common name is the client's identity: a CONNECT
without a password is the principal of that ``identity`` (as a native
client's)."""

from __future__ import annotations

import itertools
import logging
import ssl
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import trio

from accounts import Account
from broker.mqtt import ReasonCode
from broker.tls import certificate_identity, server_handshake

from .._services import BrokerServices
from ._connection import MQTTConnection, MQTTConnectionStatistics
from ._retained import RetainedStore
from ._sessions import KeptSession, MQTTSessions
from ._wills import Wills

__all__ = ["MQTTCannotListen", "MQTTServer", "MQTTTotals"]

log = logging.getLogger("broker.server")


class MQTTCannotListen(OSError):
    """The MQTT address (``mqtt_listen``) cannot be listened on."""

    def __init__(self, address: tuple[str, int], error: OSError) -> None:
        super().__init__(error.errno, error.strerror or str(error))
        self.address = address


@dataclass(frozen=True, slots=True)
class MQTTTotals:
    """What the MQTT clients did since the broker started (closed
    connections' counts included): what the metrics export."""

    connections_open: int
    connections_accepted: int
    connections_refused: int
    messages_in: int
    messages_out: int
    #: Deliveries dropped: QoS 0 queues full, and larger than the client takes.
    dropped_overflow: int
    dropped_too_large: int
    #: Connections ended by an error of the broker's own (each logged).
    internal_errors: int
    #: Retained messages kept now, their bytes, and those refused (past the bounds).
    retained_messages: int = 0
    retained_bytes: int = 0
    retained_refused: int = 0
    #: Messages not delivered: their Message Expiry Interval had passed.
    dropped_expired: int = 0


class MQTTServer:
    """The broker's MQTT clients (see the module).

    ``busy`` counts every connection of the broker (native ones too): a
    new MQTT connection beyond ``max_connections`` is closed at once.
    """

    def __init__(
        self,
        services: BrokerServices,
        busy: Callable[[], int],
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.services = services
        self._busy = busy
        #: Served over TLS with this context (None: plain TCP).
        self.ssl_context = ssl_context
        self.connections: dict[int, MQTTConnection] = {}
        logs = services.storage.logs
        journal = None if logs is None else logs.journal
        #: The retained messages (in the state journal, with topic logs).
        self.retained = RetainedStore(journal)
        #: Sessions kept while their clients are away (in the state journal
        #: too: those of before a restart are found there).
        self.sessions = MQTTSessions(
            services.storage.cursors,
            journal,
            log_end=(lambda _topic: None) if logs is None else logs.end_of,
            now=trio.current_time(),
        )
        #: Wills waiting for their delay.
        self.wills = Wills(services, self.retained)
        #: The connected clients by client id.
        self.clients: dict[str, MQTTConnection] = {}
        self.connections_total = 0
        self.refused_total = 0
        #: Connections ended by an error of the broker's own (each logged).
        self.internal_errors = 0
        #: The address the listener is bound to (port 0: the one chosen).
        self.address: tuple[str, int] = ("", 0)
        self._serials = itertools.count(1)
        self._accept_scope = trio.CancelScope()
        self._idle = trio.Event()
        self._idle.set()
        #: The counts of connections closed: messages in, out, dropped
        #: (overflow, too large, expired).
        self._closed_counts = [0, 0, 0, 0, 0]

    def connection_statistics(self, top: int) -> list[tuple[MQTTConnectionStatistics, Account]]:
        """The figures of at most ``2 * top`` connections, bounded as the
        native ones are in ``/stat.json``: the ``top`` with the most debt
        (blocked first), then up to ``top`` more of the rest with the most
        deliveries in flight and bytes unsent (those with any); each with
        its account."""
        connections = list(self.connections.values())
        by_debt = sorted(
            connections, key=lambda c: (c.account.blocked, c.account.debt), reverse=True
        )[:top]
        chosen = {c.serial for c in by_debt}
        rest = [
            c
            for c in connections
            if c.serial not in chosen and (c.deliveries.in_flight or c.protocol.bytes_to_send)
        ]
        rest.sort(
            key=lambda c: (len(c.deliveries.in_flight), c.protocol.bytes_to_send), reverse=True
        )
        return [(c.statistics(), c.account) for c in by_debt + rest[:top]]

    def totals(self) -> MQTTTotals:
        """What the MQTT clients did (see :class:`MQTTTotals`)."""
        counts = list(self._closed_counts)
        for connection in self.connections.values():
            for index, value in enumerate(_counts(connection)):
                counts[index] += value
        messages_in, messages_out, overflow, too_large, expired = counts
        return MQTTTotals(
            connections_open=len(self.connections),
            connections_accepted=self.connections_total,
            connections_refused=self.refused_total,
            messages_in=messages_in,
            messages_out=messages_out,
            dropped_overflow=overflow,
            dropped_too_large=too_large,
            internal_errors=self.internal_errors,
            retained_messages=len(self.retained),
            retained_bytes=self.retained.bytes,
            retained_refused=self.retained.refused,
            dropped_expired=expired,
        )

    async def serve(
        self,
        listeners: Sequence[trio.SocketListener],
        handler_nursery: trio.Nursery,
        *,
        task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Accept on ``listeners`` (their connections served in
        ``handler_nursery``) until :meth:`shutting_down`."""
        sockname = listeners[0].socket.getsockname()
        self.address = (sockname[0], sockname[1])
        with self._accept_scope:
            await trio.serve_listeners(
                self.handle_stream,
                list(listeners),
                handler_nursery=handler_nursery,
                task_status=task_status,
            )

    async def handle_stream(self, stream: trio.SocketStream) -> None:
        """Serve one accepted connection until it closes."""
        services = self.services
        if services.life.closing or self._busy() >= services.config.max_connections:
            self.refused_total += 1
            await trio.aclose_forcefully(stream)
            return
        try:
            name = stream.socket.getpeername()
            peer = f"{name[0]}:{name[1]}"
        except (OSError, IndexError, TypeError):  # pragma: no cover - the peer vanished
            peer = "?"
        served: trio.abc.Stream = stream
        identity: str | None = None
        if self.ssl_context is not None:
            secured = await self._handshake(stream, peer)
            if secured is None:
                return
            served = secured
            identity = certificate_identity(secured.getpeercert())
        connection = MQTTConnection(
            services,
            served,
            next(self._serials),
            peer,
            identity=identity,
            sessions=self.sessions,
            wills=self.wills,
            retained=self.retained,
            claim=self._claim,
            forget=self._forget,
        )
        self.connections[connection.serial] = connection
        self.connections_total += 1
        self._idle = trio.Event()
        try:
            await connection.run()
        except Exception:
            # A bug of ours: it ends this connection (cleaned up by run()), not
            # the broker. Cancellation is a BaseException and passes through.
            self.internal_errors += 1
            log.exception("%s %s: ended by an internal error", connection.name, peer)

    async def _handshake(
        self, stream: trio.SocketStream, peer: str
    ) -> trio.SSLStream[trio.SocketStream] | None:
        """The TLS stream over ``stream`` once its handshake ends in time, or
        None (closed, and counted with the native listener's failures)."""
        assert self.ssl_context is not None
        services = self.services
        secured: trio.SSLStream[Any] | str = "timed out"
        with trio.move_on_after(services.config.tls_handshake_timeout):
            secured = await server_handshake(stream, self.ssl_context)
        if not isinstance(secured, str):
            return secured
        services.gate.security.tls_handshake_failures += 1
        log.info("MQTT %s: TLS handshake failed: %s", peer, secured[:200])
        await trio.aclose_forcefully(stream)
        return None

    def _claim(self, connection: MQTTConnection, clean_start: bool) -> KeptSession | None:
        """``connection`` is accepted: its client id is its own now (another
        connection with it is closed, 0x8E). The session it resumes (None:
        a clean start, or none kept): the other connection's, or one kept."""
        client_id = connection.client_id
        other = self.clients.get(client_id)
        kept = None
        if other is not None and other is not connection:
            kept = other.give_up_session()
            other.end(ReasonCode.SESSION_TAKEN_OVER, "another connection took the client id over")
        self.clients[client_id] = connection
        self.wills.cancel(client_id)
        sessions = self.sessions
        if clean_start:
            sessions.end(client_id)
            return None
        found = sessions.take(client_id, trio.current_time())
        return kept if kept is not None else found

    def _forget(self, connection: MQTTConnection) -> None:
        if self.connections.pop(connection.serial, None) is not None:
            for index, value in enumerate(_counts(connection)):
                self._closed_counts[index] += value
        if self.clients.get(connection.client_id) is connection:
            del self.clients[connection.client_id]
        if not self.connections:
            self._idle.set()

    def shutting_down(self) -> None:
        """Stop accepting; tell every client (5.0: DISCONNECT 0x8B) and close."""
        self._accept_scope.cancel()
        for connection in list(self.connections.values()):
            connection.shutting_down()

    async def wait_closed(self) -> None:
        """Wait until every connection is closed."""
        await self._idle.wait()


def _counts(connection: MQTTConnection) -> tuple[int, int, int, int, int]:
    """A connection's messages in and out, and its deliveries dropped
    (overflow, too large, expired)."""
    counters = connection.deliveries.counters
    return (
        connection.publishing.messages_in,
        counters.messages_out,
        counters.deliveries_overflowed,
        counters.deliveries_too_large,
        counters.deliveries_expired,
    )
