"""The thin file layer of the topic log: the data directory's lock, topic
directories, term files and the metadata file. Everything that touches the
disk is here; the rest of the log works on buffers.

Layout::

    <data_dir>/.lock                     flock'ed while a store has it open
    <data_dir>/topics/<encoded topic>/meta.json
    <data_dir>/topics/<encoded topic>/<20-digit base offset>.term
    <data_dir>/topics/<encoded topic>/<20-digit base offset>.index  (sealed terms)

``pwrite`` below is the one function that writes records; tests replace it
to inject faults (``ENOSPC``).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import mmap
import os
import re
import urllib.parse
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._errors import DataDirLocked, DiskFull, LogWriteError, TopicDirMismatch
from ._open_files import OpenFiles

__all__ = [
    "FORMAT_VERSION",
    "DirLock",
    "TermFile",
    "create_topic_dir",
    "file_crc",
    "fsync_dir",
    "index_path",
    "list_terms",
    "map_file",
    "read_index",
    "read_meta",
    "remove_term",
    "term_path",
    "topic_dir_name",
    "write_error",
    "write_index",
]

#: The on-disk format version written in every ``meta.json``.
FORMAT_VERSION = 1
META = "meta.json"
TOPICS = "topics"
LOCK = ".lock"
TERM_SUFFIX = ".term"
INDEX_SUFFIX = ".index"
#: The name of a term file (its base offset in the group).
TERM_NAME = _TERM_NAME = re.compile(r"^(\d{20})\.term$")
_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
#: Longest encoded name kept whole; longer ones are cut and given a hash.
_MAX_PLAIN = 200

#: Writes ``data`` at ``offset`` of ``fd``; returns how many bytes it wrote.
pwrite = os.pwrite


def write_error(exc: OSError, what: str) -> LogWriteError:
    """The typed error for a failed write or sync of ``what``."""
    cls = DiskFull if exc.errno in (errno.ENOSPC, errno.EDQUOT) else LogWriteError
    return cls(exc.errno or 0, f"{what}: {exc.strerror or exc}")


# ---------------------------------------------------------------- directories


def topic_dir_name(topic: str) -> str:
    """A file name for ``topic``: its UTF-8 with every byte but ASCII
    letters, digits, ``_`` and ``-`` percent-encoded (``%2E`` for ``.``), so
    no name is ``.``/``..``, hidden or has a separator. Names that would
    encode longer than 200 characters keep their first ~150 and end with
    ``~`` and a SHA-256 prefix of the name (``~`` never occurs otherwise)."""
    encoded = "".join(chr(b) if b in _SAFE else f"%{b:02X}" for b in topic.encode())
    if len(encoded) <= _MAX_PLAIN:
        return encoded
    cut = encoded[:150]
    if "%" in cut[-2:]:
        cut = cut[: cut.rindex("%")]
    return f"{cut}~{hashlib.sha256(topic.encode()).hexdigest()[:40]}"


def fsync_dir(path: Path) -> None:
    """Make the entries of directory ``path`` (new, renamed, removed files) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_meta(directory: Path, topic: str) -> dict[str, Any] | None:
    """The metadata of the topic in ``directory`` (``None`` if it has none
    yet); raises :class:`TopicDirMismatch` if it belongs to another topic
    or a newer format."""
    try:
        meta: dict[str, Any] = json.loads((directory / META).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except ValueError as error:  # not UTF-8, or not JSON
        raise TopicDirMismatch(f"{directory / META} is not valid JSON ({error})") from None
    if type(meta) is not dict:
        raise TopicDirMismatch(f"{directory / META} is not a JSON object")
    if meta.get("topic") != topic:
        raise TopicDirMismatch(f"{directory} holds another topic than the one asked for")
    if meta.get("format") != FORMAT_VERSION:
        raise TopicDirMismatch(f"{directory} has log format {meta.get('format')!r}")
    return meta


def create_topic_dir(directory: Path, topic: str, now_ms: int | None) -> None:
    """Create ``directory`` and its ``meta.json`` (atomically: written to a
    temporary file, synced, renamed), unless the metadata exists already."""
    directory.mkdir(parents=True, exist_ok=True)
    if read_meta(directory, topic) is not None:
        return
    meta = {"format": FORMAT_VERSION, "topic": topic, "created_ms": now_ms}
    temporary = directory / (META + ".tmp")
    with open(temporary, "w", encoding="utf-8") as file:
        json.dump(meta, file)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, directory / META)
    fsync_dir(directory)
    fsync_dir(directory.parent)


def topics_dir(data_dir: Path) -> Path:
    """Where the topic directories of a data directory are."""
    return data_dir / TOPICS


def stored_topics(data_dir: Path) -> list[str]:
    """The names of the topics with a directory under ``data_dir``: named by
    its metadata, or (metadata lost, terms there) by the directory's name,
    which opening the topic's log then writes the metadata for."""
    names: list[str] = []
    root = topics_dir(data_dir)
    if not root.is_dir():
        return names
    for directory in sorted(root.iterdir()):
        topic = _topic_in(directory)
        if topic is None and not (directory / META).exists():
            topic = _topic_of_dir_name(directory)
        if topic is not None:
            names.append(topic)
    return names


def _topic_of_dir_name(directory: Path) -> str | None:
    """The topic ``directory``'s name encodes (:func:`topic_dir_name`), if it
    holds term files and its name is not a shortened one; None otherwise."""
    name = directory.name
    if "~" in name or not directory.is_dir() or not list_terms(directory):
        return None
    try:
        topic = urllib.parse.unquote_to_bytes(name).decode("utf-8")
    except UnicodeDecodeError:
        return None
    return topic if topic_dir_name(topic) == name else None


def _topic_in(directory: Path) -> str | None:
    """The topic named by ``directory``'s metadata (None: none can be read)."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        topic = json.loads((directory / META).read_text(encoding="utf-8")).get("topic")
        if isinstance(topic, str):
            return topic
    return None


def unopened_due(
    data_dir: Path,
    open_dirs: set[Path],
    retain_of: Callable[[str], float | None],
    now_ms: int,
) -> list[str]:
    """The topics with a directory under ``data_dir`` other than
    ``open_dirs`` whose oldest term is sealed and was last written more than
    their ``retain_of(topic)`` seconds ago (by the file's modification
    time: the newest record it holds is no newer), so that retention by
    age has something to delete once they are opened. Reads the disk (call
    it from a thread); a directory it cannot read is skipped."""
    due: list[str] = []
    with contextlib.suppress(OSError):
        for directory in topics_dir(data_dir).iterdir():
            if directory in open_dirs:
                continue
            with contextlib.suppress(OSError, ValueError, AttributeError):
                terms = [path for _, path in list_terms(directory)]
                if len(terms) < 2:
                    continue
                topic = _topic_in(directory)
                if topic is None:
                    continue
                retain = retain_of(topic)
                if retain is not None and terms[0].stat().st_mtime * 1000 < now_ms - retain * 1000:
                    due.append(topic)
    return due


class DirLock:
    """An exclusive ``flock`` on ``<directory>/.lock``, held until :meth:`release`.

    ``what`` names the directory in the one-line :class:`DataDirLocked`
    raised when another process (or another lock in this one) holds it.
    """

    def __init__(self, data_dir: Path, what: str | None = None) -> None:
        data_dir.mkdir(parents=True, exist_ok=True)
        path = data_dir / LOCK
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            shown = what or f"data directory {data_dir}"
            raise DataDirLocked(
                f"{shown} is in use by another broker (lock held on {path})"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        self._fd: int | None = fd

    def release(self) -> None:
        """Release the lock (idempotent)."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)


# ---------------------------------------------------------------- terms


def term_path(directory: Path, base: int) -> Path:
    """The file of the term whose first offset is ``base``."""
    return directory / f"{base:020d}{TERM_SUFFIX}"


def list_terms(directory: Path) -> list[tuple[int, Path]]:
    """The term files of a topic directory as (base offset, path), by base."""
    found = []
    for path in directory.iterdir():
        match = _TERM_NAME.match(path.name)
        if match:
            found.append((int(match.group(1)), path))
    found.sort()
    return found


def map_file(path: Path) -> bytes | mmap.mmap:
    """A read-only map of the file at ``path`` (``b""`` if it is empty)."""
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        if size == 0:
            return b""
        return mmap.mmap(file.fileno(), size, prot=mmap.PROT_READ)


def index_path(term: Path) -> Path:
    """The index file of the term file ``term``."""
    return term.with_suffix(INDEX_SUFFIX)


def remove_term(path: Path) -> None:
    """Delete a term file and its index (missing ones are fine)."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    with contextlib.suppress(FileNotFoundError):
        index_path(path).unlink()


def write_index(term: Path, data: bytes) -> None:
    """Write the index of a sealed term, best effort and without fsync: a
    missing or torn index only means the term is scanned at the next open."""
    with contextlib.suppress(OSError):
        index_path(term).write_bytes(data)


def read_index(term: Path) -> bytes | None:
    """The index file of a term, if there is one."""
    try:
        return index_path(term).read_bytes()
    except OSError:
        return None


def file_crc(data: bytes | mmap.mmap) -> int:
    """The crc32 of a whole (mapped) term file."""
    return zlib.crc32(data)


class TermFile:
    """The open file of the active term: written at its end only.

    :meth:`release` gives its descriptor back while it is idle (a broker
    with many topics would otherwise hold one per topic ever written), and
    ``files`` (the store's :class:`OpenFiles`) closes it when other files
    need the room (:meth:`evict`); the next use opens the file again, and a
    failure to (no descriptors left) is a :class:`LogWriteError` like any
    failed write, retried as one. It counts its writes and which of them
    are fsynced, so that it is never closed with a write not synced.
    """

    def __init__(self, path: Path, *, create: bool, files: OpenFiles | None = None) -> None:
        self.path = path
        self._files = files
        self._fd: int | None = None
        #: Released (see :meth:`release`), not closed: opened again on use.
        self._released = False
        #: Writes (and cuts) so far, and how many of them an fsync covered.
        self.writes = 0
        self._synced = 0
        #: A sync made to give the descriptor back that failed: raised by
        #: the next :meth:`sync` or :meth:`dup` (its error is reported once).
        self._failed: LogWriteError | None = None
        flags = os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT | os.O_EXCL if create else 0)
        try:
            self._fd = self._open(flags)
        except OSError as exc:
            raise write_error(exc, f"creating {path}") from exc
        if create:
            try:
                fsync_dir(path.parent)
            except OSError as exc:
                self.close()
                remove_term(path)
                raise write_error(exc, f"creating {path}") from exc

    def _open(self, flags: int) -> int:
        """Open the file, within the store's bound of open files (closing
        others' to make room, and one more if the process has no descriptor
        left)."""
        files = self._files
        if files is None:
            return os.open(self.path, flags, 0o644)
        files.make_room()
        while True:
            try:
                fd = os.open(self.path, flags, 0o644)
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE) and files.evict_one():
                    continue
                raise
            files.opened(self)
            return fd

    @property
    def fd(self) -> int:
        fd = self._fd
        if fd is None:
            if not self._released:
                raise ValueError(f"{self.path} is closed")
            try:
                fd = self._fd = self._open(os.O_RDWR | os.O_CLOEXEC)
            except OSError as exc:
                raise write_error(exc, f"opening {self.path} again") from exc
            self._released = False
        elif self._files is not None:
            self._files.used(self)
        return fd

    @property
    def open(self) -> bool:
        """Whether it holds a descriptor now."""
        return self._fd is not None

    @property
    def clean(self) -> bool:
        """Whether every write to it is fsynced."""
        return self._synced == self.writes

    def synced_to(self, writes: int) -> None:
        """The first ``writes`` writes are fsynced (by a sync elsewhere)."""
        if writes > self._synced:
            self._synced = writes

    def release(self) -> None:
        """Close the descriptor until the next use (nothing must be unwritten)."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            self._released = True
            if self._files is not None:
                self._files.closed(self)
            os.close(fd)

    def evict(self) -> bool:
        """Give the descriptor back to make room for another file's: fsynced
        first if a write is not; kept (False) if that sync fails."""
        if self._fd is None:
            return False
        if not self.clean:
            try:
                self.sync()
            except LogWriteError as exc:
                self._failed = exc
                return False
        self.release()
        return True

    def dup(self) -> int:
        """A duplicate of the descriptor (to sync in another thread; raises
        :class:`LogWriteError`)."""
        self._raise_failed()
        try:
            return os.dup(self.fd)
        except OSError as exc:  # no descriptor left: a failed sync, tried again
            raise write_error(exc, f"syncing {self.path}") from exc

    def _raise_failed(self) -> None:
        if self._failed is not None:
            failed, self._failed = self._failed, None
            raise failed

    def write_at(self, data: memoryview, offset: int) -> None:
        """Write all of ``data`` at ``offset``; on failure the file is cut
        back to ``offset`` (best effort) and a :class:`LogWriteError` raised."""
        fd = self.fd
        self.writes += 1
        done = 0
        try:
            while done < len(data):
                wrote = pwrite(fd, data[done:], offset + done)
                if wrote <= 0:  # never for a regular file, but never loop on it
                    raise OSError(errno.EIO, "the write made no progress")
                done += wrote
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, offset)
            raise write_error(exc, f"writing {self.path}") from exc

    def sync(self) -> None:
        """fdatasync the file; raises :class:`LogWriteError`. A file whose
        descriptor was given back is synced already: it is not opened for it."""
        self._raise_failed()
        if self._fd is None and self._released and self.clean:
            return
        writes = self.writes
        try:
            os.fdatasync(self.fd)
        except OSError as exc:
            raise write_error(exc, f"syncing {self.path}") from exc
        self.synced_to(writes)

    def cut(self, size: int) -> None:
        """Cut the file back to ``size`` bytes (best effort: undoing a write)."""
        self.writes += 1
        with contextlib.suppress(OSError):
            os.ftruncate(self.fd, size)

    def close(self) -> None:
        self.release()
        self._released = False  # (closed for good: no use opens it again)
