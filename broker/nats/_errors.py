"""The NATS client's errors: one base class, one class per thing a caller
does differently, each with a one-line message that says what to do."""

from __future__ import annotations

from broker.errors import BrokerError

__all__ = [
    "ConnectError",
    "ConnectionClosed",
    "ConnectionLost",
    "JetStreamError",
    "JetStreamUnavailable",
    "NatsError",
    "NoResponders",
    "PayloadTooLarge",
    "RequestTimeout",
    "SlowConsumer",
]


class NatsError(BrokerError):
    """Base class of every error of :mod:`broker.nats`."""


class ConnectError(NatsError):
    """No server of the list could be connected to (the message says why)."""


class ConnectionClosed(NatsError):
    """The client is closed, or gave up reconnecting: nothing more can be sent."""


class ConnectionLost(NatsError):
    """The connection a request was sent on broke before its reply came;
    the client reconnects by itself: the request may be sent again."""


class NoResponders(NatsError):
    """No subscriber listens on the request's subject (the server said 503)."""

    def __init__(self, subject: str) -> None:
        super().__init__(f"no responders on {subject!r}: nothing subscribes to it")
        self.subject = subject


class RequestTimeout(NatsError):
    """A request's reply did not come within its timeout."""

    def __init__(self, subject: str, timeout: float) -> None:
        super().__init__(f"no reply on {subject!r} within {timeout:g} s")
        self.subject = subject
        self.timeout = timeout


class SlowConsumer(NatsError):
    """A subscription's buffer was full: ``dropped`` messages were thrown
    away (NATS's at-most-once delivery); the subscription goes on."""

    def __init__(self, subject: str, dropped: int) -> None:
        super().__init__(
            f"subscription {subject!r} did not keep up: {dropped} message(s) dropped; "
            "receive faster or raise its max_pending"
        )
        self.subject = subject
        self.dropped = dropped


class PayloadTooLarge(NatsError, ValueError):
    """A message larger than the server's ``max_payload``; nothing was sent."""

    def __init__(self, size: int, max_payload: int) -> None:
        super().__init__(
            f"message of {size} bytes is larger than the server's max_payload ({max_payload})"
        )
        self.size = size
        self.max_payload = max_payload


class JetStreamError(NatsError):
    """JetStream refused a request: ``code`` (HTTP-like), ``err_code`` (JetStream's
    own number, e.g. 10071 for a wrong last sequence) and its ``description``."""

    def __init__(self, code: int, err_code: int, description: str) -> None:
        super().__init__(f"JetStream refused: {description} (code {code}, err_code {err_code})")
        self.code = code
        self.err_code = err_code
        self.description = description


class JetStreamUnavailable(NatsError):
    """JetStream did not answer (no responders, a timeout or a lost connection,
    as during a leader election): retryable; a publish is sent again with the
    same ``Nats-Msg-Id`` (a duplicate answer then means it was stored)."""
