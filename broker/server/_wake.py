"""The writer's wake-up call, shared by the parts of a connection that queue output."""

from __future__ import annotations

import trio


class Wake:
    """Wakes a connection's writer: :meth:`set` any number of times; :meth:`wait`
    returns once it was set since the last :meth:`wait` returned."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = trio.Event()

    def set(self) -> None:
        """Something was queued to send: the writer goes round once more."""
        self._event.set()

    async def wait(self) -> None:
        """Wait until :meth:`set` (at once if it was set meanwhile), and re-arm."""
        await self._event.wait()
        self._event = trio.Event()
