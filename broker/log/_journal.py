"""StateJournal: a small crash-safe key-value store for the broker's own state
(durable cursors, sessions, staged batches, committed batches).

The state is a map ``space -> key -> value`` held in memory; every change is
also a record appended to one journal file. A record is a topic-log record
(:mod:`._format`: crc32, length, a sequence number consecutive from 1, time
0) whose body is CBOR: ``[space, key, value]`` for a put, ``[space, key]``
for a delete. The file's first record is a header, the CBOR map
``{"format": 1, "kind": "broker state journal"}``.

Changes are in memory at once and buffered for the file: :meth:`write`
writes the buffer (it then survives a ``kill -9`` of the process),
:meth:`flush` writes and fsyncs it (it then survives a power cut). Opening
replays the file and cuts it back at the first record that is torn, corrupt
or out of sequence (:attr:`recovered_cut_bytes`). When the file grows past
twice the size of the live state (and past ``compact_min_bytes``) it is
rewritten with only the live records into ``<name>.compact``, fsynced and
renamed over the old one (then the directory is fsynced), so a crash at
any step leaves one whole journal: the old or the new.

No trio and no clock here: the caller decides when to write.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from zlib import crc32

import cbor2

from ._errors import LogClosed, LogError
from ._files import TermFile, fsync_dir, write_error
from ._format import HEADER, HEADER_SIZE, scan

__all__ = ["JOURNAL_FORMAT", "JournalFormatError", "StateJournal"]

log = logging.getLogger("broker.log")

#: The format number in the journal's header record.
JOURNAL_FORMAT = 1
_HEADER_BODY = {"format": JOURNAL_FORMAT, "kind": "broker state journal"}
#: Suffix of the file a compaction writes before renaming it over the journal.
COMPACT_SUFFIX = ".compact"
#: A journal smaller than this is never compacted.
COMPACT_MIN_BYTES = 1 << 20
#: A compaction writes the live records in pieces of about this size.
_COMPACT_CHUNK = 1 << 20


class JournalFormatError(LogError):
    """The journal file was written by a newer broker (an unknown format)."""


def _record(sequence: int, body: bytes) -> tuple[bytes, bytes]:
    """One record as (its topic-log record header, time 0; ``body``), so a
    body is copied only once, when the buffer is written."""
    rest = HEADER.pack(0, len(body), sequence, 0)[4:]
    return HEADER.pack(crc32(body, crc32(rest)), len(body), sequence, 0), body


def _encode(sequence: int, body: bytes) -> bytes:
    """One record, whole."""
    return b"".join(_record(sequence, body))


def _decode(body: bytes | memoryview) -> tuple[str, str, object, bool] | None:
    """``(space, key, value, deleted)`` of a record body; None if it is not one."""
    try:
        item = cbor2.loads(body)
    except Exception:  # any malformed CBOR is a corrupt record, never a crash
        return None
    if not isinstance(item, list) or len(item) not in (2, 3):
        return None
    if not isinstance(item[0], str) or not isinstance(item[1], str):
        return None
    if len(item) == 2:
        return item[0], item[1], None, True
    if item[2] is None:
        return None
    return item[0], item[1], item[2], False


class StateJournal:
    """A crash-safe ``space -> key -> value`` store in one file (see the module).

    Values are what CBOR can hold (ints, strings, bytes, lists, maps, bools,
    floats) and never ``None`` (``get`` says ``None`` for a missing key).
    Values come back as CBOR decodes them after a reopen: lists, not tuples;
    treat what :meth:`get` returns as read-only.

    Not thread-safe; one instance per file (the data directory's lock keeps
    other processes away).
    """

    def __init__(self, path: Path, *, compact_min_bytes: int = COMPACT_MIN_BYTES) -> None:
        self.path = Path(path)
        self.compact_min_bytes = compact_min_bytes
        #: Bytes cut from the end of the file when it was opened (a torn or
        #: corrupt tail: a crash mid-write, or damage); 0 for a clean file.
        self.recovered_cut_bytes = 0
        #: What was cut, in words ("" if nothing was).
        self.recovery_detail = ""
        #: Compactions done since opening (for tests and metrics).
        self.compactions = 0
        self._state: dict[str, dict[str, object]] = {}
        #: The size of the record holding each live key's value.
        self._sizes: dict[tuple[str, str], int] = {}
        self._live_bytes = 0
        #: Encoded records not written yet (headers and bodies).
        self._buffer: list[bytes] = []
        self._next = 1
        self._end = 0
        self._compact_at = 0
        #: Written since the last fsync.
        self._unsynced = False
        self._file: TermFile | None = None
        self._open()

    # ---------------------------------------------------------------- reading

    def get(self, space: str, key: str) -> object | None:
        """The value of ``key`` in ``space``, or None."""
        return self._state.get(space, {}).get(key)

    def items(self, space: str) -> list[tuple[str, object]]:
        """Every ``(key, value)`` of ``space``, sorted by key."""
        return sorted(self._state.get(space, {}).items())

    def spaces(self) -> list[str]:
        """The spaces that hold a key, sorted."""
        return sorted(self._state)

    @property
    def pending(self) -> bool:
        """Changes are buffered that :meth:`write` has not written yet."""
        return bool(self._buffer)

    @property
    def file_bytes(self) -> int:
        """How long the journal file is (what has been written)."""
        return self._end

    @property
    def live_bytes(self) -> int:
        """How long the file would be if compacted now."""
        return self._live_bytes

    # ---------------------------------------------------------------- changing

    def put(self, space: str, key: str, value: object) -> None:
        """Set ``key`` of ``space`` to ``value`` (in memory now, in the file at
        the next :meth:`write`). Raises :class:`TypeError` for a value CBOR
        cannot hold (or None) and changes nothing then."""
        self._check_open()
        if not isinstance(space, str) or not isinstance(key, str):
            raise TypeError("journal spaces and keys are strings")
        if value is None:
            raise TypeError("a journal value cannot be None (delete the key instead)")
        try:
            body = cbor2.dumps([space, key, value])
        except cbor2.CBOREncodeError as exc:
            raise TypeError(f"the journal cannot store {type(value).__name__}: {exc}") from exc
        self._buffer.extend(_record(self._next, body))
        self._next += 1
        self._state.setdefault(space, {})[key] = value
        size = HEADER_SIZE + len(body)
        self._live_bytes += size - self._sizes.get((space, key), 0)
        self._sizes[(space, key)] = size

    def delete(self, space: str, key: str) -> None:
        """Remove ``key`` of ``space`` (nothing happens if it is not there)."""
        self._check_open()
        values = self._state.get(space)
        if values is None or key not in values:
            return
        self._buffer.extend(_record(self._next, cbor2.dumps([space, key])))
        self._next += 1
        del values[key]
        if not values:
            del self._state[space]
        self._live_bytes -= self._sizes.pop((space, key))

    # ---------------------------------------------------------------- the file

    def write(self) -> None:
        """Write the buffered changes to the file (no fsync: they survive a
        ``kill -9`` of the process, not a power cut); compact the file if it
        is due. Raises :class:`DiskFull` or :class:`LogWriteError` if the
        write fails: the file is then as before, the changes stay buffered
        and a later :meth:`write` tries again."""
        self._check_open()
        if self._buffer:
            assert self._file is not None
            data = b"".join(self._buffer)
            self._file.write_at(memoryview(data), self._end)
            self._end += len(data)
            self._buffer.clear()
            self._unsynced = True
        if self._end > max(2 * self._live_bytes, self.compact_min_bytes, self._compact_at):
            self._try_compact()

    def flush(self) -> None:
        """:meth:`write`, then fsync the file (the changes survive a power
        cut); no fsync if nothing was written since the last one."""
        self.write()
        assert self._file is not None
        if self._unsynced:
            self._file.sync()
            self._unsynced = False

    def compact(self) -> None:
        """Rewrite the file with only the live state now (buffered changes
        included): written to ``<name>.compact``, fsynced, renamed over the
        journal, directory fsynced. Raises :class:`LogWriteError` on failure,
        leaving the old file (and the buffer) as they were."""
        self._check_open()
        temporary = self._compact_path()
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
        new = TermFile(temporary, create=True)
        sizes: dict[tuple[str, str], int] = {}
        try:
            chunk: list[bytes] = list(_record(1, cbor2.dumps(_HEADER_BODY)))
            chunk_bytes = written = 0
            sequence = 2
            for space in sorted(self._state):
                for key, value in sorted(self._state[space].items()):
                    body = cbor2.dumps([space, key, value])
                    chunk.extend(_record(sequence, body))
                    sequence += 1
                    sizes[(space, key)] = HEADER_SIZE + len(body)
                    chunk_bytes += HEADER_SIZE + len(body)
                    if chunk_bytes >= _COMPACT_CHUNK:  # (bounds the memory it takes)
                        written += self._write_chunk(new, chunk, written)
                        chunk_bytes = 0
            written += self._write_chunk(new, chunk, written)
            new.sync()
            _replace(temporary, self.path)
        except BaseException:
            new.close()
            with contextlib.suppress(OSError):
                temporary.unlink()
            raise
        old, self._file = self._file, new
        if old is not None:
            old.close()
        self._end = written
        self._next = sequence
        self._buffer.clear()
        self._sizes = sizes
        self._live_bytes = written
        self._compact_at = 0
        self._unsynced = False
        self.compactions += 1
        try:
            fsync_dir(self.path.parent)
        except OSError as exc:
            raise write_error(exc, f"syncing the directory of {self.path}") from exc

    @staticmethod
    def _write_chunk(file: TermFile, chunk: list[bytes], at: int) -> int:
        """Write (and empty) ``chunk`` at ``at`` of ``file``; returns its size."""
        data = b"".join(chunk)
        chunk.clear()
        file.write_at(memoryview(data), at)
        return len(data)

    def close(self) -> None:
        """Flush (write and fsync) and close the file; idempotent. The file is
        closed even if the flush fails (then the error is raised)."""
        if self._file is None:
            return
        try:
            self.flush()
        finally:
            self._file.close()
            self._file = None

    def _abandon(self) -> None:
        """Close the file without writing what is buffered (tests: a kill -9)."""
        if self._file is not None:
            self._file.close()
            self._file = None
        self._buffer.clear()

    def __enter__(self) -> StateJournal:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ---------------------------------------------------------------- internals

    def _check_open(self) -> None:
        if self._file is None:
            raise LogClosed(f"the state journal {self.path} is closed")

    def _compact_path(self) -> Path:
        return self.path.with_name(self.path.name + COMPACT_SUFFIX)

    def _try_compact(self) -> None:
        """Compact now; if that fails (a full disk), log it and try again only
        once the file has grown by half again."""
        try:
            self.compact()
        except (LogError, OSError) as exc:
            self._compact_at = self._end + self._end // 2
            log.warning(
                "compacting the state journal %s failed (tried again later): %s", self.path, exc
            )

    def _open(self) -> None:
        """Open (or create) the file and replay it, cutting a bad tail."""
        with contextlib.suppress(FileNotFoundError):
            self._compact_path().unlink()  # a compaction cut short by a crash
        try:
            data = self.path.read_bytes()
            exists = True
        except FileNotFoundError:
            data, exists = b"", False
        self._file = TermFile(self.path, create=not exists)
        good = self._replay(data)
        if good == 0:
            header = _encode(1, cbor2.dumps(_HEADER_BODY))
            self._resize(0)
            self._file.write_at(memoryview(header), 0)
            self._file.sync()
            self._next, self._end = 2, len(header)
            self._live_bytes = len(header)
        elif good < len(data):
            self._resize(good)

    def _replay(self, data: bytes) -> int:
        """Apply the records of ``data``; returns where the good ones end."""
        found = scan(data, len(data), 1)
        positions = found.positions
        good = 0
        view = memoryview(data)
        for number in range(found.count):
            start, end = positions[number], positions[number + 1]
            body = view[start + HEADER_SIZE : end]
            if number == 0:
                if not self._header_ok(body):
                    break
                self._live_bytes = end - start
            else:
                decoded = _decode(body)
                if decoded is None:
                    break
                self._apply(*decoded, end - start)
            good = end
            self._next = number + 2
        self._end = good
        cut = len(data) - good
        if cut:
            self.recovered_cut_bytes = cut
            what = "zeros" if data[good:].count(0) == cut else "a torn or corrupt record"
            self.recovery_detail = (
                f"cut {self.path} at byte {good} after record {self._next - 1}: "
                f"{cut} bytes of {what}"
            )
        return good

    def _header_ok(self, body: memoryview) -> bool:
        try:
            header = cbor2.loads(body)
        except Exception:
            return False
        if not isinstance(header, dict) or header.get("kind") != _HEADER_BODY["kind"]:
            return False
        if header.get("format") != JOURNAL_FORMAT:
            raise JournalFormatError(
                f"{self.path} has state journal format {header.get('format')!r}, "
                f"this broker reads format {JOURNAL_FORMAT}"
            )
        return True

    def _apply(self, space: str, key: str, value: object, deleted: bool, size: int) -> None:
        old = self._sizes.pop((space, key), 0)
        self._live_bytes -= old
        if deleted:
            values = self._state.get(space)
            if values is not None:
                values.pop(key, None)
                if not values:
                    del self._state[space]
            return
        self._state.setdefault(space, {})[key] = value
        self._sizes[(space, key)] = size
        self._live_bytes += size

    def _resize(self, size: int) -> None:
        """Cut the file to ``size`` bytes and fsync it (recovery)."""
        assert self._file is not None
        try:
            os.ftruncate(self._file.fd, size)
            os.fsync(self._file.fd)
        except OSError as exc:
            raise write_error(exc, f"cutting {self.path}") from exc


def _replace(source: Path, target: Path) -> None:
    """Rename ``source`` over ``target`` (atomic); tests replace it to
    simulate a crash between the steps of a compaction."""
    try:
        os.replace(source, target)
    except OSError as exc:
        raise write_error(exc, f"renaming {source}") from exc
