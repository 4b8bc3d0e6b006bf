"""What both clients share: addresses, received messages, errors."""

from __future__ import annotations

import dataclasses
import logging
import ssl
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any

from broker.config import LOOPBACK, ConfigError, parse_address
from broker.errors import BrokerError
from broker.protocol import (
    SUBSCRIPTION_BINDS,
    Channel,
    ChannelKind,
    ClientSessionState,
    Confirm,
    Connection,
    ConnectionClosed,
    DeliverManyReceived,
    DeliverReceived,
    DropAnnounced,
    Event,
    FramesAbandoned,
    Gap,
    GoodbyeCode,
    HandleDeleted,
    HandleFreeProposed,
    HandleType,
    Headers,
    Outcome,
    OutcomeStatus,
    Policy,
    Pong,
    Publish,
    Stage,
    SubscriptionDropped,
    Throttled,
    WelcomeReceived,
    decode_body,
)
from broker.tls import client_context

from ._topics import TopicCache

log = logging.getLogger("broker.client")

DEFAULT_PORT = 7400
#: The async client yields to the scheduler at least once per this many
#: publishes that did not have to wait, so its writer can batch them.
PUBLISHES_PER_YIELD = 64
#: Consumed messages whose buffer space a subscription releases together (it
#: releases sooner when the application has consumed everything received).
RELEASE_BATCH = 32
#: The most messages ``receive_batch()`` returns unless told otherwise.
BATCH_MOST = 1024
#: Goodbye codes after which a client with ``reconnect`` tries again (besides
#: a broken or silent connection): the broker went away, not the client's fault.
RECONNECT_CODES = frozenset({GoodbyeCode.LEASE_EXPIRED, GoodbyeCode.SHUTTING_DOWN})
#: First and longest pause between reconnection attempts (doubling in between).
BACKOFF_FIRST = 0.05
BACKOFF_MOST = 2.0
#: Why a connection ended when its peer closed it (end of stream, no Goodbye).
PEER_CLOSED = "the broker closed the connection"
#: How many of a peer's first bytes a client keeps, to say what answered its Hello.
ANSWER_KEPT = 64


class ClientError(BrokerError):
    """Base class of the client's errors."""


class LimitReached(ClientError):
    """A limit of the broker's stops the operation: the message says which
    and what to do. Nothing was done; the connection goes on."""


def subscription_limit(subscriptions: int) -> LimitReached:
    """The error of a Subscribe the broker has no room for at its limit."""
    return LimitReached(
        f"the broker allows no more subscriptions on this connection ({subscriptions} held; "
        "its max_subscriptions setting): close some, or subscribe on another connection"
    )


class StagingRefused(ClientError):
    """The broker refused a commit or abort of staged publishes (``reason`` says why)."""

    def __init__(self, batch: str, reason: str) -> None:
        super().__init__(f"batch {batch!r}: {reason}")
        self.batch = batch
        self.reason = reason


def check_outcome(batch: str, outcome: Outcome) -> Outcome:
    """``outcome``, unless it is a refusal (then :class:`StagingRefused`)."""
    if outcome.status == OutcomeStatus.REFUSED:
        raise StagingRefused(batch, outcome.reason)
    return outcome


class ConnectionLost(ClientError):
    """The connection is closed: by Goodbye (``code``/``reason``) or a broken socket."""

    def __init__(self, reason: str, code: int | None = None) -> None:
        super().__init__(reason if code is None else f"goodbye {code}: {reason}")
        self.code = code
        self.reason = reason


def show_address(host: str, port: int) -> str:
    """``host:port`` as a user types it (``[host]:port`` for an IPv6 address)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def not_a_broker(
    address: str, answer: bytes, *, waited: float | None = None, tls: bool = False
) -> ConnectionLost:
    """The error of a peer at ``address`` that did not answer a Hello as a
    broker does, in one line that says what it looks like: ``answer`` is the
    first bytes it sent (empty: none), ``waited`` the seconds it stayed silent
    (None: it closed the connection), ``tls`` whether the client spoke TLS."""
    if answer.startswith(b"HTTP/"):
        what = "it looks like HTTP"
    elif answer.startswith(b"SSH-"):
        what = "it looks like SSH"
    elif answer[:1] in (b"\x15", b"\x16") and answer[1:2] == b"\x03" and not tls:
        what = f"it answered in TLS: use tls://{address}"
    elif answer:
        what = f"it sent {answer[:24]!r}"
    elif waited is not None:
        what = f"no answer within {waited:g} s"
    elif tls:
        what = "it closed the connection without a word"
    else:
        what = (
            "it closed the connection without a word, as a TLS broker does "
            f"to a plain client: for TLS use tls://{address}"
        )
    return ConnectionLost(f"{address} did not answer as a broker ({what})")


@dataclass(frozen=True, slots=True)
class Message:
    """One delivered message."""

    topic: str
    payload: bytes
    key: bytes | None
    headers: Headers | None
    seq: int


#: URL schemes of plain TCP and of TLS.
PLAIN_SCHEMES = ("broker://", "tcp://")
TLS_SCHEMES = ("brokers://", "tls://")


def parse_url(url: str) -> tuple[str, int]:
    """``"host:port"``, ``"broker://host:port"``, ``"tls://host:port"`` or
    ``"host"`` -> ``(host, port)``."""
    host, port, _ = split_url(url)
    return host, port


def split_url(url: str) -> tuple[str, int, bool]:
    """``url`` -> ``(host, port, tls)``: ``tls`` is true for the ``tls://`` and
    ``brokers://`` schemes; no scheme means plain TCP."""
    tls = url.startswith(TLS_SCHEMES)
    for scheme in PLAIN_SCHEMES + TLS_SCHEMES:
        if url.startswith(scheme):
            url = url[len(scheme) :]
    try:
        host, port = parse_address(url.rstrip("/"), default_port=DEFAULT_PORT)
    except ConfigError as error:
        raise ClientError(str(error)) from None
    return host, port, tls


def client_policy(policy: Policy | None, optimism: int) -> Policy | None:
    """``policy`` with ``optimism`` bytes of optimistic sending, if asked for."""
    if optimism < 0:
        raise ClientError("optimism must be >= 0 bytes")
    if not optimism:
        return policy
    return dataclasses.replace(policy or Policy(), optimism=optimism)


def connection_target(
    url: str, ssl_context: ssl.SSLContext | None, token: str | None = None
) -> tuple[str, int, ssl.SSLContext | None]:
    """Where a client connecting to ``url`` goes, and with which TLS context:
    ``ssl_context`` if given (TLS whatever the scheme), the system's default
    for a TLS scheme, else None (plain TCP). Sending a ``token`` in clear
    beyond loopback is logged as a warning."""
    host, port, tls = split_url(url)
    if ssl_context is None and tls:
        ssl_context = client_context()
    if ssl_context is None and token is not None and host not in LOOPBACK:
        log.warning("sending a token to %s without TLS: anyone on the path can read it", host)
    return host, port, ssl_context


def resume_state(conn: Connection, subscriptions: Mapping[int, Any]) -> ClientSessionState:
    """The session of ``conn`` as it stands, for a resume: only the open
    subscriptions of ``subscriptions`` (handle -> subscription), each
    processed up to what the application consumed (the rest is delivered
    again)."""
    state = conn.session_state()
    assert isinstance(state, ClientSessionState)
    live = {
        handle: info
        for handle, info in state.subscriptions.items()
        if (sub := subscriptions.get(handle)) is not None and not sub._closed
    }
    processed = {handle: subscriptions[handle]._consumed for handle in live}
    return dataclasses.replace(state, subscriptions=live, processed=processed)


def unconfirmed_publishes(
    state: ClientSessionState,
) -> list[tuple[str, Stage | None, Publish]]:
    """The messages of a lost session the broker never confirmed, in the
    order they were published per topic: ``(topic name, stage, Publish)``."""
    messages = []
    for handle, (_, frames) in sorted(state.retained.items()):
        topic = state.topics[handle]
        stage = state.stages.get(handle)
        for frame in frames:
            message = decode_body(frame[4:])
            assert isinstance(message, Publish)
            messages.append((topic, stage, message))
    return messages


def log_session_lost(name: str, state: ClientSessionState) -> None:
    """Say (a warning) that the broker no longer knows the session ``state`` records."""
    unconfirmed = sum(len(frames) for _, frames in state.retained.values())
    log.warning(
        "%s: the broker lost our session (it restarted, or the session expired): "
        "subscribing again to %d topic(s), publishing %d unconfirmed message(s) again; "
        "messages published meanwhile were not delivered to us",
        name,
        len(state.subscriptions),
        unconfirmed,
    )


class ClientEvents:
    """What both clients do with the protocol's events: deliveries into their
    subscription's queue, Confirm counts, Pong nonces, Throttled advisories,
    Gap notices (``missed``), and the end of the connection.

    A subclass provides ``_fail(error)`` (the connection is over) and
    ``_release(event)`` (free a delivery nobody will consume); its
    subscriptions have ``_inbox``, ``_closed``, ``received`` and ``missed``.
    """

    name: str
    _subscriptions: dict[int, Any]
    _topics: dict[Hashable, int]
    _cache: TopicCache
    _conn: Connection

    def __init__(self) -> None:
        self._confirmed: dict[int, int] = {}
        self._goodbye_code: int | None = None
        self._goodbye_by_peer = False
        #: The highest nonce of a Pong received (nonces of our Pings increase).
        self._pong = 0
        #: Channels the broker says it is withholding guarantees on (advisory).
        self.throttled: set[Channel] = set()
        #: Announced drops of frames sent beyond the guarantees, and how many
        #: frames they made the client send again (optimistic mode).
        self.drops_announced = 0
        self.frames_resent = 0
        self._optimistic = False
        #: Outcomes of this connection's commits and aborts, by request number.
        self._outcomes: dict[int, Outcome] = {}
        #: Frames the last Welcome made the client send again (on a resume).
        self._resent_last = 0
        #: Sessions resumed on a new connection, and frames they sent again.
        self.resumes = 0
        self.frames_resent_on_resume = 0
        #: Times the broker no longer knew the session (it restarted, or the
        #: session expired): subscriptions were made again, messages may be lost.
        self.sessions_lost = 0
        #: The first bytes the peer sent before its Welcome (see ``_keep_answer``).
        self._answer = b""

    def _fail(self, error: ConnectionLost) -> None:
        raise NotImplementedError

    def _keep_answer(self, data: bytes | bytearray | memoryview) -> None:
        """Keep the start of what the peer sent before its Welcome (read
        before the protocol sees it), to say what answered if it was no broker."""
        if len(self._answer) < ANSWER_KEPT:
            self._answer += bytes(data[: ANSWER_KEPT - len(self._answer)])

    def _handshake_error(
        self, error: ConnectionLost | None, address: str, waited: float, tls: bool
    ) -> ConnectionLost:
        """What a failed handshake with ``address`` raises: ``error`` (None:
        no Welcome within ``waited`` seconds) as it is when the broker said
        Goodbye (a refusal) or the transport failed, else a
        :func:`not_a_broker` line: the peer answered what no broker sends,
        closed without a word, or stayed silent."""
        if error is None:
            return not_a_broker(address, self._answer, waited=waited, tls=tls)
        if error.code is not None and not self._goodbye_by_peer:  # its bytes broke the protocol
            return not_a_broker(address, self._answer, tls=tls)
        if error.code is None and error.reason == PEER_CLOSED:
            return not_a_broker(address, self._answer, tls=tls)
        return error

    def _topic_of(self, channel: Channel) -> str | None:
        """The topic whose publish channel ``channel`` is (None for other channels)."""
        if channel.kind == ChannelKind.PUBLISH:
            for key, bound in self._topics.items():
                if bound == channel.index:
                    return str(key[0]) if isinstance(key, tuple) else str(key)
        return None

    @property
    def throttled_topics(self) -> set[str]:
        """Topics the broker says it withholds guarantees on, for longer than
        its notice threshold (advisory: publishing to them waits)."""
        names = {self._topic_of(channel) for channel in self.throttled}
        return {name for name in names if name is not None}

    def _release(self, event: DeliverReceived | DeliverManyReceived) -> None:
        raise NotImplementedError

    def _on_throttled(self, event: Throttled) -> None:
        channel = event.channel
        if event.throttled:
            self.throttled.add(channel)
        else:
            self.throttled.discard(channel)
        if channel == SUBSCRIPTION_BINDS:
            log.log(
                logging.INFO if event.throttled else logging.DEBUG,
                "%s: %s",
                self.name,
                "near the broker's limit of subscriptions per connection"
                if event.throttled
                else "no longer near the broker's subscription limit",
            )
            return
        topic = self._topic_of(channel)
        if self._cache.on_throttled(self._conn, channel, event.throttled):
            # A new channel the broker has no room for yet: the client
            # releases a topic it no longer uses to make some (see _topics).
            log.debug("%s: no capacity for topic %r yet", self.name, topic)
        elif event.throttled:
            log.info("%s: the broker withholds guarantees on topic %r", self.name, topic)
        else:
            log.info("%s: topic %r flows again", self.name, topic)

    def _resumed(self, received: dict[int, int]) -> None:
        """The session was resumed: the broker had ``received`` publishes per
        topic handle (confirmed, then); count it and say so."""
        for handle, count in received.items():
            self._confirmed[handle] = max(self._confirmed.get(handle, 0), count)
        self._cache.connection_replaced()
        self.resumes += 1
        self.frames_resent_on_resume += self._resent_last
        log.info("%s: session resumed; %d frames sent again", self.name, self._resent_last)

    def _apply_events(self, events: list[Event]) -> None:
        for event in events:
            if type(event) is DeliverReceived or type(event) is DeliverManyReceived:
                subscription = self._subscriptions.get(event.message.subscription)
                if subscription is None or subscription._closed:
                    self._release(event)  # a subscription being freed
                else:
                    subscription.received += subscription._inbox.put(event)
            elif type(event) is Gap:
                subscription = self._subscriptions.get(event.subscription)
                if subscription is not None:
                    subscription.missed += event.count
            elif type(event) is Confirm:
                self._confirmed[event.topic] = event.count
            elif type(event) is Pong:
                self._pong = max(self._pong, event.nonce)
            elif type(event) is Outcome:
                self._outcomes[event.request] = event
            elif type(event) is WelcomeReceived:
                self._resent_last = event.resent
            elif isinstance(event, Throttled):
                self._on_throttled(event)
            elif type(event) is HandleDeleted and event.handle_type == HandleType.TOPIC:
                self._cache.on_deleted(event.handle)
                self.throttled.discard(Channel(ChannelKind.PUBLISH, event.handle))
            elif type(event) is HandleFreeProposed and event.handle_type == HandleType.TOPIC:
                self._cache.on_free_proposed(event.handle)
            elif isinstance(event, ConnectionClosed):
                self._goodbye_code = event.code
                self._goodbye_by_peer = event.by_peer
                if event.by_peer:
                    self._fail(ConnectionLost(event.reason, event.code))
                else:
                    self._fail(ConnectionLost(f"protocol error: {event.reason}", event.code))
            elif isinstance(event, DropAnnounced):
                # Frames sent beyond the guarantees were dropped; the protocol
                # retransmits them, in order, before anything new.
                self.drops_announced += 1
                self.frames_resent += event.frames
                level = logging.DEBUG if self._optimistic else logging.WARNING
                log.log(level, "%s: %s (resending them)", self.name, event)
            elif isinstance(event, FramesAbandoned):
                log.warning("%s: %s", self.name, event)
            elif isinstance(event, SubscriptionDropped):
                # The resumed session no longer has it: it ends (receiving
                # from it raises ClientError); the rest goes on.
                dropped = self._subscriptions.pop(event.subscription, None)
                if dropped is not None:
                    dropped._closed = True
                log.warning(
                    "%s: the broker ended our subscription to %r", self.name, event.topic_name
                )
