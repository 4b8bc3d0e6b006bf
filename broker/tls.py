"""TLS for the client listener and the clients, with the standard :mod:`ssl` module.

- :func:`server_context` builds the broker's context from ``tls_cert`` and
  ``tls_key`` (PEM files); with ``tls_client_ca`` it also requires and
  verifies client certificates (mutual TLS).
- :func:`client_context` builds a client's: the system's trust store, or
  ``cafile``; ``certfile``/``keyfile`` present a client certificate.
- :func:`certificate_identity` names the client of a verified certificate:
  its subject common name, which auth files list as ``identities``.
- :func:`server_handshake` runs a listener's side of the handshake, for the
  native and the MQTT listeners alike.

Both sides require TLS 1.2 or newer; hostnames are checked by the clients.
"""

from __future__ import annotations

import ssl
from typing import Any, TypeVar

import trio

from broker.errors import BrokerError

__all__ = [
    "TLSConfigError",
    "certificate_identity",
    "client_context",
    "server_context",
    "server_handshake",
]

_S = TypeVar("_S", bound=trio.abc.Stream)


class TLSConfigError(BrokerError):
    """A certificate, key or CA file could not be loaded."""


def server_context(certfile: str, keyfile: str, client_cafile: str = "") -> ssl.SSLContext:
    """The broker's TLS context; with ``client_cafile``, clients must present a
    certificate signed by one of its CAs."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load(context.load_cert_chain, certfile, keyfile, what="certificate/key")
    if client_cafile:
        _load(context.load_verify_locations, client_cafile, what="client CA")
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def client_context(
    cafile: str | None = None, certfile: str | None = None, keyfile: str | None = None
) -> ssl.SSLContext:
    """A client's TLS context: verifies the broker against ``cafile`` (default:
    the system's trust store) and its hostname; presents ``certfile`` if given."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if cafile:
        _load(context.load_verify_locations, cafile, what="CA")
    if certfile:
        _load(context.load_cert_chain, certfile, keyfile, what="client certificate/key")
    return context


def certificate_identity(certificate: dict[str, Any] | None) -> str | None:
    """The subject common name of a verified peer certificate (as returned by
    ``getpeercert()``), or ``None`` when there is none."""
    if not certificate:
        return None
    for rdn in certificate.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


async def server_handshake(stream: _S, context: ssl.SSLContext) -> trio.SSLStream[_S] | str:
    """The TLS stream over ``stream`` once the server side of its handshake
    completes, or the TLS error that ended it (the caller closes ``stream``
    then). Callers bound it with a cancel scope; cancellation goes through."""
    secured = trio.SSLStream(stream, context, server_side=True)
    try:
        await secured.do_handshake()
    except trio.BrokenResourceError as error:
        return str(error.__cause__ or error)
    return secured


def _load(loader: Any, *files: str | None, what: str) -> None:
    try:
        loader(*files)
    except (OSError, ssl.SSLError) as error:
        names = ", ".join(f for f in files if f)
        raise TLSConfigError(f"cannot load TLS {what} from {names}: {error}") from None
