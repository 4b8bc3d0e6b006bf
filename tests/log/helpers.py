"""Helpers of the topic-log tests."""

from __future__ import annotations

import struct
from pathlib import Path

from broker.log import LogConfig, Reader, TopicLog

#: A receive time (ms since the epoch) to start from.
T0 = 1_700_000_000_000


def body(offset: int, size: int = 10) -> bytes:
    """A record body that says which offset it should be at."""
    text = b"r%d:" % offset
    return (text * (size // len(text) + 1))[:size] if size >= len(text) else text


def open_log(path: Path, **config: object) -> TopicLog:
    """A log of topic ``t`` in ``path`` (small terms unless told)."""
    settings: dict[str, object] = {"term_bytes": 512}
    settings.update(config)
    return TopicLog.open(path, "t", LogConfig(**settings))  # type: ignore[arg-type]


def read_all(reader: Reader, max_records: int = 1000) -> list[tuple[int, bytes]]:
    """Every record from the reader's position on, advancing it."""
    out: list[tuple[int, bytes]] = []
    while True:
        run = reader.read(max_records)
        if not run.tails:
            return out
        out.extend((run.first_offset + i, bytes(tail)) for i, tail in enumerate(run.tails))
        reader.advance_to(run.next_offset)


def records_of(term: Path) -> list[tuple[int, int, int]]:
    """(offset, start, end) of every record of an undamaged term file."""
    raw = term.read_bytes()
    found = []
    pos = 0
    while pos < len(raw):
        size, offset = struct.unpack_from("<IQ", raw, pos + 4)
        found.append((offset, pos, pos + 24 + size))
        pos += 24 + size
    return found
