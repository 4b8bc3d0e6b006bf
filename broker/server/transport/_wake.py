"""The writer's wake-up call, shared by the parts of a connection that queue
output, and the :class:`Outbox` that lets the task that queued output write
it itself.

Without an outbox, :meth:`Wake.set` wakes the connection's writer task,
which sends what was queued. While a task handles a read (an :class:`Outbox`
is open), the wakes it causes, on its own connection and on others (a
publish delivered to subscribers, a Confirm to its publisher), are noted
instead; when the read is handled, each is *flushed*: the connection writes
what it has at once, from this task, if its writer is idle (one ``send``
instead of a task switch and a ``send``), and wakes its writer otherwise.
All the output a read causes goes out together, coalesced per connection.
A read whose frames take several turns (``FRAMES_PER_TURN``) closes the
outbox without flushing between them: the next step's end flushes, its own
next turn's or another task's, so that others' output never waits for it.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

__all__ = ["Outbox", "Wake"]


class Outbox:
    """Wakes noted while a task handles one read, flushed when it is done.

    :meth:`open` and :meth:`close` pair up (they may nest: only the outermost
    :meth:`close` flushes)."""

    __slots__ = ("_depth", "_noted")

    def __init__(self) -> None:
        self._depth = 0
        self._noted: dict[Wake, None] = {}

    @property
    def is_open(self) -> bool:
        return self._depth > 0

    def open(self) -> None:
        self._depth += 1

    def close(self, *, flush: bool = True) -> None:
        """End a step; the outermost one flushes every noted wake, in the
        order they were first noted. With ``flush`` False they wait for the
        end of the next step (this task's or another's) or :meth:`flush`."""
        self._depth -= 1
        if flush:
            self.flush()

    def flush(self) -> None:
        """Flush the noted wakes now, if no step is under way."""
        if not self._depth and self._noted:
            noted = self._noted
            self._noted = {}
            for wake in noted:
                wake.flush()

    def note(self, wake: Wake) -> None:
        self._noted[wake] = None


class Wake:
    """Wakes a connection's writer: :meth:`set` any number of times; :meth:`wait`
    returns once it was set since the last :meth:`wait` returned.

    With an :class:`Outbox` open, :meth:`set` only notes the wake there;
    :meth:`flush` then tries :attr:`write_now` first (see the module)."""

    __slots__ = ("_event", "_failure", "_outbox", "write_now")

    def __init__(self, outbox: Outbox | None = None) -> None:
        self._event = trio.Event()
        self._outbox = outbox
        #: Writes what is queued at once, from the calling task; False if it
        #: could not (the writer is busy, the stream is not a plain socket,
        #: the connection is closing): the writer is woken then.
        self.write_now: Callable[[], bool] | None = None
        #: What :attr:`write_now` raised in another connection's task: raised
        #: by :meth:`wait`, in this connection's writer, as if it had failed there.
        self._failure: Exception | None = None

    def set(self) -> None:
        """Something was queued to send: the writer goes round once more
        (or, with an outbox open, it is written when the read is handled)."""
        outbox = self._outbox
        if outbox is not None and outbox._depth:
            outbox._noted[self] = None
        else:
            self._event.set()

    def flush(self) -> None:
        """Write what is queued now if the connection can, else wake the
        writer. A failure of the write is this connection's, not the calling
        task's: it is handed to the writer (see :meth:`wait`)."""
        write_now = self.write_now
        try:
            if write_now is not None and write_now():
                return
        except Exception as failure:
            self._failure = failure
        self._event.set()

    async def wait(self) -> None:
        """Wait until :meth:`set` (at once if it was set meanwhile), and re-arm;
        raises what a write from another task failed with, if one did."""
        await self._event.wait()
        self._event = trio.Event()
        failure = self._failure
        if failure is not None:
            self._failure = None
            raise failure
