"""Which worker of a multi-worker broker owns a topic, and the membership a
``Welcome`` carries to clients that ask for it.

A broker started with ``--workers N`` is N processes; each topic belongs to
exactly one of them, chosen by rendezvous (highest-random-weight) hashing of
the topic name over the workers' ids:

- every party with the same *set* of member ids picks the same owner (the
  order of the list does not matter), so the broker's workers and the
  clients that read the membership from a ``Welcome`` agree without asking;
- changing the set moves only the topics that the added or removed worker
  gains or loses (about 1/N of them).

Sans-IO: nothing here does I/O or knows the time.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

from ._errors import ProtocolError

__all__ = ["Cluster", "Member", "owner_id"]


def _weight(member: str, topic: str) -> bytes:
    return hashlib.blake2b(f"{member}\0{topic}".encode(), digest_size=8).digest()


def owner_id(topic: str, members: Iterable[str]) -> str:
    """The id among ``members`` that owns ``topic`` (rendezvous hashing)."""
    best: str | None = None
    best_weight = b""
    for member in members:
        weight = _weight(member, topic)
        if best is None or weight > best_weight or (weight == best_weight and member > best):
            best, best_weight = member, weight
    if best is None:
        raise ValueError("no members to own a topic")
    return best


@dataclass(frozen=True, slots=True)
class Member:
    """One worker: its id and the address a client reaches it at directly."""

    id: str
    host: str
    port: int

    @property
    def address(self) -> str:
        """``host:port`` (an IPv6 host in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


@dataclass(frozen=True, slots=True)
class Cluster:
    """The membership of a multi-worker broker, as a ``Welcome`` carries it
    to a client whose ``Hello`` asked for ``metadata``.

    ``epoch`` changes whenever the membership may have changed (the broker
    was restarted with another worker count): a client that sees a new epoch
    computes every topic's owner again. ``worker`` is the id of the worker
    that wrote the Welcome.
    """

    epoch: int
    worker: str
    members: tuple[Member, ...]

    def owner(self, topic: str) -> Member:
        """The member that owns ``topic``."""
        wanted = owner_id(topic, (member.id for member in self.members))
        for member in self.members:
            if member.id == wanted:
                return member
        raise AssertionError("owner_id returned a member that is not listed")  # pragma: no cover

    @property
    def index(self) -> int:
        """The place of ``worker`` (the member this describes) in ``members``."""
        return [member.id for member in self.members].index(self.worker)

    def owns(self, topic: str) -> bool:
        """Whether ``worker`` (the member this describes) owns ``topic``."""
        return owner_id(topic, (member.id for member in self.members)) == self.worker

    def to_wire(self) -> dict[str, object]:
        """The CBOR-ready map of a Welcome's ``cluster`` field."""
        return {
            "epoch": self.epoch,
            "worker": self.worker,
            "members": [[m.id, m.host, m.port] for m in self.members],
        }

    @classmethod
    def from_wire(cls, value: object) -> Cluster:
        """Parse a Welcome's ``cluster`` field; :class:`ProtocolError` if malformed."""
        if type(value) is not dict or value.keys() != {"epoch", "worker", "members"}:
            raise ProtocolError("cluster must be a map of epoch, worker and members")
        epoch, worker, members = value["epoch"], value["worker"], value["members"]
        if type(epoch) is not int or epoch < 0 or type(worker) is not str:
            raise ProtocolError("cluster epoch must be an unsigned integer, worker a text string")
        if type(members) is not list or not members:
            raise ProtocolError("cluster members must be a non-empty array")
        parsed: list[Member] = []
        for item in members:
            if (
                type(item) is not list
                or len(item) != 3
                or type(item[0]) is not str
                or type(item[1]) is not str
                or type(item[2]) is not int
                or not 0 < item[2] < 65536
            ):
                raise ProtocolError("a cluster member must be [id, host, port]")
            parsed.append(Member(item[0], item[1], item[2]))
        ids = [m.id for m in parsed]
        if len(set(ids)) != len(ids) or worker not in ids:
            raise ProtocolError("cluster member ids must be unique and include the worker")
        return cls(epoch, worker, tuple(parsed))
