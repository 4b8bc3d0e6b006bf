"""The actor system: a trio nursery of actors, with its own accounts."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import trio

from accounts import Account, unlimited
from actors._actor import Actor, ActorState, ActorT
from actors._errors import ActorFailed, NotSpawnedError


@dataclass(frozen=True, slots=True)
class SystemStatistics:
    """A snapshot of an actor system.

    Attributes:
        actors: actors spawned and not yet stopped.
        spawned_total: actors spawned since the system opened.
        dead_letters: events sent to actors that had already stopped (each
            repaid at once, unhandled).
    """

    actors: int
    spawned_total: int
    dead_letters: int


class ActorSystem:
    """A set of actors living in one trio nursery. Made by :func:`open_system`.

    Attributes:
        account: pays for the system's own signals (exit notices); never blocks.
        timers: the parent of every timer's account; never blocks.
    """

    def __init__(self, nursery: trio.Nursery, name: str) -> None:
        self.name = name
        self._nursery = nursery
        self._actors: dict[Actor, None] = {}
        self._spawned = 0
        self._dead_letters = 0
        self._serial = itertools.count(1)
        self._closing = False
        self.account: Account = unlimited(f"{name}/system", kind="system")
        self.timers: Account = unlimited(f"{name}/timers", kind="timers")

    def spawn(
        self, actor: ActorT, *, name: str | None = None, supervisor: Actor | None = None
    ) -> ActorT:
        """Start ``actor`` in this system and return it.

        Events can be sent to it at once; its task starts at the next
        scheduling point. ``supervisor``, if given, is told when the actor
        stops and takes its failures (see :meth:`Actor.actor_exited`).
        Without one, a failure propagates out of :func:`open_system`.
        """
        if supervisor is not None and supervisor._state is not ActorState.RUNNING:
            raise NotSpawnedError(f"supervisor {supervisor!r} is not running")
        if name is None:
            name = f"{type(actor).__name__}-{next(self._serial)}"
        actor._attach(self, name, supervisor)
        if supervisor is not None:
            supervisor._children[actor] = None
        self._actors[actor] = None
        self._spawned += 1
        self._nursery.start_soon(actor._run, name=f"actor:{name}")
        if self._closing:
            actor.stop()  # spawned during shutdown: it must not keep the system open
        return actor

    def actors(self) -> list[Actor]:
        """The actors spawned and not yet stopped, oldest first."""
        return list(self._actors)

    def stop_all(self) -> None:
        """Ask every actor to stop after its current turn. Actors spawned
        after this call stop as soon as they start."""
        self._closing = True
        for actor in list(self._actors):
            actor.stop()

    def statistics(self) -> SystemStatistics:
        """A snapshot of the system (see :class:`SystemStatistics`)."""
        return SystemStatistics(
            actors=len(self._actors),
            spawned_total=self._spawned,
            dead_letters=self._dead_letters,
        )

    def _forget(self, actor: Actor) -> None:
        self._actors.pop(actor, None)

    def _unhandled(self, actor: Actor, error: BaseException) -> None:
        """A failure nobody supervises: raise it out of the system's nursery."""

        async def fail() -> None:
            raise ActorFailed(actor.name) from error

        self._nursery.start_soon(fail, name=f"failure of {actor.name}")

    def _close(self) -> None:
        self.account.close()
        self.timers.close()


@asynccontextmanager
async def open_system(name: str = "actors") -> AsyncIterator[ActorSystem]:
    """Open an actor system for the duration of the ``async with`` block.

    Leaving the block stops every actor (each finishes its current turn and
    repays its mailbox unhandled) and waits for them. A failure that no
    supervisor takes cancels the system and is raised from here, wrapped in
    :class:`ActorFailed` inside an exception group, as trio nurseries do.
    """
    async with trio.open_nursery() as nursery:
        system = ActorSystem(nursery, name)
        try:
            yield system
        finally:
            system.stop_all()
    system._close()
