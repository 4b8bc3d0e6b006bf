"""Throughput of the topic log: ``python -m broker.log._bench [records]``.

Appends records of 100 bytes (``flush="batch"``, written every 1000
records as a broker would at the end of each batch, fsynced at close),
reopens the log (sealed terms checked by a crc32 of the whole file, the
active one record by record), replays them from the earliest offset in runs
of 1024 (from the mapped term files; then, in another log, in the process
that wrote them),
then appends fewer records with ``flush="always"`` (an fsync per append).
Prints ``python_loop_10m_s`` beside, the time of an empty 10M-step loop in
this process, to read the numbers against the machine's speed.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from ._log import Reader
from ._store import LogStore
from ._types import LogConfig, Start

RECORD = 100
BATCH = 1000


def python_loop_10m_s() -> float:
    start = time.perf_counter()
    for _ in range(10_000_000):
        pass
    return time.perf_counter() - start


def _rate(label: str, count: int, seconds: float) -> None:
    mb = count * RECORD / 1e6
    print(
        f"{label:<38} {count:>9} records {seconds:7.3f} s  "
        f"{count / seconds:>12,.0f} records/s  {mb / seconds:8.1f} MB/s"
    )


def _append(directory: Path, config: LogConfig, count: int, per_call: int) -> float:
    body = bytes(range(RECORD))
    with LogStore(directory, config) as store:
        log = store.topic("bench")
        now = 1_700_000_000_000
        start = time.perf_counter()
        if per_call == 1:
            append = log.append
            for index in range(count):
                append(body, now)
                if index % BATCH == BATCH - 1:
                    log.flush_due(now)
        else:
            batch = [body] * per_call
            for _ in range(count // per_call):
                log.append_many(batch, now)
                log.flush_due(now)
        log.flush()
        return time.perf_counter() - start


def _read_all(reader: Reader) -> tuple[int, int, float]:
    """Read ``reader`` to the log's end: records, their bytes, seconds."""
    seen = size = 0
    start = time.perf_counter()
    while True:
        run = reader.read(1024)
        if not run.tails:
            break
        seen += len(run.tails)
        size += sum(map(len, run.tails))
        reader.advance_to(run.next_offset)
    return seen, size, time.perf_counter() - start


def _replay(directory: Path, count: int, label: str) -> None:
    start = time.perf_counter()
    with LogStore(directory) as store:
        log = store.topic("bench")
        _rate("reopen (check every term)", count, time.perf_counter() - start)
        assert log.recovery.clean
        seen, size, seconds = _read_all(log.reader(Start.earliest()))
        assert seen == count and size == count * RECORD, (seen, size)
        _rate(label, seen, seconds)


def main(argv: list[str]) -> None:
    count = int(argv[0]) if argv else 1_000_000
    always_count = max(1, count // 100)
    print(f"python_loop_10m_s {python_loop_10m_s():.3f}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "batch"
        config = LogConfig(flush="batch", flush_interval_ms=1000)
        _rate("append, batch, one by one", count, _append(directory, config, count, 1))
        _replay(directory, count, "replay from mapped files")
        directory = Path(tmp) / "batch-many"
        _rate("append_many(1000), batch", count, _append(directory, config, count, BATCH))
        directory = Path(tmp) / "memory"
        with LogStore(directory, config) as store:
            log = store.topic("bench")
            body = bytes(range(RECORD))
            for _ in range(count // BATCH):
                log.append_many([body] * BATCH, 0)
            seen, _, seconds = _read_all(log.reader())
            _rate("replay in the writing process", seen, seconds)
        directory = Path(tmp) / "always"
        config = LogConfig(flush="always")
        seconds = _append(directory, config, always_count, 1)
        _rate("append, always (fsync each)", always_count, seconds)
    print(f"python_loop_10m_s {python_loop_10m_s():.3f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
