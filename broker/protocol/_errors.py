"""Errors of the wire protocol: local misuse versus a misbehaving peer."""

from __future__ import annotations

from broker.errors import BrokerError

from ._types import GoodbyeCode


class ProtocolError(BrokerError):
    """Base class of every error ``broker.protocol`` raises."""


class LocalProtocolError(ProtocolError):
    """This side asked for something the protocol does not allow.

    Raised before any state changes or any bytes are queued, so the
    connection is still usable after catching it.
    """


class RemoteProtocolError(ProtocolError):
    """The peer broke the protocol.

    ``code`` is the Goodbye code the connection sends before closing;
    ``reason`` is the human-readable text that goes with it.
    """

    def __init__(self, reason: str, code: GoodbyeCode = GoodbyeCode.PROTOCOL_ERROR) -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code
