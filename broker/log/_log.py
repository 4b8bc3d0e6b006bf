"""TopicLog: one topic's append-only log of terms, and its readers.

Records go into the active term's in-memory buffer (an anonymous map) and from there to its
file (:meth:`TopicLog.write`, or before the append returns with
``flush="always"``); a full term is sealed (written and fsynced) and a new
one started, named by its first offset. Reads return slices of the term
buffers: the active term's buffer or a sealed term's read-only file map.

Nothing here reads a clock: every method that needs the time takes it
(``now_ms``, ms since the epoch). Not thread-safe: one owner calls it all.
"""

from __future__ import annotations

import contextlib
import os
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from zlib import crc32

from ._errors import LogClosed, LogError, LogFull, LogWriteError
from ._files import (
    TermFile,
    create_topic_dir,
    fsync_dir,
    map_file,
    remove_term,
    term_path,
    write_error,
    write_index,
)
from ._format import check_size, encode_index
from ._marks import read_start, write_checkpoint, write_start
from ._open_files import OpenFiles, TermMaps
from ._recover import recover
from ._term import Term, new_buffer
from ._types import LogConfig, Recovery, Run, Start

__all__ = ["Reader", "TopicLog"]

#: Defaults of one read: enough records to fill a few DeliverMany frames.
READ_RECORDS = 1024
READ_BYTES = 1 << 20


class TopicLog:
    """The log of one topic in its own directory.

    Promises: offsets are consecutive from 1 and never reused; a record's
    bytes and receive time never change; a record that was appended is
    readable until retention deletes its whole term or
    :meth:`purge_before` deletes it; after a crash and
    :meth:`open`, every record up to :attr:`durable_offset` (and, after a
    process crash, up to :attr:`written_offset`) is there, in order, once,
    and nothing torn is ever served.

    Readers see a record as soon as it is appended, before it is written
    or fsynced; a broker that must not deliver what a crash could lose
    delivers only up to :attr:`durable_offset`.
    """

    def __init__(
        self,
        directory: Path,
        topic: str,
        config: LogConfig,
        now_ms: int | None,
        files: OpenFiles | None = None,
    ) -> None:
        """Open (or create) the log in ``directory``; prefer :meth:`open`
        (a :class:`LogStore` gives ``files``: the bound its files open within)."""
        create_topic_dir(directory, topic, now_ms)
        self.directory = directory
        self.topic = topic
        self.config = config
        terms, recovery = recover(directory, config)
        #: The start mark: records below it were purged (0: none).
        self._start = read_start(directory)
        #: What opening cut (for a metric); clean after a clean close.
        self.recovery: Recovery = recovery
        self._terms: list[Term] = terms
        self._active = terms[-1]
        #: The bound of open files its term files open within (the store's).
        self._files = files
        self._file = TermFile(term_path(directory, self._active.base), create=False, files=files)
        self._file.sync()
        self._written = self._active.used
        # The crc32 of the active term's bytes in its file (for its index).
        self._term_crc = crc32(self._active.view[: self._written])
        self._written_next = self._durable_next = self._active.next_offset
        self._last_time = next((t.last_time for t in reversed(terms) if t.last_time), 0)
        self._dirty_since: int | None = None
        self._write_error: LogWriteError | None = None
        self._mapped: OrderedDict[int, Term] = OrderedDict()
        #: The mapped terms' places in the store's bound (a map holds a descriptor).
        self._maps = TermMaps(files, self._unmap)
        self._readers: set[Reader] = set()
        self._always = config.flush == "always"
        #: With ``flush="always"``: the caller fsyncs (:meth:`start_sync`, off
        #: its thread) instead of each append, and confirms a record only
        #: once it is durable; :attr:`written_offset` is then the last durable
        #: offset, so that nothing is delivered before it is durable either.
        self.sync_later = False
        self._closed = False

    @classmethod
    def open(
        cls, directory: Path, topic: str, config: LogConfig | None = None, now_ms: int | None = None
    ) -> TopicLog:
        """Open the log of ``topic`` in ``directory``, creating it if new.
        A torn or corrupt tail is cut (see :attr:`recovery`). The caller
        holds the data directory's lock (:class:`LogStore` does)."""
        return cls(directory, topic, config or LogConfig(), now_ms)

    # ------------------------------------------------------------------ state

    @property
    def first_offset(self) -> int:
        """The offset of the first retained record (:attr:`next_offset` if none)."""
        base = self._terms[0].base
        return base if base >= self._start else self._start

    @property
    def next_offset(self) -> int:
        """The offset the next append gets."""
        return self._active.next_offset

    @property
    def written_offset(self) -> int:
        """The last offset handed to the OS: survives the process being
        killed (with ``flush="always"`` and :attr:`sync_later`, the last
        offset fsynced: readers see no further)."""
        if self.sync_later and self._always:
            return self._durable_next - 1
        return self._written_next - 1

    @property
    def durable_offset(self) -> int:
        """The last offset fsynced: survives the machine losing power."""
        return self._durable_next - 1

    @property
    def gap_records(self) -> int:
        """Records missing inside the log (see :attr:`recovery`): readers get a gap."""
        return sum(count for first, count in self.recovery.gaps if first >= self.first_offset)

    @property
    def size_bytes(self) -> int:
        """Bytes of all retained terms (headers included)."""
        return sum(term.used for term in self._terms)

    @property
    def term_count(self) -> int:
        return len(self._terms)

    @property
    def closed(self) -> bool:
        return self._closed

    def term_bases(self) -> list[int]:
        """The base offsets of the retained terms, oldest first."""
        return [term.base for term in self._terms]

    # ------------------------------------------------------------------ appending

    def append(self, tail: bytes | memoryview, now_ms: int) -> int:
        """Append one record received at ``now_ms``; returns its offset.

        Its stored time is ``now_ms``, or the previous record's if that is
        later (times never decrease). With ``flush="always"`` it is fsynced
        before this returns. Raises :class:`LogFull`, :class:`DiskFull`
        (:class:`LogWriteError`) or :class:`RecordTooLarge`, and then
        nothing was appended.
        """
        if not (
            (self._always and not self.sync_later) or self._write_error is not None or self._closed
        ):
            last = self._last_time
            time_ms = now_ms if now_ms > last else last
            offset = self._active.append(tail, time_ms)
            if offset:
                self._last_time = time_ms
                if self._dirty_since is None:
                    self._dirty_since = now_ms
                return offset
        self.append_many((tail,), now_ms)
        return self._active.next_offset - 1

    def append_many(self, tails: Sequence[bytes | memoryview], now_ms: int) -> int:
        """Append records received at ``now_ms`` (one receive time for the
        batch); returns how many were appended, from the :attr:`next_offset`
        the call found. Fewer than all only when the log filled (or the disk
        failed) part way: the error comes with the next call. Raises, with
        nothing appended, as :meth:`append` does; with ``flush="always"`` one
        fsync covers the batch."""
        if self._closed:
            raise LogClosed(f"the log of {self.topic!r} is closed")
        if not tails:
            return 0
        check_size(max(map(len, tails)), self.config.term_bytes)
        if self._write_error is not None:
            self.write()  # still failing: raises, nothing appended
        last_time = self._last_time
        time_ms = now_ms if now_ms > last_time else last_time
        active = self._active
        kept = active.count  # the active term's records before this call
        done = 0
        total = len(tails)
        try:
            while True:
                done += active.append_many(tails[done:] if done else tails, time_ms)
                if done == total:
                    break
                self._rotate()
                active = self._active
                kept = 0
                if not active.append(tails[done], time_ms):
                    raise AssertionError("a checked record fits an empty term")
                done += 1
                if done == total:
                    break
        except (LogFull, LogWriteError):
            if not done:
                raise
        self._last_time = time_ms
        if self._always and not self.sync_later:
            written, written_next, term_crc = self._written, self._written_next, self._term_crc
            try:
                self.flush()
            except LogWriteError:
                # Undo what this call put in the active term: never read,
                # and cut from the file if the write got there.
                if self._written != written:
                    self._file.cut(written)
                    self._written, self._written_next = written, written_next
                    self._term_crc = term_crc
                if active is self._active and kept < active.count:
                    done -= active.count - kept
                    active.truncate(kept)
                    self._last_time = active.last_time or last_time
                self._write_error = None
                if not done:
                    raise
        elif self._dirty_since is None:
            self._dirty_since = now_ms
        return done

    # ------------------------------------------------------------------ writing

    def write(self) -> None:
        """Hand every appended record to the OS (no fsync): after this they
        survive the process being killed. On a failure the records stay in
        memory (readable), the file keeps only whole records, and appends
        raise :class:`LogWriteError` until a write succeeds."""
        active = self._active
        used = active.used
        if self._written < used:
            chunk = active.view[self._written : used]
            try:
                self._file.write_at(chunk, self._written)
            except LogWriteError as exc:
                self._write_error = exc
                raise
            self._term_crc = crc32(chunk, self._term_crc)
            self._written = used
            self._written_next = active.next_offset
        self._write_error = None

    def flush(self) -> None:
        """:meth:`write`, then fsync: every appended record is durable."""
        self.write()
        if self._durable_next < self._written_next:
            self._file.sync()
            self._synced(self._written_next)
        self._dirty_since = None

    def flush_due(self, now_ms: int) -> bool:
        """The batch end: :meth:`write`, and fsync too if the oldest unsynced
        append is ``flush_interval_ms`` old. Returns whether it fsynced."""
        self.write()
        due = self.next_flush_at
        if due is not None and now_ms >= due:
            self.flush()
            return True
        return False

    def release_file(self, now_ms: int, idle_ms: int) -> bool:
        """Give back the active term file's descriptor if nothing was
        appended for ``idle_ms`` and every record is written and fsynced; the
        next write opens it again. Returns whether it released one."""
        if (
            self._closed
            or not self._file.open
            or self._dirty_since is not None
            or self._written < self._active.used
            or self._durable_next < self._written_next
            or now_ms - self._last_time < idle_ms
        ):
            return False
        self._file.release()
        return True

    def start_sync(self) -> SyncJob | None:
        """:meth:`write`, then the fsync that makes every written record
        durable, to run off this thread (its :meth:`SyncJob.run` blocks; the
        log may be appended to meanwhile); None if nothing needs it. Call
        :meth:`SyncJob.finish` here once it ran. Raises :class:`LogWriteError`
        (the write, or no file descriptor left for the sync)."""
        self.write()
        self._dirty_since = None
        if self._durable_next >= self._written_next:
            return None
        if self._file.clean:  # (synced as its descriptor was given back for another file)
            self._synced(self._written_next)
            return None
        return SyncJob(self, self._file, self._written_next)

    def _synced(self, durable_next: int, *, noted: bool = False) -> None:
        """Records before ``durable_next`` are durable; unless ``noted`` (by a
        :class:`SyncJob`, in its thread), the checkpoint is written here."""
        if durable_next > self._durable_next:
            self._durable_next = durable_next
            if not noted:
                # What recovery compares the log with, to tell what was lost.
                write_checkpoint(self.directory, durable_next - 1)

    def _sync_failed(self) -> None:
        """An fsync failed: what it was to cover is written again before the
        next one (after a failed fsync the kernel may have dropped the dirty
        pages or marked them clean: a later fsync that succeeds proves
        nothing about them), from the first record not known durable in the
        active term; and the next sync is due at once."""
        if self._dirty_since is None:
            self._dirty_since = 0  # due at once: the next flush_due tries again
        active = self._active
        durable = self._durable_next
        if durable >= active.base and durable < self._written_next:
            position = active.positions[durable - active.base]
            self._written = position
            self._written_next = durable
            self._term_crc = crc32(active.view[:position])

    @property
    def next_flush_at(self) -> int | None:
        """When :meth:`flush_due` next has an fsync to do (``None``: nothing to sync)."""
        if self._dirty_since is None:
            return None
        return self._dirty_since + self.config.flush_interval_ms

    def _rotate(self) -> None:
        """Seal the full active term and start the next (retention first)."""
        self._make_room()
        sealed = self._active
        self.flush()
        assert sealed.first_time is not None and sealed.last_time is not None
        index = encode_index(sealed.positions, sealed.first_time, sealed.last_time, self._term_crc)
        write_index(term_path(self.directory, sealed.base), index)
        base = sealed.next_offset
        capacity = self.config.term_bytes
        new_file = TermFile(term_path(self.directory, base), create=True, files=self._files)
        self._file.close()
        self._file = new_file
        self._active = Term(base, capacity, new_buffer(capacity))
        self._terms.append(self._active)
        self._written = 0
        self._term_crc = 0
        # Its memory goes back once no run read from it is held; later reads
        # map its file (in the page cache: just written).
        sealed.unload()

    # ------------------------------------------------------------------ retention

    def _make_room(self) -> None:
        """Delete the oldest terms until the sealed ones and a new full
        term fit ``retain_bytes`` (never the term about to be sealed)."""
        limit = self.config.retain_bytes
        if limit is None:
            return
        total = self.size_bytes + self.config.term_bytes
        while len(self._terms) > 1 and total > limit:
            oldest = self._terms[0]
            if self._blocked(oldest):
                raise LogFull(
                    f"the log of {self.topic!r} is full: retain_bytes={limit} and a reader "
                    f"still needs offset {self.min_reader_position()}"
                )
            total -= oldest.used
            self._delete_oldest()

    def expire(self, now_ms: int) -> int:
        """Delete the sealed terms whose newest record is older than
        ``retain_seconds`` (oldest first; with ``when_full="block"``, not one
        a registered reader still needs). Returns how many it deleted."""
        seconds = self.config.retain_seconds
        if seconds is None or self._closed:
            return 0
        cutoff = now_ms - seconds * 1000
        deleted = 0
        while len(self._terms) > 1:
            oldest = self._terms[0]
            if oldest.last_time is None or oldest.last_time >= cutoff or self._blocked(oldest):
                break
            self._delete_oldest()
            deleted += 1
        return deleted

    def _blocked(self, term: Term) -> bool:
        if self.config.when_full != "block":
            return False
        needed = self.min_reader_position()
        return needed is not None and needed < term.next_offset

    def _delete_oldest(self, *, sync: bool = True) -> None:
        term = self._terms.pop(0)
        self._mapped.pop(term.base, None)
        self._maps.closed(term.base)
        term.unload()
        remove_term(term_path(self.directory, term.base))
        if sync:
            with contextlib.suppress(OSError):
                fsync_dir(self.directory)

    def purge_before(self, offset: int) -> int:
        """Delete every record below ``offset`` (clamped to
        :attr:`first_offset` .. :attr:`written_offset` + 1), whatever readers
        hold (``when_full="block"`` too): they get a gap for them, as for
        retention. Term files wholly below go at once; in the term that
        holds ``offset`` the records below become unreadable, by a start mark
        made durable before any file is removed, so the purge holds after a
        crash or restart. Returns how many records it deleted (0 at or
        below :attr:`first_offset`). Raises :class:`LogWriteError` if the
        mark cannot be written (nothing deleted then)."""
        if self._closed:
            raise LogClosed(f"the log of {self.topic!r} is closed")
        first = self.first_offset
        target = min(offset, self.written_offset + 1)
        if target <= first:
            return 0
        deleted = 0
        for term in self._terms:
            if term.base >= target:
                break
            deleted += max(0, min(term.next_offset, target) - max(term.base, first))
        try:
            write_start(self.directory, target)
        except OSError as exc:
            raise write_error(exc, f"marking the start of the log of {self.topic!r}") from exc
        self._start = target
        removed = False
        while len(self._terms) > 1 and self._terms[0].next_offset <= target:
            self._delete_oldest(sync=False)
            removed = True
        if removed:
            with contextlib.suppress(OSError):
                fsync_dir(self.directory)
        return deleted

    # ------------------------------------------------------------------ reading

    def read(
        self, offset: int, max_records: int = READ_RECORDS, max_bytes: int = READ_BYTES
    ) -> Run:
        """The records from ``offset`` on, within one term: at most
        ``max_records`` and about ``max_bytes`` (at least one record if
        any). Before the first retained record, or in a range of offsets
        missing inside the log (damage found by recovery), it starts at the
        next record there is and reports the ``gap``; at or past the end the
        run is empty."""
        if self._closed:
            raise LogClosed(f"the log of {self.topic!r} is closed")
        active = self._active
        if offset >= active.base and offset >= self._start:
            return Run(offset, active.bodies(offset, max_records, max_bytes))
        gap = 0
        first = self.first_offset
        if offset < first:
            gap = first - offset
            offset = first
            if offset >= active.base:
                return Run(offset, active.bodies(offset, max_records, max_bytes), gap)
        terms = self._terms
        index = bisect_right(terms, offset, key=_base) - 1
        term = terms[index]
        if offset >= term.next_offset:
            # Offsets missing between two terms (damaged, or a term file
            # gone: see ``recovery``): the run starts after them.
            term = terms[index + 1]
            gap += term.base - offset
            offset = term.base
            if term is active:
                return Run(offset, active.bodies(offset, max_records, max_bytes), gap)
        if not term.loaded:
            term.load(map_file(term_path(self.directory, term.base)))
        self._keep_mapped(term)
        return Run(offset, term.bodies(offset, max_records, max_bytes), gap)

    def times(self, offset: int, count: int) -> list[int]:
        """The receive times (ms since the epoch) of the ``count`` records
        from ``offset`` on, as appended: what a reader of those records
        sends with them. The records must be retained and appended (a run
        just read, or records just appended); raises :class:`LogError` if not."""
        if self._closed:
            raise LogClosed(f"the log of {self.topic!r} is closed")
        if offset < self.first_offset or offset + count > self.next_offset:
            raise LogError(
                f"records {offset} to {offset + count - 1} of {self.topic!r} are not in its log"
            )
        times: list[int] = []
        terms = self._terms
        index = bisect_right(terms, offset, key=_base) - 1
        while len(times) < count:
            term = terms[index]
            if offset + len(times) < term.base:
                raise LogError(f"offset {offset + len(times)} of {self.topic!r} is in a gap")
            if not term.loaded:
                term.load(map_file(term_path(self.directory, term.base)))
            self._keep_mapped(term)
            times += term.times(offset + len(times), count - len(times))
            index += 1
        return times

    def stored(self, offset: int, count: int) -> memoryview:
        """The bytes of ``count`` records from ``offset`` exactly as the log
        stores them (each with its header: offset, time and checksum; see
        ``_format``), without a copy: what :func:`encode_run` would make of
        them, for records a :meth:`read` just returned (they are in one
        term). Raises :class:`LogError` if they are not all retained in one
        term."""
        if self._closed:
            raise LogClosed(f"the log of {self.topic!r} is closed")
        if offset < self.first_offset or offset + count > self.next_offset:
            raise LogError(
                f"records {offset} to {offset + count - 1} of {self.topic!r} are not in its log"
            )
        index = bisect_right(self._terms, offset, key=_base) - 1
        term = self._terms[index]
        if not term.loaded:
            term.load(map_file(term_path(self.directory, term.base)))
        self._keep_mapped(term)
        try:
            return term.stored(offset, count)
        except ValueError as error:
            raise LogError(f"{self.topic!r}: {error}") from None

    def offset_at_time(self, time_ms: int) -> int:
        """The offset of the first retained record received at or after
        ``time_ms`` (:attr:`next_offset` if none is)."""
        for term in self._terms:
            if term.last_time is not None and term.last_time >= time_ms:
                if term is not self._active and not term.loaded:
                    term.load(map_file(term_path(self.directory, term.base)))
                    self._keep_mapped(term)
                return max(term.offset_at_time(time_ms), self.first_offset)
        return self.next_offset

    def _keep_mapped(self, term: Term) -> None:
        """Note a sealed term's buffer as just used; unload the least recently used beyond
        ``mapped_terms``."""
        if term is self._active:
            return
        self._mapped[term.base] = term
        self._mapped.move_to_end(term.base)
        self._maps.used(term.base)
        while len(self._mapped) > self.config.mapped_terms:
            self._unmap(next(iter(self._mapped)))

    def _unmap(self, base: int) -> None:
        """Drop the map of term ``base`` (slices read from it keep it alive)."""
        term = self._mapped.pop(base, None)
        if term is not None:
            term.unload()
        self._maps.closed(base)

    def reader(self, start: Start | None = None, *, register: bool = True) -> Reader:
        """A reader from ``start`` (default: earliest). A registered reader's
        position holds back ``when_full="block"`` deletion until it is
        closed."""
        start = start or Start.earliest()
        if start.kind == "earliest":
            position = self.first_offset
        elif start.kind == "latest":
            position = self.next_offset
        elif start.kind == "offset":
            position = start.value
        elif start.kind == "last":
            position = max(self.first_offset, self.next_offset - start.value)
        else:
            position = self.offset_at_time(start.value)
        reader = Reader(self, position)
        if register:
            self._readers.add(reader)
        return reader

    def min_reader_position(self) -> int | None:
        """The lowest position of the registered readers (``None``: none)."""
        return min((reader.position for reader in self._readers), default=None)

    def _forget(self, reader: Reader) -> None:
        self._readers.discard(reader)

    # ------------------------------------------------------------------ closing

    def close(self, *, flush: bool = True) -> None:
        """Flush (write and fsync) and close the file; idempotent. Slices
        already read stay valid. If the flush fails (the disk is still full)
        the log is closed all the same, the error raised, and the records
        not yet written are lost (those up to :attr:`written_offset` are not).
        ``flush=False`` closes without writing anything (a log about to be
        deleted)."""
        if self._closed:
            return
        try:
            if flush:
                self.flush()
        finally:
            self._closed = True
            self._file.close()
            self._readers.clear()
            for base in list(self._mapped):
                self._unmap(base)

    def __enter__(self) -> TopicLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class SyncJob:
    """One fsync of a log's active term file, run off the log's thread
    (see :meth:`TopicLog.start_sync`). It syncs a duplicate of the file's
    descriptor, so the log may rotate or close meanwhile."""

    __slots__ = ("_dir_fd", "_fd", "_file", "_log", "_target", "_writes", "error")

    def __init__(self, log: TopicLog, file: TermFile, target: int) -> None:
        self._log = log
        self._target = target
        self._file = file
        self._writes = file.writes
        self._fd = file.dup()  # (LogWriteError: no descriptor left, tried again)
        # The log's directory as it is now: the checkpoint goes there, not
        # into a directory of the same name made after a delete meanwhile
        # (the new log's, which it would claim had lost records). Best
        # effort, as the checkpoint is: none without a descriptor.
        try:
            self._dir_fd: int | None = os.open(
                log.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
            )
        except OSError:
            self._dir_fd = None
        #: What the fsync raised (:class:`LogWriteError`), once it ran.
        self.error: LogWriteError | None = None

    def run(self) -> None:
        """fdatasync (blocks; safe in a worker thread)."""
        try:
            os.fdatasync(self._fd)
        except OSError as exc:
            self.error = write_error(exc, f"syncing the log of {self._log.topic!r}")
        else:
            # The checkpoint too, here rather than on the log's (event loop's)
            # thread: syncs of a store run one at a time, so in order.
            if self._dir_fd is not None:
                write_checkpoint(self._log.directory, self._target - 1, dir_fd=self._dir_fd)
        finally:
            os.close(self._fd)
            if self._dir_fd is not None:
                os.close(self._dir_fd)

    def finish(self) -> None:
        """On the log's thread: the records it covered are durable (unless it failed:
        they stay written, and the next sync tries again)."""
        if self.error is None:
            self._file.synced_to(self._writes)
            self._log._synced(self._target, noted=True)
        else:
            self._log._sync_failed()


def _base(term: Term) -> int:
    return term.base


class Reader:
    """A position in a :class:`TopicLog`: the next offset to deliver.

    :meth:`read` never moves it; the caller moves it with :meth:`advance_to`
    once it has delivered records (e.g. ``run.first_offset + sent``).
    """

    __slots__ = ("__weakref__", "_log", "position")

    def __init__(self, log: TopicLog, position: int) -> None:
        self._log = log
        #: The next offset this reader wants.
        self.position = position

    def read(self, max_records: int = READ_RECORDS, max_bytes: int = READ_BYTES) -> Run:
        """:meth:`TopicLog.read` at :attr:`position`."""
        return self._log.read(self.position, max_records, max_bytes)

    def advance_to(self, offset: int) -> None:
        """Move to ``offset`` (forward only; at most :attr:`TopicLog.next_offset`)."""
        if offset < self.position:
            raise ValueError(f"a reader moves forward only ({offset} < {self.position})")
        if offset > self._log.next_offset and offset > self.position:
            raise ValueError(f"offset {offset} is past the end ({self._log.next_offset})")
        self.position = offset

    @property
    def gap(self) -> int:
        """How many records this reader wanted that retention deleted."""
        return max(0, self._log.first_offset - self.position)

    @property
    def lag(self) -> int:
        """How many retained records are waiting for this reader."""
        return max(0, self._log.next_offset - max(self.position, self._log.first_offset))

    def close(self) -> None:
        """Stop holding back deletion (idempotent)."""
        self._log._forget(self)

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
