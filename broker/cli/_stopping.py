"""How ``broker serve`` stops on a signal: gracefully on the first one, at
once on a second one meanwhile (Ctrl-C twice), as users of servers expect."""

from __future__ import annotations

import logging
import signal
from collections.abc import AsyncIterator, Awaitable, Callable

import trio

log = logging.getLogger("broker")


async def stop_on_signals(
    signals: AsyncIterator[int], shutdown: Callable[[], Awaitable[None]], deadline: float
) -> None:
    """Wait for a signal, then run ``shutdown()`` (a graceful shutdown within
    about ``deadline`` seconds); a second signal meanwhile cuts it short
    (what is still draining is cut, as at the deadline)."""
    async for signum in signals:
        name = signal.Signals(signum).name
        log.info(
            "%s: shutting down gracefully (within %g s; %s again to stop at once)",
            name,
            deadline,
            name,
        )
        break
    async with trio.open_nursery() as nursery:

        async def cut() -> None:
            async for again in signals:
                log.warning("%s again: stopping at once", signal.Signals(again).name)
                nursery.cancel_scope.cancel()
                return

        nursery.start_soon(cut)
        await shutdown()
        nursery.cancel_scope.cancel()
