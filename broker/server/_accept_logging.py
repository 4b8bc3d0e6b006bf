"""What trio's ``serve_listeners`` says when ``accept`` fails for want of
resources (no file descriptor left, no memory), said once in a while.

trio logs each failed ``accept`` with its traceback and retries every
100 ms: with no descriptor left, that is ten tracebacks a second for as
long as a client waits. :func:`quiet_accept_errors` installs a filter on
its logger that lets one line through per ``EVERY`` seconds, without the
traceback, saying what to do and how many it held back.
"""

from __future__ import annotations

import errno
import logging
import time

__all__ = ["EVERY", "AcceptErrorFilter", "quiet_accept_errors"]

#: The logger trio's ``serve_listeners`` complains on.
LOGGER = "trio.serve_listeners"
#: At most one line per this many seconds.
EVERY = 10.0


class AcceptErrorFilter(logging.Filter):
    """Passes one failed-accept record per :data:`EVERY` seconds, rewritten
    as one line; drops the rest (counted in the next line)."""

    def __init__(self) -> None:
        super().__init__()
        self._next = 0.0
        self._held = 0

    def filter(self, record: logging.LogRecord) -> bool:
        now = time.monotonic()
        if now < self._next:
            self._held += 1
            return False
        self._next = now + EVERY
        held, self._held = self._held, 0
        record.msg = "cannot accept a connection: %s; retrying every 0.1 s%s"
        record.args = (
            _cause(record),
            f" ({held} more since the last line)" if held else "",
        )
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        record.exc_info = record.exc_text = None
        return True


def _cause(record: logging.LogRecord) -> str:
    error = record.exc_info[1] if record.exc_info else None
    if isinstance(error, OSError) and error.errno in (errno.EMFILE, errno.ENFILE):
        return f"{error.strerror} (raise the open-file limit: LimitNOFILE, ulimit -n)"
    if isinstance(error, OSError):
        return str(error.strerror or error)
    return record.getMessage()


def quiet_accept_errors() -> None:
    """Install the filter on trio's logger (once per process)."""
    logger = logging.getLogger(LOGGER)
    if not any(isinstance(f, AcceptErrorFilter) for f in logger.filters):
        logger.addFilter(AcceptErrorFilter())
