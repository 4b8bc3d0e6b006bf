"""Opening a topic directory: find the intact records of every term, set
aside what is damaged, cut the torn tail of the last term, and report every
record lost (see ``docs/topic-log.md``, "Crash safety")."""

from __future__ import annotations

import contextlib
import mmap
import os
import shutil
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from zlib import crc32

from ._damage import Findings, Segment, find_intact, index_table
from ._files import (
    file_crc,
    fsync_dir,
    index_path,
    list_terms,
    map_file,
    read_index,
    remove_term,
    term_path,
    write_index,
)
from ._format import decode_index, encode_index
from ._marks import read_checkpoint, read_gaps, read_start, write_gaps
from ._term import Term, new_buffer
from ._types import LogConfig, Recovery

__all__ = ["DAMAGED_SUFFIX", "expired_terms", "recover", "survey"]

#: What a term file set aside for inspection is renamed to end with.
DAMAGED_SUFFIX = ".damaged"


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


def _examine(
    path: Path, data: bytes | mmap.mmap, base: int, min_time: int, next_base: int | None
) -> Findings:
    """The intact records of the term file ``path``: all of them at once if
    its index is whole, fits the file and the crc32 of the whole file is the
    one it recorded (one pass in C); else record by record, damage skipped
    by the index's positions or by searching (up to ``next_base``)."""
    raw = read_index(path)
    decoded = None if raw is None else decode_index(raw, len(data), base)
    if decoded is not None:
        found, term_crc = decoded
        fits = found.first_time is not None and found.first_time >= min_time
        if fits and file_crc(data) == term_crc:
            return Findings([Segment(0, found)], found.end, 0, 0)
    last = None if next_base is None else next_base - 1
    return find_intact(data, base, min_time, table=index_table(raw), last_offset=last)


@dataclass
class _Report:
    """What recovery found missing and did, for :class:`Recovery`."""

    #: Ranges of offsets missing: (first, count, why).
    holes: list[tuple[int, int, str]] = field(default_factory=list)
    cut_bytes: int = 0
    cut_terms: int = 0
    details: list[str] = field(default_factory=list)
    #: The start mark: offsets below it were deleted on purpose, never lost.
    floor: int = 0

    def hole(self, first: int, count: int, why: str) -> None:
        if first < self.floor:
            count -= self.floor - first
            first = self.floor
        if count > 0:
            self.holes.append((first, count, why))

    def recovery(self, known: list[tuple[int, int]], first_kept: int) -> Recovery:
        """What to report: holes not in ``known`` (found by an earlier
        opening) are new losses; those from ``first_kept`` on are gaps."""
        lost = 0
        gaps: list[tuple[int, int]] = []
        details: list[str] = []
        for first, count, why in self.holes:
            # (Known ranges never overlap: each was a hole of its own.)
            old = sum(max(0, min(first + count, k + n) - max(first, k)) for k, n in known)
            span = f"offset {first}" if count == 1 else f"offsets {first}-{first + count - 1}"
            known_since = ", known since an earlier start" if old == count else ""
            plural = "record" if count == 1 else "records"
            details.append(f"{count} {plural} lost at {span}: {why}{known_since}")
            lost += count - old
            if first >= first_kept:
                gaps.append((first, count))
        return Recovery(self.cut_bytes, lost, self.cut_terms, details + self.details, gaps)


def _aside(path: Path) -> Path:
    """Where to keep the damaged term file ``path``: ``<name>.damaged`` (or
    ``.<n>.damaged`` if that is taken by another file)."""
    number = 0
    while True:
        name = path.name + (f".{number}" if number else "") + DAMAGED_SUFFIX
        candidate = path.with_name(name)
        if not candidate.exists() or os.path.samefile(candidate, path):
            return candidate
        number += 1


def _keep_aside(path: Path, aside: Path) -> None:
    """A second name for the damaged file ``path`` (kept when ``path`` is
    replaced), or a copy where the file system has no hard links."""
    if not aside.exists():
        try:
            os.link(path, aside)
        except OSError:
            shutil.copyfile(path, aside)


def _write_term(path: Path, chunk: bytes) -> None:
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "wb") as file:
        file.write(chunk)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)


def _set_aside(
    directory: Path, path: Path, data: bytes | mmap.mmap, segments: list[Segment], active: bool
) -> tuple[Path, list[Path]]:
    """Keep the damaged term file ``path`` as ``<name>.damaged`` and write
    each intact run of its records (``segments``) to a term file of its own
    (the one from the file's first offset under its name), with an index
    (not the last when it becomes the ``active`` term). Later runs are
    written first: a crash part way leaves the original to do it again."""
    aside = _aside(path)
    written: list[Path] = []
    for number, segment in reversed(list(enumerate(segments))):
        target = term_path(directory, segment.base)
        chunk = bytes(data[segment.start : segment.end])
        if target == path:
            _keep_aside(path, aside)
        _write_term(target, chunk)
        written.append(target)
        found = segment.scan
        if active and number == len(segments) - 1:
            with contextlib.suppress(FileNotFoundError):
                index_path(target).unlink()
        else:
            assert found.first_time is not None and found.last_time is not None
            index = encode_index(found.positions, found.first_time, found.last_time, crc32(chunk))
            write_index(target, index)
    if path not in written:
        _keep_aside(path, aside)
        remove_term(path)
    fsync_dir(directory)
    return aside, written


def recover(directory: Path, config: LogConfig) -> tuple[list[Term], Recovery]:
    """The terms of the topic in ``directory``, oldest first, the last one
    loaded into a buffer of its capacity ready for appends (created, at
    base 1, if there is none); and what was lost.

    Every term is checked: a sealed term with a good index by the crc32 of
    the whole file, the others record by record (checksums, consecutive
    offsets, times never decreasing). A sealed term with damage is set
    aside (kept as ``<name>.damaged``) and its intact records written to
    term files of their own; between terms, offsets may be missing (a
    damaged range, a term file gone): readers get a gap for them. Only the
    torn tail of the last term is cut. If the log ends before the last
    offset its checkpoint says was flushed, or before the offsets of a torn
    tail, the log goes on after them (offsets are never used twice).

    A start mark (records deleted by :meth:`TopicLog.purge_before`) is
    honoured: term files wholly below it are removed (a purge cut off by a
    crash is finished), and offsets below it are never reported lost.
    """
    checkpoint = read_checkpoint(directory)
    known = read_gaps(directory)
    start = read_start(directory)
    files = _after_start(list_terms(directory), start, directory)
    report = _Report(floor=start)
    terms: list[Term] = []
    written: set[Path] = set()
    cursor: int | None = None  # the next offset wanted
    min_time = 0
    why = "no term file holds them"
    tail_seen = 0
    empty_last: int | None = None  # the last file's base, if it holds no record
    for number, (base, path) in enumerate(files):
        if path in written:
            continue  # (a term file the setting aside just wrote)
        rest = [later for later, other in files[number + 1 :] if other not in written]
        if cursor is not None and base < cursor:
            aside = _aside(path)
            os.replace(path, aside)
            report.cut_terms += 1
            report.details.append(
                f"term {base} overlaps the one before it: set aside as {aside.name}"
            )
            continue
        if cursor is not None:
            report.hole(cursor, base - cursor, why)
        cursor = base
        why = "no term file holds them"
        data = map_file(path)
        try:
            size = len(data)
            findings = _examine(path, data, base, min_time, rest[0] if rest else None)
            # (A sealed term file with no record is damage too: set aside.)
            if not findings.whole or (rest and not findings.segments):
                kept = sum(segment.scan.end for segment in findings.segments)
                report.cut_bytes += size - kept
                if not rest and findings.tail_only:
                    tail_seen = findings.tail_seen
                    report.details.append(
                        f"cut term {base} at byte {findings.tail_start}: {findings.tail} bytes "
                        f"of a torn or corrupt tail ({findings.tail_seen} records by their headers)"
                    )
                    _cut_file(path, findings.tail_start)
                else:
                    if not rest:
                        tail_seen = findings.tail_seen
                    aside, paths = _set_aside(
                        directory, path, data, findings.segments, active=not rest
                    )
                    written.update(paths)
                    report.cut_terms += 1
                    why = f"damaged in term {base} (kept as {aside.name})"
                    report.details.append(
                        f"term {base} is damaged: kept as {aside.name}, its "
                        f"{len(findings.segments)} intact runs of records kept"
                    )
        finally:
            _release(data)
        for segment in findings.segments:
            report.hole(cursor, segment.base - cursor, why)
            terms.append(
                Term(segment.base, max(config.term_bytes, segment.scan.end), None, segment.scan)
            )
            cursor = segment.next_offset
            assert segment.scan.last_time is not None
            min_time = segment.scan.last_time
        empty_last = None if findings.segments else base
    found_next = 1 if cursor is None else cursor
    if empty_last is not None:
        # The last term file holds no record (empty, or cut to nothing).
        terms.append(Term(empty_last, config.term_bytes, None))
    resume = max(found_next, checkpoint + 1, found_next + tail_seen, start)
    if resume > found_next:
        report.hole(
            found_next,
            resume - found_next,
            f"missing at the end of the log (it ends at offset {found_next - 1}, "
            f"offset {max(checkpoint, found_next + tail_seen - 1)} was written)",
        )
        if terms and terms[-1].count == 0:
            remove_term(term_path(directory, terms.pop().base))
        elif terms:
            _seal(directory, terms[-1])
        # Retention as if the term sealed before the gap had been filled.
        limit = config.retain_bytes
        while limit is not None and len(terms) > 1:
            if sum(term.used for term in terms) + config.term_bytes <= limit:
                break
            remove_term(term_path(directory, terms.pop(0).base))
        term_path(directory, resume).touch()
        fsync_dir(directory)
        terms.append(Term(resume, config.term_bytes, None))
        found_next = resume
    if not terms:
        term_path(directory, found_next).touch()
        fsync_dir(directory)
        terms.append(Term(found_next, config.term_bytes, None))
    active = terms[-1]
    buffer = new_buffer(active.capacity)
    if active.used:
        with open(term_path(directory, active.base), "rb") as file:
            file.readinto(memoryview(buffer)[: active.used])
    active.load(buffer)
    while len(terms) > 1 and terms[0].next_offset <= start:
        remove_term(term_path(directory, terms.pop(0).base))  # (wholly purged)
    recovery = report.recovery(known, max(terms[0].base, start))
    if recovery.gaps != known:
        write_gaps(directory, recovery.gaps)
    return terms, recovery


def _seal(directory: Path, term: Term) -> None:
    """Write the index of ``term``, the last one found, which a new term follows."""
    path = term_path(directory, term.base)
    data = map_file(path)
    try:
        term_crc = file_crc(data)
    finally:
        _release(data)
    assert term.first_time is not None and term.last_time is not None
    write_index(path, encode_index(term.positions, term.first_time, term.last_time, term_crc))


def survey(directory: Path) -> tuple[int, int]:
    """The first offset kept and the next offset of the log in ``directory``,
    as :func:`recover` would find them, read only: nothing is cut, created
    or loaded, and no lock is needed (a log being appended to meanwhile
    reads as of some moment during the call: a record half written is not
    counted). Raises :class:`OSError` if a term cannot be read."""
    start = read_start(directory)
    files = _after_start(list_terms(directory), start)
    checkpoint = read_checkpoint(directory)
    first: int | None = None
    cursor: int | None = None
    min_time = 0
    tail_seen = 0
    for number, (base, path) in enumerate(files):
        if cursor is not None and base < cursor:
            continue
        cursor = base
        later = files[number + 1][0] if number + 1 < len(files) else None
        data = map_file(path)
        try:
            findings = _examine(path, data, base, min_time, later)
        finally:
            _release(data)
        for segment in findings.segments:
            first = segment.base if first is None else first
            cursor = segment.next_offset
            assert segment.scan.last_time is not None
            min_time = segment.scan.last_time
        tail_seen = findings.tail_seen if later is None else 0
    found_next = 1 if cursor is None else cursor
    resume = max(found_next, checkpoint + 1, found_next + tail_seen, start)
    if first is None:
        first = resume
    return max(first, start), resume


def _after_start(
    files: list[tuple[int, Path]], start: int, directory: Path | None = None
) -> list[tuple[int, Path]]:
    """The term files ``files`` less those wholly below the start mark
    ``start`` (the next file begins at or below it); removed from
    ``directory`` if given (a purge cut off by a crash, finished)."""
    kept = 0
    while kept + 1 < len(files) and files[kept + 1][0] <= start:
        kept += 1
    if kept and directory is not None:
        for _, path in files[:kept]:
            remove_term(path)
        fsync_dir(directory)
    return files[kept:]


def expired_terms(directory: Path, cutoff_ms: int) -> list[Path]:
    """The sealed terms at the start of the log in ``directory`` whose newest
    record was received before ``cutoff_ms``, oldest first, as their index
    files say (what :meth:`TopicLog.expire` would delete once the log is
    open), read only: never the last term, and none from the first whose
    index is missing or bad, or that overlaps the next term."""
    files = list_terms(directory)
    expired: list[Path] = []
    for (base, path), (next_base, _) in pairwise(files):
        raw = read_index(path)
        decoded = None if raw is None else decode_index(raw, path.stat().st_size, base)
        if decoded is None:
            break
        found, _ = decoded
        if found.next_offset > next_base or found.last_time is None:
            break
        if found.last_time >= cutoff_ms:
            break
        expired.append(path)
    return expired
