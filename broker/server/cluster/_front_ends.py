"""A front end's place among the live front ends of a cluster (cluster mode).

Front ends serving one JetStream cluster share out its topics the way a
multi-worker broker's workers do (``broker.protocol._owners``: rendezvous
hashing over the members' ids): one front end owns a topic and writes its
stream; the others forward to it over a link, a client connection to the
owner's link address (``host:port``, TCP). The membership comes from the
front ends' heartbeats (``_members``); a :class:`FrontEndPlacement` is one
membership's view, fixed for as long as the front end serves with it (a
change of members makes the front end serve afresh with a new one).

A link presents :attr:`FrontEndPlacement.token` in its Hello; the owner
serves a link connection only with that token (see :func:`link_token`).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import trio

from broker.protocol import Cluster

from ._stored_counts import StoredCounts

__all__ = ["FrontEndPlacement", "FrontEndSetup", "KeptListener", "link_token"]


def link_token(cluster_servers: Sequence[str]) -> str:
    """The token front ends present on each other's links: derived from the
    credentials in the NATS servers' URLs (those that may reach the cluster
    may link), or ``""`` when the URLs carry none (then any connection to a
    link address is taken: keep that port on a private network)."""
    secrets = sorted({url.split("://", 1)[-1].rpartition("@")[0] for url in cluster_servers} - {""})
    if not secrets:
        return ""
    return hmac.new(b"broker link", "\n".join(secrets).encode(), hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class FrontEndPlacement:
    """Who owns which topic, and where the owners' links are, as one
    membership of the front ends has it."""

    #: The members (``cluster.worker`` is this front end's id).
    cluster: Cluster
    #: Per member id: its link address, ``host:port``.
    link_paths: Mapping[str, str]
    #: What a link presents in its Hello ("": nothing is checked).
    token: str = ""
    #: (Front ends hand no sockets over: a resume anywhere is claimed.)
    handover_paths: Mapping[str, str] = field(default_factory=dict)

    @property
    def worker(self) -> str:
        """This front end's id."""
        return self.cluster.worker

    def owns(self, topic: str) -> bool:
        """Whether this front end owns ``topic``."""
        return self.cluster.owns(topic)


@dataclass(frozen=True)
class FrontEndSetup:
    """What a front end among several serves with (one membership's
    worth): its placement and the listeners it keeps across memberships
    (the broker it serves with does not close them)."""

    placement: FrontEndPlacement
    #: Client listeners (the front end's public address).
    listeners: Sequence[trio.SocketListener]
    #: Where the other front ends' links connect.
    link_listeners: Sequence[trio.SocketListener]
    #: Asks the other front ends what their streams hold of a session.
    stored_counts: StoredCounts | None = None


class KeptListener(trio.abc.Listener[trio.SocketStream]):
    """A listener served by one broker after another: closing it (as
    ``trio.serve_listeners`` does when its broker stops) leaves the socket
    open, so connections wait in its backlog for the next broker."""

    def __init__(self, listener: trio.SocketListener) -> None:
        self.listener = listener

    async def accept(self) -> trio.SocketStream:
        return await self.listener.accept()

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()
