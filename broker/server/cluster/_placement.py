"""What a broker that is one worker of several is given by its supervisor.

A single-process broker has no :class:`WorkerSetup`. A worker gets one: the
membership (who owns which topic), the listening sockets the supervisor made
(so that a restarted worker listens on the very same sockets and no
connection waiting in their backlogs is lost) and where the other workers
take forwarded traffic.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from broker.protocol import Cluster

__all__ = ["WorkerSetup"]


@dataclass(frozen=True)
class WorkerSetup:
    """A worker's place among the broker's workers."""

    #: The membership; ``cluster.worker`` is this worker's id.
    cluster: Cluster
    #: Client listeners (TCP), already bound and listening: the public
    #: address (``SO_REUSEPORT``, shared with every worker) and this
    #: worker's direct address (its member entry). The first is the public one.
    client_sockets: Sequence[socket.socket]
    #: This worker's forwarding listener (a listening Unix socket): the other
    #: workers connect to it as clients to reach the topics this one owns.
    link_socket: socket.socket | None = None
    #: Per member id: the path of that worker's forwarding listener.
    link_paths: Mapping[str, str] = field(default_factory=dict)
    #: This worker's handover socket (a bound Unix datagram socket): other
    #: workers send it the connections that resume its sessions.
    handover_socket: socket.socket | None = None
    #: Per member id: the path of that worker's handover socket.
    handover_paths: Mapping[str, str] = field(default_factory=dict)
    #: The file of every worker's per-principal connection counts (see
    #: ``_shared_counts``; None: each worker counts only its own).
    connection_counts: str | None = None

    @property
    def worker(self) -> str:
        """This worker's id."""
        return self.cluster.worker

    def owns(self, topic: str) -> bool:
        """Whether this worker owns ``topic``."""
        return self.cluster.owns(topic)
