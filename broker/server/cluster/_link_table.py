"""A worker's links to the other workers, by owner: which topics are
forwarded, and to whom (see ``_link`` and ``_forward``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import trio

from broker.protocol import Cluster

from ..topics._topic import Topic
from ._forward import ForwardTopic
from ._link import Link, LinkHost, LinkStatistics

__all__ = ["LinkPlacement", "Links"]


class LinkPlacement(Protocol):
    """Who owns what and where the owners' links are (a worker's
    ``WorkerSetup``, a front end's ``FrontEndPlacement``)."""

    @property
    def cluster(self) -> Cluster: ...

    @property
    def worker(self) -> str: ...

    @property
    def link_paths(self) -> Mapping[str, str]: ...

    def owns(self, topic: str) -> bool: ...


class Links:
    """The links of worker (or front end) ``setup.worker``: one per other
    it forwards to, opened (its task started in :attr:`nursery`) on first need."""

    def __init__(self, host: LinkHost, setup: LinkPlacement, token: str | None = None) -> None:
        self.host = host
        self.setup = setup
        #: What each link's Hello presents (a front end's link token).
        self.token = token
        self.links: dict[str, Link] = {}
        #: Where the links' tasks run (the broker's nursery, once serving).
        self.nursery: trio.Nursery | None = None

    def stand_in(self, name: str, registry: dict[str, Topic]) -> ForwardTopic | None:
        """A forwarding stand-in for topic ``name`` if another worker owns it
        (None: this one does)."""
        if self.setup.owns(name):
            return None
        return ForwardTopic(name, registry, self.link(self.setup.cluster.owner(name).id))

    def link(self, owner: str) -> Link:
        """The link to worker ``owner``, opened on first need."""
        link = self.links.get(owner)
        if link is None:
            assert self.nursery is not None
            path = self.setup.link_paths[owner]
            link = self.links[owner] = Link(
                self.host, f"link:{self.setup.worker}->{owner}", owner, path, self.token
            )
            self.nursery.start_soon(link.run)
        return link

    def not_owned(self, topic: str) -> str | None:
        """Why ``topic`` is not served here without forwarding (None: it is
        owned here): the one line that tells a client where to go."""
        if self.setup.owns(topic):
            return None
        owner = self.setup.cluster.owner(topic)
        return (
            f"topic {topic[:64]!r} is owned by worker {owner.id}: connect with metadata "
            f"or to its direct address {owner.address}"
        )

    def awaits_owners(self) -> bool:
        """Whether an owner may still send what a shutdown here waits for
        (see :attr:`Link.awaits_owner`)."""
        return any(link.awaits_owner for link in self.links.values())

    def close(self) -> None:
        """The broker stops: every link lets go of what it holds (unconfirmed)."""
        for link in self.links.values():
            link.close()

    def statistics(self) -> tuple[LinkStatistics, ...]:
        """Each open link's figures, by owner id."""
        return tuple(self.links[owner].statistics() for owner in sorted(self.links))
