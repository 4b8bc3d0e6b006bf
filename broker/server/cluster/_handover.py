"""Session handover between workers: a resume that lands on the wrong worker
is passed, socket and all, to the worker that holds the session.

Clients of a multi-worker broker connect to one public address, and the
kernel spreads connections over the workers; a client that reconnects to
resume its session lands on any of them. A worker's session ids start with
the worker's index (:func:`session_prefix`), so any worker can tell a
session's home from the Hello. Before it serves a plain-TCP connection, a
worker peeks at the Hello (``MSG_PEEK``: nothing is consumed) and, if it
resumes a session another worker holds, sends the socket to that worker
over a Unix datagram socket (``SCM_RIGHTS``) and forgets it: the home worker
reads the Hello itself, as if it had accepted the connection. Nothing is
copied and the client notices nothing.

A TLS connection cannot be passed (its TLS state is in this process): its
Hello, like any resume whose home could not take the socket, is answered
with Goodbye 8 and the home's direct address (:func:`home_address`), where
the client resumes.
"""

from __future__ import annotations

import array
import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol

import trio

from broker.protocol import Cluster, Hello, Member, ProtocolError
from broker.protocol.connection._core import MAX_HELLO_FRAME
from broker.protocol.frames import FrameDecoder

log = logging.getLogger("broker.server")

__all__ = [
    "HandoverPlace",
    "hand_over",
    "hello_session",
    "home_address",
    "home_of",
    "pass_socket",
    "peek_hello",
    "receive_sockets",
    "session_prefix",
]

#: Bytes of a session id: the first names the home worker.
SESSION_ID_BYTES = 16
#: Seconds between peeks while a Hello is only partly there.
PEEK_INTERVAL = 0.005


def session_prefix(cluster: Cluster) -> bytes:
    """The first byte of every session id this worker creates: its index."""
    return bytes([cluster.index])


def home_of(session: bytes, cluster: Cluster) -> Member | None:
    """The worker that holds ``session`` if that is not this one (None: this
    worker, or not a session id). The first byte of the id, modulo the
    number of workers, names it: a worker's sessions start with its index,
    and a session from before a change of the number (or of a single
    process) is where the change put it (see ``_rehome``)."""
    if len(session) != SESSION_ID_BYTES:
        return None
    home = cluster.members[session[0] % len(cluster.members)]
    return None if home.id == cluster.worker else home


def home_address(session: bytes, cluster: Cluster) -> str | None:
    """The direct address of the worker that holds ``session``, if that is
    not this one (where a resume that cannot be handed over is sent)."""
    home = home_of(session, cluster)
    return None if home is None else home.address


async def hello_session(sock: trio.socket.SocketType) -> bytes | None:
    """The session a connection's Hello resumes, read without consuming
    anything (None: a new session, the peer closed, or not a Hello: the
    connection's own handling says why). Waits for the whole Hello: the
    caller bounds the wait."""
    hello = await peek_hello(sock)
    return None if hello is None else hello.session


async def peek_hello(sock: trio.socket.SocketType) -> Hello | None:
    """A connection's Hello, read without consuming anything (None: the
    peer closed, or its first frame is not a Hello). Waits for the whole
    Hello: the caller bounds the wait."""
    while True:
        try:
            data = await sock.recv(MAX_HELLO_FRAME + 4, socket.MSG_PEEK)
        except OSError:
            return None
        if not data:
            return None
        done, hello = first_hello(data)
        if done:
            return hello
        await trio.sleep(PEEK_INTERVAL)  # the rest of the Hello is on its way


def first_hello(data: bytes) -> tuple[bool, Hello | None]:
    """Whether ``data``, a connection's first bytes, hold its first frame
    (or can never: too large, malformed), and that frame if it is a Hello."""
    decoder = FrameDecoder(max_frame=MAX_HELLO_FRAME)
    decoder.feed(data)
    try:
        for message, _ in decoder.messages():
            return True, message if isinstance(message, Hello) else None
    except ProtocolError:
        return True, None
    return False, None


class HandoverPlace(Protocol):
    """What handing over needs of a worker's place (``WorkerSetup``)."""

    @property
    def cluster(self) -> Cluster: ...

    @property
    def handover_paths(self) -> Mapping[str, str]: ...


async def hand_over(stream: trio.SocketStream, place: HandoverPlace, wait: float) -> bool:
    """If ``stream``'s Hello (within ``wait`` seconds) resumes a session another
    worker holds, pass the connection to it and close this copy; whether it
    went (if not, this worker serves the connection as usual)."""
    session = None
    with trio.move_on_after(wait):
        session = await hello_session(stream.socket)
    home = None if session is None else home_of(session, place.cluster)
    path = None if home is None else place.handover_paths.get(home.id)
    if path is None or not pass_socket(stream.socket, path):
        return False
    await trio.aclose_forcefully(stream)
    return True


def pass_socket(sock: trio.socket.SocketType, path: str) -> bool:
    """Send the connection ``sock`` to the worker listening for handovers at
    ``path``; whether it went (the caller then closes its own copy)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
        try:
            sender.setblocking(False)
            # (socket.send_fds would drop the address: sendmsg takes it.)
            rights = array.array("i", [sock.fileno()])
            sender.sendmsg([b"s"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, rights)], 0, path)
        except OSError as error:
            log.warning("could not hand a connection over to %s: %s", path, error)
            return False
    return True


async def receive_sockets(
    listener: socket.socket,
    serve: Callable[[trio.SocketStream], Awaitable[None]],
    nursery: trio.Nursery,
) -> None:
    """Serve (in ``nursery``) every connection other workers hand over on the
    datagram socket ``listener``, until cancelled."""
    listener.setblocking(False)
    while True:
        await trio.lowlevel.wait_readable(listener)
        try:
            _, fds, _, _ = socket.recv_fds(listener, 16, 8)
        except BlockingIOError:
            continue
        for fd in fds:
            received = socket.socket(fileno=fd)
            with contextlib.suppress(OSError):
                received.setblocking(False)
            stream = trio.SocketStream(trio.socket.from_stdlib_socket(received))
            nursery.start_soon(serve, stream)
