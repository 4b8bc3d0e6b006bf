"""An in-memory seam for the broker's tests: no sockets, no kernel.

:class:`MemoryListener` is a trio listener whose connections are
``trio.testing.memory_stream_pair`` streams (unbounded buffers, like a
socket that never fills up; closing one end is an EOF at the other, a write
to a closed end a ``BrokenResourceError``). ``serve_broker(config,
listeners=[listener])`` serves it; the broker's peers are then named
``memory:1``, ``memory:2``, ... and it serves them through the streams' own
methods (the raw socket I/O is for TCP connections only).

Tests under ``MockClock(autojump_threshold=0)`` run over memory streams:
with nothing in the kernel, the clock jumps only when every task waits
for a timer, never while bytes are on their way (trio's documentation
warns against the autojump clock with real I/O).
"""

from __future__ import annotations

import math
from contextlib import suppress

import trio
import trio.testing

__all__ = ["MemoryListener"]


class MemoryListener(trio.abc.Listener[trio.abc.HalfCloseableStream]):
    """Accepts the connections :meth:`connect` makes."""

    def __init__(self) -> None:
        self._send, self._receive = trio.open_memory_channel[trio.abc.HalfCloseableStream](math.inf)
        self.connections = 0

    async def connect(self) -> trio.abc.HalfCloseableStream:
        """A new connection to whoever accepts on this listener: the client's
        end (the other end waits for :meth:`accept`). ``ConnectionRefusedError``
        once the listener is closed, as a TCP port nobody listens on."""
        client, server = trio.testing.memory_stream_pair()
        try:
            self._send.send_nowait(server)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            raise ConnectionRefusedError("the memory listener is closed") from None
        self.connections += 1
        await trio.lowlevel.checkpoint()
        return client

    async def accept(self) -> trio.abc.HalfCloseableStream:
        try:
            return await self._receive.receive()
        except trio.EndOfChannel:
            raise trio.ClosedResourceError("the memory listener is closed") from None

    async def aclose(self) -> None:
        """Stop accepting; connections not accepted yet are closed (their
        clients read EOF)."""
        self._send.close()
        waiting: list[trio.abc.HalfCloseableStream] = []
        with suppress(trio.EndOfChannel, trio.ClosedResourceError, trio.WouldBlock):
            while True:
                waiting.append(self._receive.receive_nowait())
        self._receive.close()
        for stream in waiting:
            await trio.aclose_forcefully(stream)
        await trio.lowlevel.checkpoint()
