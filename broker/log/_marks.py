"""What a topic directory remembers beside its terms, to tell what it lost.

- ``checkpoint``: the last offset the log confirmed as flushed (fsynced),
  written after each fsync (not itself fsynced: it may lag, never lead). A
  log that opens with fewer records than that lost the rest.
- ``gaps.json``: the ranges of offsets already found missing inside the
  log (damaged, or their term file gone), so that a later opening reports
  only new losses; readers get a ``Gap`` for them either way.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
from pathlib import Path
from zlib import crc32

__all__ = ["CHECKPOINT", "GAPS", "read_checkpoint", "read_gaps", "write_checkpoint", "write_gaps"]

CHECKPOINT = "checkpoint"
GAPS = "gaps.json"
#: magic, last offset flushed, crc32 of the 12 bytes before it.
_CHECKPOINT = struct.Struct("<4sQI")
_MAGIC = b"CKP1"


def read_checkpoint(directory: Path) -> int:
    """The last offset the log in ``directory`` confirmed as flushed (0:
    none known, or the file is torn)."""
    try:
        raw = (directory / CHECKPOINT).read_bytes()
    except OSError:
        return 0
    if len(raw) != _CHECKPOINT.size:
        return 0
    magic, offset, crc = _CHECKPOINT.unpack(raw)
    if magic != _MAGIC or crc32(raw[:12]) != crc:
        return 0
    return int(offset)


def write_checkpoint(directory: Path, offset: int) -> None:
    """Note that every offset up to ``offset`` is flushed: one small write
    in place, best effort, no fsync (the terms were fsynced before)."""
    head = struct.pack("<4sQ", _MAGIC, offset)
    raw = head + struct.pack("<I", crc32(head))
    with contextlib.suppress(OSError):
        fd = os.open(directory / CHECKPOINT, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            os.pwrite(fd, raw, 0)
        finally:
            os.close(fd)


def read_gaps(directory: Path) -> list[tuple[int, int]]:
    """The ranges ``(first offset, count)`` known missing (none if unreadable)."""
    with contextlib.suppress(OSError, ValueError, TypeError):
        found = json.loads((directory / GAPS).read_text(encoding="utf-8"))
        return [(int(first), int(count)) for first, count in found["gaps"]]
    return []


def write_gaps(directory: Path, gaps: list[tuple[int, int]]) -> None:
    """Remember ``gaps`` (atomically: a synced temporary file renamed over
    the old one); best effort: if it fails, the next opening reports them again."""
    path = directory / GAPS
    if not gaps:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return
    temporary = directory / (GAPS + ".tmp")
    with contextlib.suppress(OSError):
        with open(temporary, "w", encoding="utf-8") as file:
            json.dump({"gaps": [[first, count] for first, count in gaps]}, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
