"""The yardstick every suite reports beside its figures."""

from __future__ import annotations

import time


def python_loop_10m_s() -> float:
    """Seconds this machine's CPython takes for a fixed loop of ten million
    additions: a yardstick for comparing figures measured on different
    machines (or on one machine under different load)."""
    start = time.perf_counter()
    total = 0
    for i in range(10_000_000):
        total += i
    return time.perf_counter() - start
