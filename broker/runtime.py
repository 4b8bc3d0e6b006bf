"""Process-wide tuning for processes that move many messages."""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import resource
import signal
from collections.abc import Awaitable, Callable

#: The signals that shut a broker (or its supervisor, or a worker) down
#: gracefully. SIGHUP too: a closed terminal, or an operator expecting a
#: reload (not supported: settings change with a restart), used to kill the
#: broker at once, with no drain and no line in the log.
SHUTDOWN_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def tune_gc(threshold: int) -> None:
    """Run a young garbage collection every ``threshold`` new container
    objects instead of Python's 700, and leave every object that exists now
    out of all later collections (``gc.freeze``). 0 changes nothing.

    A message through the broker or a client makes a few short-lived objects
    and almost never a reference cycle: at Python's default, collections
    that find nothing cost a tenth to a quarter of the CPU. Cyclic garbage
    is still collected, later: so what is made per connection must leave
    no reference cycle when it closes (see ``tests/server/test_churn.py``),
    or connection churn piles up memory until an old-generation collection.
    ``broker serve`` applies ``gc_threshold``; a high-rate client process may
    call this itself (a library never does).
    """
    if threshold < 0:
        raise ValueError("threshold must be >= 0")
    if threshold:
        gc.collect()
        gc.freeze()
        _, older, oldest = gc.get_threshold()
        gc.set_threshold(threshold, older, oldest)


def _load_malloc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim: Callable[[int], int] = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to call
        return None
    return trim


_malloc_trim = _load_malloc_trim()


def release_free_memory() -> bool:
    """Hand the memory the C allocator holds free back to the operating
    system (glibc's ``malloc_trim``); False where there is no such call.

    Payloads above 512 bytes live in glibc's heap, which keeps freed pages
    for reuse: after a burst (a large staged batch committed, a backlog
    drained) the process's RSS would otherwise stay at its peak. The call
    walks the heap, so run it in a worker thread (it releases the GIL)."""
    if _malloc_trim is None:
        return False
    _malloc_trim(0)
    return True


def raise_open_file_limit() -> int:
    """Raise this process's soft limit of open files to its hard limit and
    return the limit now in force. A broker with a data directory keeps a
    file open per topic log (and one per connection): the common soft limit
    of 1,024 would cap it at a few hundred topics."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            return soft
        return hard
    return soft


def sole_failure(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The one exception inside ``group`` and any groups of one it nests (a
    failure in a nursery of a nursery), else ``group`` itself."""
    failure: BaseException = group
    while isinstance(failure, BaseExceptionGroup) and len(failure.exceptions) == 1:
        failure = failure.exceptions[0]
    return failure


def run_unwrapped(async_fn: Callable[..., Awaitable[object]], *args: object) -> None:
    """``trio.run(async_fn, *args)``, raising a failure that nurseries
    wrapped in groups of one as itself (so that callers catch the one
    error they know how to report in a line)."""
    import trio

    try:
        trio.run(async_fn, *args)
    except BaseExceptionGroup as group:
        failure = sole_failure(group)
        if failure is group:
            raise
        raise failure from None
