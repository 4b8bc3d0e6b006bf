"""A stream whose first bytes were read already, to be read again.

Cluster mode reads a TLS client's Hello (after the handshake) to claim the
session it resumes before the connection starts; the connection then reads
the same bytes from a :class:`ReplayedStream` as if nothing had been read.
"""

from __future__ import annotations

import trio

__all__ = ["ReplayedStream"]


class ReplayedStream(trio.abc.Stream):
    """``stream``, whose reads give ``first`` before anything it sends next."""

    def __init__(self, stream: trio.abc.Stream, first: bytes) -> None:
        self.stream = stream
        self._first = first

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._first:
            await trio.lowlevel.checkpoint()
            size = len(self._first) if max_bytes is None else max_bytes
            data, self._first = self._first[:size], self._first[size:]
            return data
        return bytes(await self.stream.receive_some(max_bytes))

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.stream.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self.stream.aclose()
