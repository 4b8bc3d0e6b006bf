"""What both clients share: addresses, received messages, errors."""

from __future__ import annotations

from dataclasses import dataclass

from broker.config import ConfigError, parse_address
from broker.errors import BrokerError
from broker.protocol import Headers

DEFAULT_PORT = 7400
#: The async client yields to the scheduler at least once per this many
#: publishes that did not have to wait, so its writer can batch them.
PUBLISHES_PER_YIELD = 64
#: Consumed messages whose buffer space a subscription releases together (it
#: releases sooner when the application has consumed everything received).
RELEASE_BATCH = 32


class ClientError(BrokerError):
    """Base class of the client's errors."""


class ConnectionLost(ClientError):
    """The connection is closed: by Goodbye (``code``/``reason``) or a broken socket."""

    def __init__(self, reason: str, code: int | None = None) -> None:
        super().__init__(reason if code is None else f"goodbye {code}: {reason}")
        self.code = code
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Message:
    """One delivered message."""

    topic: str
    payload: bytes
    key: bytes | None
    headers: Headers | None
    seq: int


def parse_url(url: str) -> tuple[str, int]:
    """``"host:port"``, ``"broker://host:port"`` or ``"host"`` -> ``(host, port)``."""
    for scheme in ("broker://", "tcp://"):
        if url.startswith(scheme):
            url = url[len(scheme) :]
    try:
        return parse_address(url.rstrip("/"), default_port=DEFAULT_PORT)
    except ConfigError as error:
        raise ClientError(str(error)) from None
