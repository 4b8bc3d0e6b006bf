"""Listening problems of ``broker serve``: one line that says what to do."""

from __future__ import annotations

import errno
import socket

__all__ = ["CannotListen", "check_free", "check_metrics_free", "metrics_unavailable"]


class CannotListen(Exception):
    """An address of the broker's is taken (or otherwise cannot be listened on)."""

    def __init__(self, what: str, address: tuple[str, int], flag: str, error: OSError) -> None:
        host, port = address
        shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        reason = error.strerror or str(error)
        hint = ""
        if error.errno == errno.EADDRINUSE:
            hint = f" (another process has it: stop it, or choose another with {flag})"
        super().__init__(f"cannot listen for {what} on {shown}: {reason}{hint}")


def check_free(host: str, port: int) -> None:
    """Raise :class:`OSError` if a listener could not bind ``host:port`` now
    (every address ``host`` resolves to; ``SO_REUSEADDR`` as trio sets it, so
    connections of an earlier run waiting out TIME_WAIT do not count)."""
    for family, kind, proto, _, address in socket.getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    ):
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            probe.bind(address)


def check_metrics_free(metrics: tuple[str, int] | None) -> None:
    """Raise :class:`CannotListen` now if the metrics address (a fixed port)
    is taken: checked before anything says it listens."""
    if metrics is not None and metrics[1] != 0:
        try:
            check_free(*metrics)
        except OSError as error:
            raise metrics_unavailable(metrics, error) from None


def metrics_unavailable(metrics: tuple[str, int], error: OSError) -> CannotListen:
    """The one line for a metrics address that cannot be listened on."""
    return CannotListen("HTTP (metrics)", metrics, "--metrics-listen", error)
