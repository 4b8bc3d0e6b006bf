"""Opening a topic directory: scan its term files, cut at the first record
that is torn, corrupt or out of sequence, and report what was cut."""

from __future__ import annotations

import contextlib
import mmap
import os
from itertools import pairwise
from pathlib import Path

from ._files import (
    file_crc,
    fsync_dir,
    list_terms,
    map_file,
    read_index,
    remove_term,
    term_path,
)
from ._format import Scan, count_cut, decode_index, scan
from ._term import Term, new_buffer
from ._types import LogConfig, Recovery

__all__ = ["expired_terms", "recover", "survey"]


def _release(data: bytes | mmap.mmap) -> None:
    if isinstance(data, mmap.mmap):
        with contextlib.suppress(BufferError):
            data.close()


def _cut_file(path: Path, size: int) -> None:
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)


def _indexed(path: Path, data: bytes | mmap.mmap, base: int, min_time: int) -> Scan | None:
    """A sealed term's records from its index file, if the index is whole,
    fits the term file and the crc32 of the whole file is the one it
    recorded (one pass in C instead of a check per record)."""
    raw = read_index(path)
    decoded = None if raw is None else decode_index(raw, len(data), base)
    if decoded is None:
        return None
    found, term_crc = decoded
    if found.first_time is None or found.first_time < min_time or file_crc(data) != term_crc:
        return None
    return found


def recover(directory: Path, config: LogConfig) -> tuple[list[Term], Recovery]:
    """The terms of the topic in ``directory``, oldest first, the last one
    loaded into a buffer of its capacity ready for appends (created, at
    base 1, if there is none); and what had to be cut.

    Every term is checked: a sealed term with a good index by the crc32 of
    the whole file, the others record by record (checksums, consecutive
    offsets, times never decreasing); each must start where the previous
    one ended. At the
    first bad record the term file is truncated there and becomes the
    active term; the term files after it are removed, their records counted
    as cut.
    """
    terms: list[Term] = []
    cut_bytes = cut_records = cut_terms = 0
    details: list[str] = []
    files = list_terms(directory)
    expected = files[0][0] if files else 1
    min_time = 0
    broken = False
    for number, (base, path) in enumerate(files):
        if not broken and base != expected:
            details.append(f"term {base} does not follow offset {expected - 1}")
            broken = True
        data = map_file(path)
        try:
            size = len(data)
            found = None
            if not broken and number < len(files) - 1:
                found = _indexed(path, data, base, min_time)
            if found is None:
                found = scan(data, size, base, min_time)
            # The records in what is cut (the bad one and those after it).
            lost = 0 if found.zeros else count_cut(data, found.end, size, found.next_offset)
        finally:
            _release(data)
        if broken:
            cut_records += found.count
            cut_bytes += size
            cut_terms += 1
            details.append(f"removed term {base}: {found.count} records, {size} bytes")
            remove_term(path)
            continue
        if found.cut:
            broken = True
            cut_bytes += found.cut
            cut_records += lost
            what = (
                "zeros"
                if found.zeros
                else f"a torn or corrupt record and what follows it (about {lost} records)"
            )
            details.append(
                f"cut term {base} at byte {found.end} after offset {found.next_offset - 1}: "
                f"{found.cut} bytes of {what}"
            )
            _cut_file(path, found.end)
        terms.append(Term(base, max(config.term_bytes, found.end), None, found))
        expected = found.next_offset
        if found.last_time is not None:
            min_time = found.last_time
    if not terms:
        term_path(directory, expected).touch()
        fsync_dir(directory)
        terms.append(Term(expected, config.term_bytes, None))
    active = terms[-1]
    buffer = new_buffer(active.capacity)
    if active.used:
        with open(term_path(directory, active.base), "rb") as file:
            file.readinto(memoryview(buffer)[: active.used])
    active.load(buffer)
    recovery = Recovery(cut_bytes, cut_records, cut_terms, details)
    return terms, recovery


def survey(directory: Path) -> tuple[int, int]:
    """The first offset kept and the next offset of the log in ``directory``,
    as :func:`recover` would find them, read only: nothing is cut, created
    or loaded, and no lock is needed (a log being appended to meanwhile
    reads as of some moment during the call: a record half written is not
    counted). Raises :class:`OSError` if a term cannot be read."""
    files = list_terms(directory)
    if not files:
        return 1, 1
    expected = files[0][0]
    min_time = 0
    for number, (base, path) in enumerate(files):
        if base != expected:
            break
        data = map_file(path)
        try:
            found = None
            if number < len(files) - 1:
                found = _indexed(path, data, base, min_time)
            if found is None:
                found = scan(data, len(data), base, min_time)
        finally:
            _release(data)
        expected = found.next_offset
        if found.cut:
            break
        if found.last_time is not None:
            min_time = found.last_time
    return files[0][0], expected


def expired_terms(directory: Path, cutoff_ms: int) -> list[Path]:
    """The sealed terms at the start of the log in ``directory`` whose newest
    record was received before ``cutoff_ms``, oldest first, as their index
    files say (what :meth:`TopicLog.expire` would delete once the log is
    open), read only: never the last term, and none from the first whose
    index is missing or bad, or that the next term does not follow."""
    files = list_terms(directory)
    expired: list[Path] = []
    for (base, path), (next_base, _) in pairwise(files):
        raw = read_index(path)
        decoded = None if raw is None else decode_index(raw, path.stat().st_size, base)
        if decoded is None:
            break
        found, _ = decoded
        if found.next_offset != next_base or found.last_time is None:
            break
        if found.last_time >= cutoff_ms:
            break
        expired.append(path)
    return expired
