"""Exceptions of the ``actors`` package."""

from __future__ import annotations


class ActorsError(Exception):
    """Base class of every error the ``actors`` package raises on purpose."""


class NotInTurnError(ActorsError):
    """A :class:`~actors.Turn` was used after its turn ended: there is no
    event whose account could pay for the send."""


class NotSpawnedError(ActorsError):
    """An actor was used before :meth:`~actors.ActorSystem.spawn` attached it
    to a system, or spawned twice."""


class ActorFailed(ActorsError):
    """A supervised actor failed and its supervisor did not handle it.

    The child's own exception is this exception's ``__cause__``.
    """

    def __init__(self, actor_name: str) -> None:
        super().__init__(f"actor {actor_name!r} failed")
        self.actor_name = actor_name
