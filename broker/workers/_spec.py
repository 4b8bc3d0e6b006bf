"""What a supervisor tells a worker process: its id, the membership, its
configuration and which inherited file descriptors are its sockets.

It travels as JSON in the environment variable :data:`SPEC_VARIABLE`; the
worker answers on the inherited ``ready_fd`` with one JSON line once it
listens (its pid and its private metrics address).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from broker.config import BrokerConfig, TopicRule
from broker.protocol import Cluster, Member

__all__ = ["SPEC_VARIABLE", "WorkerSpec", "config_from_json", "config_to_json"]

#: The environment variable that carries a worker's :class:`WorkerSpec`.
SPEC_VARIABLE = "BROKER_WORKER_SPEC"


def config_to_json(config: BrokerConfig) -> dict[str, Any]:
    """``config`` as JSON-ready data (:func:`config_from_json` reverses it)."""
    return dataclasses.asdict(config)


def config_from_json(data: dict[str, Any]) -> BrokerConfig:
    """The configuration :func:`config_to_json` wrote."""
    values = dict(data)
    values["topics"] = tuple(TopicRule(**rule) for rule in values.get("topics", ()))
    return BrokerConfig(**values)


@dataclass(frozen=True)
class WorkerSpec:
    """One worker process's instructions."""

    #: This worker's id (``w0``, ``w1``, ...).
    worker: str
    epoch: int
    #: Every worker: id and direct (client) address.
    members: tuple[Member, ...]
    #: Per worker id: its forwarding (link) listener's Unix socket path.
    link_paths: dict[str, str]
    #: Per worker id: its handover (Unix datagram) socket's path.
    handover_paths: dict[str, str]
    #: Inherited descriptors: the public listener, the direct listener, the
    #: link listener, the handover socket.
    public_fd: int
    direct_fd: int
    link_fd: int
    handover_fd: int
    #: Where the worker writes its ready line.
    ready_fd: int
    #: The read end of the supervisor's life pipe: it reads as closed once
    #: the supervisor is gone (the worker then ends).
    life_fd: int
    #: The worker's configuration (its share of the global budget applied).
    config: BrokerConfig
    #: The logging level of the worker's log lines (the supervisor's).
    log_level: str = "INFO"
    #: The file of every worker's per-principal connection counts (with auth).
    connection_counts: str | None = None

    @property
    def cluster(self) -> Cluster:
        """The membership as this worker's Welcome carries it."""
        return Cluster(self.epoch, self.worker, self.members)

    def to_json(self) -> str:
        return json.dumps(
            {
                "worker": self.worker,
                "epoch": self.epoch,
                "members": [[m.id, m.host, m.port] for m in self.members],
                "link_paths": self.link_paths,
                "public_fd": self.public_fd,
                "direct_fd": self.direct_fd,
                "link_fd": self.link_fd,
                "handover_paths": self.handover_paths,
                "handover_fd": self.handover_fd,
                "ready_fd": self.ready_fd,
                "life_fd": self.life_fd,
                "config": config_to_json(self.config),
                "log_level": self.log_level,
                "connection_counts": self.connection_counts,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> WorkerSpec:
        data = json.loads(text)
        return cls(
            worker=data["worker"],
            epoch=data["epoch"],
            members=tuple(Member(i, h, p) for i, h, p in data["members"]),
            link_paths=dict(data["link_paths"]),
            public_fd=data["public_fd"],
            direct_fd=data["direct_fd"],
            link_fd=data["link_fd"],
            handover_paths=dict(data["handover_paths"]),
            handover_fd=data["handover_fd"],
            ready_fd=data["ready_fd"],
            life_fd=data["life_fd"],
            config=config_from_json(data["config"]),
            log_level=data.get("log_level", "INFO"),
            connection_counts=data.get("connection_counts"),
        )
