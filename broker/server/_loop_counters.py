"""Counting what the event loop does (opt-in: ``loop_counters``): task steps
and the waits for I/O that may sleep, to tell per message how many wake-ups
the broker pays (``broker bench`` reads them at fixed rates)."""

from __future__ import annotations

import trio


class LoopCounters(trio.abc.Instrument):
    """A trio instrument: :attr:`task_steps` (every time a task runs until
    its next checkpoint: a task switch) and :attr:`io_waits` (times the loop
    asked the OS for I/O ready with a timeout, i.e. could go to sleep: an
    ``epoll_wait`` that may block). Each task step costs a Python call, which
    is why it is off unless asked for."""

    def __init__(self) -> None:
        self.task_steps = 0
        self.io_waits = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.task_steps += 1

    def before_io_wait(self, timeout: float) -> None:
        if timeout > 0:
            self.io_waits += 1
