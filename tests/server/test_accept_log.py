"""A broker out of file descriptors says so in one line per ten seconds, not
in a traceback ten times a second (trio's ``serve_listeners`` logs each
failed accept with its traceback and retries every 100 ms)."""

from __future__ import annotations

import errno
import logging
import sys

import pytest
import trio
import trio.testing

from broker.server._accept_logging import EVERY, AcceptErrorFilter, quiet_accept_errors


class NoFds(trio.abc.Listener[trio.SocketStream]):
    """A listener whose accept fails ``failures`` times with EMFILE, then waits."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.done = trio.Event()

    async def accept(self) -> trio.SocketStream:
        if self.failures:
            self.failures -= 1
            raise OSError(errno.EMFILE, "Too many open files")
        self.done.set()
        await trio.sleep_forever()
        raise AssertionError

    async def aclose(self) -> None:
        pass


async def test_failed_accepts_are_one_line_without_a_traceback(
    caplog: pytest.LogCaptureFixture, autojump_clock: trio.testing.MockClock
) -> None:
    quiet_accept_errors()
    quiet_accept_errors()  # once per process, however often called
    logger = logging.getLogger("trio.serve_listeners")
    assert sum(isinstance(f, AcceptErrorFilter) for f in logger.filters) == 1
    caplog.set_level(logging.INFO)
    async with trio.open_nursery() as nursery:
        listener = NoFds(failures=30)  # three seconds of retries (of the mock clock)
        await nursery.start(trio.serve_listeners, lambda stream: None, [listener])
        await listener.done.wait()
        nursery.cancel_scope.cancel()
    said = [r for r in caplog.records if r.name == "trio.serve_listeners"]
    assert len(said) == 1  # not thirty
    assert said[0].levelno == logging.WARNING and said[0].exc_info is None
    assert said[0].getMessage() == (
        "cannot accept a connection: Too many open files (raise the open-file limit: "
        "LimitNOFILE, ulimit -n); retrying every 0.1 s"
    )


def test_the_next_line_counts_what_was_held_back(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr("broker.server._accept_logging.time.monotonic", lambda: now[0])
    flt = AcceptErrorFilter()

    def record() -> logging.LogRecord:
        try:
            raise OSError(errno.ENFILE, "Too many open files in system")
        except OSError:
            return logging.LogRecord(
                "trio.serve_listeners", logging.ERROR, "", 0, "x", (), sys.exc_info()
            )

    assert flt.filter(record())
    assert [flt.filter(record()) for _ in range(5)] == [False] * 5
    now[0] += EVERY
    again = record()
    assert flt.filter(again)
    assert again.getMessage().endswith("retrying every 0.1 s (5 more since the last line)")
