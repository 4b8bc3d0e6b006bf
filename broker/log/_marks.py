"""What a topic directory remembers beside its terms, to tell what it lost.

- ``checkpoint``: the last offset the log confirmed as flushed (fsynced),
  written after each fsync (not itself fsynced: it may lag, never lead). A
  log that opens with fewer records than that lost the rest.
- ``gaps.json``: the ranges of offsets already found missing inside the
  log (damaged, or their term file gone), so that a later opening reports
  only new losses; readers get a ``Gap`` for them either way.
- ``start``: the first offset kept after records were deleted from the
  start of the log (:meth:`TopicLog.purge_before`), when that is inside a
  term: the records of that term below it are gone. Written atomically and
  fsynced before any term file is removed for it.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
from pathlib import Path
from zlib import crc32

__all__ = [
    "CHECKPOINT",
    "CHECKPOINT_MAGIC",
    "GAPS",
    "START",
    "START_MAGIC",
    "decode_mark",
    "read_checkpoint",
    "read_gaps",
    "read_mark",
    "read_start",
    "write_checkpoint",
    "write_gaps",
    "write_start",
]

CHECKPOINT = "checkpoint"
GAPS = "gaps.json"
START = "start"
#: magic, offset, crc32 of the 12 bytes before it.
_MARK = struct.Struct("<4sQI")
#: The magic numbers of the checkpoint and the start mark.
CHECKPOINT_MAGIC = _MAGIC = b"CKP1"
START_MAGIC = _START_MAGIC = b"STA1"


def decode_mark(raw: bytes, magic: bytes) -> int:
    """The offset of a mark file's bytes ``raw`` (0: not a whole mark of ``magic``)."""
    if len(raw) != _MARK.size:
        return 0
    found, offset, crc = _MARK.unpack(raw)
    if found != magic or crc32(raw[:12]) != crc:
        return 0
    return int(offset)


def read_mark(path: Path | str, magic: bytes) -> tuple[int, int]:
    """The offset of the mark file at ``path`` and its size in bytes
    ((0, 0): missing or unreadable; (0, size): torn). Cheap: one open, one read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return 0, 0
    try:
        raw = os.read(fd, 64)
    except OSError:
        return 0, 0
    finally:
        os.close(fd)
    return decode_mark(raw, magic), len(raw)


def read_checkpoint(directory: Path) -> int:
    """The last offset the log in ``directory`` confirmed as flushed (0:
    none known, or the file is torn)."""
    return read_mark(directory / CHECKPOINT, _MAGIC)[0]


def read_start(directory: Path) -> int:
    """The first offset the log in ``directory`` keeps by its start mark
    (0: no mark; then its first term says)."""
    return read_mark(directory / START, _START_MAGIC)[0]


def write_start(directory: Path, offset: int) -> None:
    """Durably mark ``offset`` as the first the log keeps: a temporary file
    written and fsynced, renamed over ``start``, the directory fsynced.
    Raises :class:`OSError`."""
    head = struct.pack("<4sQ", _START_MAGIC, offset)
    temporary = directory / (START + ".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, head + struct.pack("<I", crc32(head)))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, directory / START)
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_checkpoint(directory: Path, offset: int, *, dir_fd: int | None = None) -> None:
    """Note that every offset up to ``offset`` is flushed: one small write
    in place, best effort, no fsync (the terms were fsynced before). With
    ``dir_fd`` (a descriptor of ``directory`` opened earlier), in that
    directory even if the path now names another one (the topic deleted
    and made again meanwhile: the write then fails, as it should)."""
    head = struct.pack("<4sQ", _MAGIC, offset)
    raw = head + struct.pack("<I", crc32(head))
    flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC
    with contextlib.suppress(OSError):
        if dir_fd is None:
            fd = os.open(directory / CHECKPOINT, flags, 0o644)
        else:
            fd = os.open(CHECKPOINT, flags, 0o644, dir_fd=dir_fd)
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
