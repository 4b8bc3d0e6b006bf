"""What an open-loop sender shares, whatever protocol it speaks: the stamp
at the head of each payload (the *scheduled* send time and a sequence
number) and a timer precise to microseconds."""

from __future__ import annotations

import ctypes
import os
import struct
import time
from collections.abc import AsyncIterator
from typing import Any

import trio

STAMP = struct.Struct(">qQ")  # scheduled send time (ns), sequence number


def filler_for(size: int) -> bytes:
    """What follows the stamp in a payload of ``size`` bytes."""
    return b"x" * max(0, size - STAMP.size)


#: Waits shorter than this are spent yielding rather than on a timer.
_SHORT_WAIT_NS = 200_000


class PreciseTimer:
    """Sleep until a ``time.perf_counter_ns()`` deadline to within microseconds.

    trio's timers wake up to a millisecond late (epoll rounds its timeout up
    to whole milliseconds), which an open-loop latency benchmark would count
    against the broker. A Linux timerfd armed on ``CLOCK_MONOTONIC`` (the
    clock ``perf_counter`` reads on Linux) wakes the task on time, through
    trio's own I/O wait. Elsewhere it falls back to ``trio.sleep``.
    """

    _CLOCK_MONOTONIC = 1
    _TFD_NONBLOCK = 0o4000
    _TFD_TIMER_ABSTIME = 1

    class _Spec(ctypes.Structure):
        _fields_ = [
            ("interval_s", ctypes.c_long),
            ("interval_ns", ctypes.c_long),
            ("value_s", ctypes.c_long),
            ("value_ns", ctypes.c_long),
        ]

    def __init__(self) -> None:
        self._fd = -1
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            self._settime = libc.timerfd_settime
            fd = libc.timerfd_create(self._CLOCK_MONOTONIC, self._TFD_NONBLOCK)
        except (OSError, AttributeError):
            return
        same_clock = abs(time.perf_counter_ns() - time.clock_gettime_ns(time.CLOCK_MONOTONIC))
        if fd >= 0 and same_clock < 1_000_000:
            self._fd = fd

    async def sleep_until(self, deadline_ns: int) -> None:
        now = time.perf_counter_ns()
        if deadline_ns <= now:
            return  # behind schedule: send at once (publish() yields often enough)
        if deadline_ns - now < _SHORT_WAIT_NS:
            # Arming a timer costs more than a short wait at high rates: yield
            # until the deadline instead.
            while time.perf_counter_ns() < deadline_ns:
                await trio.lowlevel.checkpoint()
            return
        if self._fd < 0:
            await trio.sleep((deadline_ns - now) / 1e9)
            return
        spec = self._Spec(0, 0, deadline_ns // 1_000_000_000, deadline_ns % 1_000_000_000)
        if self._settime(self._fd, self._TFD_TIMER_ABSTIME, ctypes.byref(spec), None) != 0:
            await trio.sleep((deadline_ns - now) / 1e9)
            return
        await trio.lowlevel.wait_readable(self._fd)
        os.read(self._fd, 8)


async def schedule(rate: float, total: int, lateness: list[int]) -> AsyncIterator[tuple[int, int]]:
    """``total`` sends at ``rate`` a second, open loop: yields each one's
    sequence number and *scheduled* time (``perf_counter_ns``) once that time
    has come, whether or not the sends before it are done, and appends to
    ``lateness`` how late it was yielded (ns)."""
    interval = 1e9 / rate
    timer = PreciseTimer()
    t0 = time.perf_counter_ns()
    for n in range(total):
        scheduled = t0 + int(n * interval)
        await timer.sleep_until(scheduled)
        lateness.append(time.perf_counter_ns() - scheduled)
        yield n, scheduled


class Arrivals:
    """What an open-loop subscriber records of the messages it times: each
    one's latency (receive time minus scheduled send time), gaps in the
    sequence numbers, the first and last arrival; :meth:`result` is a
    worker's result in the shape the benchmarks read."""

    def __init__(self) -> None:
        self.latencies: list[int] = []
        self.received = self.gaps = self.expected = self.first = self.last = 0

    def arrived(self, payload: bytes, now: int) -> None:
        """A message with stamped ``payload`` arrived at ``now`` (ns)."""
        stamp, seq = STAMP.unpack_from(payload)
        if seq != self.expected:
            self.gaps += abs(seq - self.expected)
        self.expected = seq + 1
        self.received += 1
        self.latencies.append(now - stamp)
        self.first = self.first or now
        self.last = now

    def result(self) -> dict[str, Any]:
        one = {
            "received": self.received,
            "drained": 0,
            "first": self.first,
            "last": self.last,
            "gaps": self.gaps,
            "latencies": self.latencies,
        }
        return {"subscribers": [one]}


def published(
    start: int, done: int, topic: str, total: int, lateness: list[int], **extra: int
) -> dict[str, Any]:
    """An open-loop publisher's result: when it started and finished
    publishing ``total`` messages to ``topic``, how late it was, and
    ``extra`` figures (acknowledged, confirmed)."""
    return {
        "start": start,
        "published": done,
        "end": time.perf_counter_ns(),
        "sent": {topic: total},
        **extra,
        "lateness": {topic: lateness},
    }
