"""What the supervisor knows of one worker process, as the merged endpoint reads it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """One worker as the supervisor sees it now.

    ``id`` is the ``worker`` label value (short and stable across restarts:
    bounded labels), ``pid`` its process id (None while not running), ``up``
    whether its process runs, ``restarts`` how many times it was started
    again, ``direct`` the ``host:port`` its clients may connect to directly,
    ``metrics`` the ``(host, port)`` of its private metrics endpoint.
    """

    id: str
    pid: int | None
    up: bool
    restarts: int
    direct: str
    metrics: tuple[str, int]
