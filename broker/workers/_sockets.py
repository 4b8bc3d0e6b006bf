"""The listening sockets a supervisor makes for its workers.

They are made once, by the supervisor, and handed to each worker process
(``pass_fds``): a worker that is restarted listens on the very same sockets,
so a client connecting meanwhile waits in the backlog instead of being
refused, and every address stays what the Welcome told clients.

trio has no ``SO_REUSEPORT`` option, so these are made by hand.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

__all__ = ["BACKLOG", "reuseport_group", "tcp_listener", "unix_datagram", "unix_listener"]

#: Listen backlog of every socket (the kernel caps it at somaxconn).
BACKLOG = 4096


def _family(host: str) -> socket.AddressFamily:
    infos = socket.getaddrinfo(host or None, 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    return infos[0][0]


def _bound(host: str, port: int, *, reuseport: bool) -> socket.socket:
    family = _family(host)
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuseport:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)
        sock.set_inheritable(True)
    except BaseException:
        sock.close()
        raise
    return sock


def _free(host: str, port: int) -> None:
    """Raise ``OSError`` (EADDRINUSE) if a socket is bound to ``host:port``:
    a plain bind, without ``SO_REUSEPORT``, fails beside any listener."""
    probe = socket.socket(_family(host), socket.SOCK_STREAM)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((host, port))
    finally:
        probe.close()


def reuseport_group(host: str, port: int, count: int) -> list[socket.socket]:
    """``count`` listening sockets on one ``host:port``, all with
    ``SO_REUSEPORT``: the kernel spreads new connections over them (by a
    hash of the client's address and port). ``port`` 0 picks a free port
    for the first and binds the others to the same one.

    A port another process listens on is refused (``OSError`` EADDRINUSE)
    as a single listener's would be, even if that process used
    ``SO_REUSEPORT`` too (another broker of several workers): the kernel
    would otherwise spread the clients over both brokers. (Checked by a
    plain bind just before: two brokers started within that moment are not
    caught.)"""
    if port:
        _free(host, port)
    first = _bound(host, port, reuseport=True)
    group = [first]
    try:
        chosen = first.getsockname()[1]
        for _ in range(count - 1):
            group.append(_bound(host, chosen, reuseport=True))
    except BaseException:
        for sock in group:
            sock.close()
        raise
    return group


def tcp_listener(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (0: a free port)."""
    return _bound(host, port, reuseport=False)


def _unix(path: Path, kind: socket.SocketKind) -> socket.socket:
    if path.exists() or path.is_symlink():
        path.unlink()
    sock = socket.socket(socket.AF_UNIX, kind)
    try:
        old = os.umask(0o177)
        try:
            sock.bind(str(path))
        finally:
            os.umask(old)
        if kind == socket.SOCK_STREAM:
            sock.listen(BACKLOG)
        sock.set_inheritable(True)
    except BaseException:
        sock.close()
        raise
    return sock


def unix_listener(path: Path) -> socket.socket:
    """A listening Unix stream socket at ``path`` (replacing a stale one),
    readable and writable by this user only."""
    return _unix(path, socket.SOCK_STREAM)


def unix_datagram(path: Path) -> socket.socket:
    """A bound Unix datagram socket at ``path`` (replacing a stale one), for
    this user only: where a worker receives the connections handed to it."""
    return _unix(path, socket.SOCK_DGRAM)
