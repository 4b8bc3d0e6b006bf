"""What both clients share: addresses, received messages, errors."""

from __future__ import annotations

import dataclasses
import logging
import ssl
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from broker.config import LOOPBACK, ConfigError, parse_address
from broker.errors import BrokerError
from broker.protocol import (
    AdminAnswer,
    AdminStatus,
    AdminValue,
    Answer,
    Headers,
    Offsets,
    Outcome,
    OutcomeStatus,
    Policy,
)
from broker.tls import client_context

log = logging.getLogger("broker.client")

DEFAULT_PORT = 7400
#: Why a connection ended when its peer closed it (end of stream, no Goodbye).
PEER_CLOSED = "the broker closed the connection"


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


class AdminRefused(ClientError):
    """The broker did not do an ``admin`` request: ``status`` (see
    :class:`~broker.protocol.AdminStatus`) and the broker's one-line
    ``reason`` (the message says what to change)."""

    def __init__(self, command: str, status: int, reason: str) -> None:
        super().__init__(f"{command}: {reason}")
        self.command = command
        self.status = status
        self.reason = reason


def admin_rows(command: str, answer: Answer) -> list[dict[str, AdminValue]]:
    """The rows of an AdminAnswer; a refusal raises :class:`AdminRefused`."""
    assert isinstance(answer, AdminAnswer)
    if answer.status != AdminStatus.OK:
        raise AdminRefused(command, answer.status, answer.reason)
    return answer.rows


def check_outcome(batch: str, outcome: Answer) -> Outcome:
    """``outcome``, unless it is a refusal (then :class:`StagingRefused`)."""
    assert isinstance(outcome, Outcome)
    if outcome.status == OutcomeStatus.REFUSED:
        raise StagingRefused(batch, outcome.reason)
    return outcome


def offsets_answer(answer: Answer) -> dict[str, tuple[int, int]]:
    """The ``{topic: (first, end)}`` of an Offsets answer (see
    :meth:`broker.client.Client.offsets`); its refusal raises :class:`ClientError`."""
    assert isinstance(answer, Offsets)
    if answer.reason:
        raise ClientError(f"the broker lists no offsets: {answer.reason}")
    return {name: (first, end) for name, first, end in answer.topics}


class ConnectionLost(ClientError):
    """The connection is closed: by Goodbye (``code``/``reason``) or a broken socket."""

    def __init__(self, reason: str, code: int | None = None, *, unreachable: bool = False) -> None:
        super().__init__(reason if code is None else f"goodbye {code}: {reason}")
        self.code = code
        self.reason = reason
        #: The broker's address could not be reached at all (nothing answered
        #: the connection), as opposed to a connection that broke or was refused.
        self.unreachable = unreachable


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


class GroupSettler(Protocol):
    """Who settles a consumer group member's messages (its subscription)."""

    def _settle(self, seq: int, outcome: int, detail: int | str | None) -> None: ...


class GroupTicket:
    """What a group member's messages settle through: their subscription,
    while its session lasts (a session lost makes a new ticket; settling a
    message of the old one does nothing: its record went back to the group)."""

    __slots__ = ("settler", "valid")

    def __init__(self, settler: GroupSettler) -> None:
        self.settler = settler
        self.valid = True


@dataclass(frozen=True, slots=True)
class Message:
    """One delivered message.

    ``seq`` is its sequence number in the subscription (what an ``Ack``
    names). ``offset`` is its record's offset in the topic's log: set when
    the broker keeps topic logs (its Welcome said ``offsets``) and the
    subscription is reliable (then it equals ``seq``, but for a consumer
    group's member, whose ``seq`` numbers its own deliveries), None
    otherwise. A consumer that remembers it can continue after it on any
    later connection: ``subscribe(topic, start=message.offset + 1)``.
    ``timestamp`` is the time the broker received its record (ms since the
    Unix epoch, as its topic log stored it): set when the subscription
    asked for ``timestamps``, None otherwise. ``deliveries`` is, for a
    consumer group's member, how many times the record was delivered
    before (0 the first time), None otherwise.

    A group member settles each message: :meth:`ack` (done),
    :meth:`retry`, :meth:`reject`, or :meth:`in_progress` to keep it longer.
    """

    topic: str
    payload: bytes
    key: bytes | None
    headers: Headers | None
    seq: int
    offset: int | None = None
    timestamp: int | None = None
    deliveries: int | None = None
    _ticket: GroupTicket | None = dataclasses.field(default=None, repr=False, compare=False)

    if not TYPE_CHECKING:  # (so that mypy still refuses unknown attributes)

        def __getattr__(self, name: str) -> None:
            """``timestamp``, ``deliveries`` and the group's ticket are None
            where they were never set: the client makes messages without
            them unless the subscription has them, which saves every other
            message a slot write."""
            if name in _UNSET:
                return None
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def _settle(self, outcome: int, detail: int | str | None = None) -> None:
        ticket = self._ticket
        if ticket is None:
            raise ClientError(
                "only a consumer group member's messages are settled: "
                "subscribe with group=NAME (other messages are acknowledged as they are taken)"
            )
        if ticket.valid:
            ticket.settler._settle(self.seq, outcome, detail)

    def ack(self) -> None:
        """Done with this record: the group never delivers it again (a
        member's ``Settle``, sent in batches within the policy's ``ack_delay``)."""
        self._settle(0)

    def retry(self, delay: float = 0.0) -> None:
        """Not done: deliver the record again (to any member) after ``delay``
        seconds. After the group's ``max_deliveries`` it goes to the dead letters."""
        if not delay >= 0:
            raise ValueError("delay must be >= 0 seconds")
        self._settle(1, round(delay * 1000))

    def reject(self, reason: str = "") -> None:
        """Never deliver the record again: it goes to the group's dead-letter
        topic with ``reason`` in its headers."""
        self._settle(2, reason.encode()[:1024].decode(errors="ignore"))

    def in_progress(self) -> None:
        """Still working on it: the group waits another ``ack_wait`` before
        giving the record to another member."""
        self._settle(3)


#: Message fields a message may leave unset (read as None).
_UNSET = frozenset({"timestamp", "deliveries", "_ticket"})


def handshake_error(
    error: ConnectionLost | None,
    answer: bytes,
    goodbye_by_peer: bool,
    address: str,
    waited: float,
    tls: bool,
) -> ConnectionLost:
    """What a failed handshake with ``address`` raises: ``error`` (None: no
    Welcome within ``waited`` seconds) as it is when the broker said Goodbye
    (``goodbye_by_peer``) or the transport failed, else a :func:`not_a_broker`
    line about ``answer`` (the first bytes the peer sent)."""
    if error is None:
        return not_a_broker(address, answer, waited=waited, tls=tls)
    if error.code is not None and not goodbye_by_peer:  # its bytes broke the protocol
        return not_a_broker(address, answer, tls=tls)
    if error.code is None and error.reason == PEER_CLOSED:
        return not_a_broker(address, answer, tls=tls)
    return error


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
    if "://" in url:
        scheme = url.partition("://")[0] + "://"
        raise ClientError(
            f"{scheme} is not a broker address: use HOST:PORT, or tls://HOST:PORT for TLS"
        )
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
