"""A TCP forwarder that tests cut at chosen moments, as a network failure would."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import trio


class CuttableProxy:
    """A TCP forwarder to ``target``; :meth:`cut` breaks every connection through it."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.address: tuple[str, int] = ("", 0)
        self.cuts = 0
        self.connections = 0
        self._scopes: set[trio.CancelScope] = set()
        self._flowing = trio.Event()
        self._flowing.set()

    @property
    def url(self) -> str:
        host, port = self.address
        return f"{host}:{port}"

    async def serve(self, *, task_status: trio.TaskStatus[None]) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.address = listeners[0].socket.getsockname()[:2]
        await trio.serve_listeners(self._forward, listeners, task_status=task_status)

    async def _forward(self, client: trio.SocketStream) -> None:
        sock = trio.socket.socket()
        try:
            await sock.connect(self.target)
        except OSError:  # refused: nothing to forward
            sock.close()
            client.socket.close()
            return
        except BaseException:
            sock.close()
            client.socket.close()
            raise
        upstream = trio.SocketStream(sock)
        self.connections += 1
        try:
            with trio.CancelScope() as scope:
                self._scopes.add(scope)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._pump, client, upstream, nursery.cancel_scope)
                    nursery.start_soon(self._pump, upstream, client, nursery.cancel_scope)
        finally:
            self._scopes.discard(scope)
            sock.close()  # (synchronous: nothing can interrupt it)
            client.socket.close()

    async def _pump(
        self, source: trio.SocketStream, sink: trio.SocketStream, done: trio.CancelScope
    ) -> None:
        try:
            while data := await source.receive_some(65536):
                await self._flowing.wait()
                await sink.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        done.cancel()

    def freeze(self) -> None:
        """Hold what arrives from now on, both ways (a peer gone silent)."""
        if self._flowing.is_set():
            self._flowing = trio.Event()

    def thaw(self) -> None:
        """Pass on what was held, and what comes next."""
        self._flowing.set()

    def cut(self) -> None:
        """Break every connection now: what is in flight is lost."""
        self.cuts += 1
        for scope in list(self._scopes):
            scope.cancel()


@asynccontextmanager
async def proxied(target: tuple[str, int]) -> AsyncIterator[CuttableProxy]:
    async with trio.open_nursery() as nursery:
        proxy = CuttableProxy(target)
        await nursery.start(proxy.serve)
        yield proxy
        nursery.cancel_scope.cancel()


async def cut_on_progress(
    proxy: CuttableProxy,
    progress: Callable[[], int],
    done: Callable[[], bool],
    *,
    step: int,
    pause: Callable[[], float] = lambda: 0.0,
) -> None:
    """Cut ``proxy`` again and again until ``done()``, each time once
    ``progress()`` (messages received, say) has grown by ``step`` since the
    last cut and then ``pause()`` seconds have passed.

    Cutting by progress rather than on a timer keeps the test about
    behaviour: on a slow or loaded machine the clients still make headway
    between cuts instead of being cut during every reconnection (a livelock
    that only a fast machine escapes)."""
    while not done():
        mark = progress()
        while True:  # (polled: the progress is counted by other threads too)
            if progress() >= mark + step or done():
                break
            await trio.sleep(0.002)
        if done():
            return
        await trio.sleep(pause())
        if done():
            return
        proxy.cut()
