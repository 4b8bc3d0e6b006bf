"""LogStore: a broker's data directory of topic logs, locked while open."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path

from broker.protocol import check_topic_name

from ._errors import DataDirLocked, LogClosed
from ._files import (
    DirLock,
    create_topic_dir,
    fsync_dir,
    list_terms,
    read_meta,
    remove_term,
    stored_topics,
    topic_dir_name,
    topics_dir,
)
from ._journal import StateJournal
from ._listing import StoredTopic, list_stored_topics, read_stored_topic
from ._log import TopicLog
from ._marks import write_checkpoint, write_start
from ._open_files import OpenFiles, default_open_files
from ._recover import expired_terms, survey
from ._types import LogConfig

__all__ = ["DELETED", "JOURNAL_NAME", "WORKERS", "LogStore"]

#: The state journal's file in the data directory (beside ``topics/``, which
#: holds every topic directory, so no topic name can collide with it).
JOURNAL_NAME = "state.journal"
#: The directory of the workers' own directories (state journals), beside ``topics/``.
WORKERS = "workers"
#: Where deleted topics' directories go (renamed) before they are removed,
#: beside ``topics/``; anything left there (a crash) is removed at the next open.
DELETED = "deleted"


class LogStore:
    """The topic logs under one data directory.

    Opening takes an exclusive ``flock`` on ``<data_dir>/.lock`` (raising
    :class:`DataDirLocked` with a one-line message if another process, or
    another store in this one, has it); :meth:`close` closes every log and
    releases it.

    A store of one ``worker`` of a multi-worker broker shares the data
    directory with the other workers (whose supervisor holds
    ``<data_dir>/.lock``): it locks ``<data_dir>/workers/<worker>/`` instead,
    keeps its state journal there, and locks each topic's directory while
    that topic's log is open. The topic lock is the fence: two workers can
    never write one topic, whatever they believe they own.

    The logs' term files stay open within :attr:`files`: at most
    ``open_files`` at once (default: :func:`default_open_files`, a share of
    the process's open-file limit), the least recently used closed first
    (see :class:`OpenFiles`), so a store holds any number of logs open.
    """

    def __init__(
        self,
        data_dir: Path | str,
        config: LogConfig | None = None,
        *,
        worker: str | None = None,
        open_files: int | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        #: The bound of the logs' open term files, and its counters.
        self.files = OpenFiles(open_files or default_open_files())
        self.config = config or LogConfig()
        self.worker = worker
        #: Where this store's state journal is (the data directory, or the worker's own).
        self.home = self.data_dir if worker is None else self.data_dir / WORKERS / worker
        what = None if worker is None else f"worker {worker}'s directory {self.home}"
        self._lock: DirLock | None = DirLock(self.home, what)
        self._logs: dict[str, TopicLog] = {}
        self._topic_locks: dict[str, DirLock] = {}
        self._journal: StateJournal | None = None
        _remove_tombstones(self.data_dir / DELETED)

    @property
    def journal(self) -> StateJournal:
        """The broker's state journal, ``<data_dir>/state.journal``, opened
        (and recovered, or created) on first use; closed (flushed) by
        :meth:`close`."""
        if self._lock is None:
            raise LogClosed(f"the log store of {self.data_dir} is closed")
        if self._journal is None:
            self._journal = StateJournal(self.home / JOURNAL_NAME)
        return self._journal

    def topic(
        self,
        name: str,
        config: LogConfig | None = None,
        now_ms: int | None = None,
        *,
        first_offset: int | None = None,
    ) -> TopicLog:
        """The log of topic ``name``, opened (and recovered, or created) on
        first use; ``config`` (default: the store's) applies from the first
        use. A log created here starts at ``first_offset`` if given (a copy
        of records kept elsewhere from there on). Raises
        :class:`TopicNameError` for an invalid name."""
        if self._lock is None:
            raise LogClosed(f"the log store of {self.data_dir} is closed")
        log = self._logs.get(name)
        if log is None:
            check_topic_name(name)
            directory = topics_dir(self.data_dir) / topic_dir_name(name)
            lock = None
            if self.worker is not None:
                lock = DirLock(directory, f"the log of topic {name!r}")
            try:
                if first_offset is not None and first_offset > 1:
                    start_new_log(directory, name, first_offset, now_ms)
                log = TopicLog(directory, name, config or self.config, now_ms, self.files)
            except BaseException:
                if lock is not None:
                    lock.release()
                raise
            self._logs[name] = log
            if lock is not None:
                self._topic_locks[name] = lock
        return log

    def survey(self, name: str) -> tuple[int, int]:
        """The first offset kept and the next offset of the log of ``name``,
        which need not be open, read from its files without opening it
        (nothing is cut or locked: safe in a thread, and beside the log's
        writer). Raises :class:`OSError` if its files cannot be read, and
        :class:`TopicNameError` for an invalid name."""
        check_topic_name(name)
        return survey(topics_dir(self.data_dir) / topic_dir_name(name))

    def expired_terms(self, name: str, cutoff_ms: int) -> list[Path]:
        """The term files of ``name``'s log, not open, that retention by age
        would delete (see :func:`expired_terms`): read only, safe in a
        thread. Raises :class:`OSError` if they cannot be read."""
        check_topic_name(name)
        return expired_terms(topics_dir(self.data_dir) / topic_dir_name(name), cutoff_ms)

    def remove_expired(self, name: str, paths: list[Path]) -> int:
        """Delete ``paths`` (from :meth:`expired_terms`) of ``name``'s log
        without opening it, unless it was opened meanwhile (its own
        retention then decides) or, on a worker, another one holds its
        directory; returns how many were deleted."""
        if self._lock is None:
            raise LogClosed(f"the log store of {self.data_dir} is closed")
        if name in self._logs or not paths:
            return 0
        directory = paths[0].parent
        lock = None
        if self.worker is not None:
            try:
                lock = DirLock(directory, f"the log of topic {name!r}")
            except DataDirLocked:
                return 0
        try:
            for path in paths:
                remove_term(path)
            fsync_dir(directory)
        finally:
            if lock is not None:
                lock.release()
        return len(paths)

    def opened(self, name: str) -> TopicLog | None:
        """The log of ``name`` if it is open (None: not opened yet)."""
        return self._logs.get(name)

    def open_logs(self) -> dict[str, TopicLog]:
        """The logs opened so far, by topic."""
        return dict(self._logs)

    def stored_topics(self) -> list[str]:
        """The topics that have a log in the data directory (opened or not)."""
        return stored_topics(self.data_dir)

    def list_topics(self, match: Callable[[str], bool] | None = None) -> list[StoredTopic]:
        """The stored topics (opened or not) with their offsets and sizes
        as their files say, without opening any log: see
        :func:`list_stored_topics` (read only: safe in a worker thread)."""
        return list_stored_topics(self.data_dir, match)

    def stored_topic(self, name: str) -> StoredTopic | None:
        """:meth:`list_topics` of topic ``name`` alone: its own directory read
        (None: it has no log)."""
        return read_stored_topic(self.data_dir, name)

    def discard_topics(self) -> int:
        """Delete every topic's log, as :meth:`delete_topic` does (a store
        whose logs are caches of records kept elsewhere starts empty);
        returns how many there were."""
        return sum(self.delete_topic(name) for name in self.stored_topics())

    def delete_topic(self, name: str) -> bool:
        """Delete the log of ``name``; returns whether there was one.

        Its log, if open, is closed without flushing (that object and its
        readers raise :class:`LogClosed` from then on; slices already read
        stay valid). Its directory is renamed into ``<data_dir>/deleted/``
        (the rename made durable before anything is removed: after a crash
        the topic is either whole or gone, and a leftover is removed at the
        next open), then removed. A later :meth:`topic` of ``name`` creates
        a new, empty log (offsets from 1 again). A worker deletes a log
        another worker holds open only once that one lets it go
        (:class:`DataDirLocked`)."""
        if self._lock is None:
            raise LogClosed(f"the log store of {self.data_dir} is closed")
        log = self._logs.pop(name, None)
        if log is not None:
            log.close(flush=False)
        directory = topics_dir(self.data_dir) / topic_dir_name(name)
        lock = self._topic_locks.pop(name, None)
        try:
            if not directory.is_dir():
                return False
            if lock is None and self.worker is not None:
                lock = DirLock(directory, f"the log of topic {name!r}")
            trash = self.data_dir / DELETED
            if not trash.is_dir():
                trash.mkdir(exist_ok=True)
                fsync_dir(self.data_dir)
            tombstone = trash / secrets.token_hex(8)
            os.rename(directory, tombstone)
            fsync_dir(directory.parent)
            fsync_dir(trash)
        finally:
            if lock is not None:
                lock.release()
        shutil.rmtree(tombstone, ignore_errors=True)
        return True

    def close(self) -> None:
        """Close every log and the state journal (flushing them) and release
        the lock; idempotent. Everything is closed even if one fails to flush
        (the first error is raised)."""
        if self._lock is None:
            return
        error: BaseException | None = None
        for log in self._logs.values():
            try:
                log.close()
            except Exception as exc:
                error = error or exc
        self._logs.clear()
        for lock in self._topic_locks.values():
            lock.release()
        self._topic_locks.clear()
        if self._journal is not None:
            try:
                self._journal.close()
            except Exception as exc:
                error = error or exc
            self._journal = None
        self._lock.release()
        self._lock = None
        if error is not None:
            raise error

    def __enter__(self) -> LogStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _remove_tombstones(trash: Path) -> None:
    """Remove what deleted topics left in ``trash`` (a crash between the
    rename and the removal); best effort (another worker may be at it too)."""
    with contextlib.suppress(OSError), os.scandir(trash) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)


def start_new_log(directory: Path, topic: str, first_offset: int, now_ms: int | None) -> None:
    """Make ``directory`` a log of ``topic`` whose first record will be
    ``first_offset`` (its start mark there, as if everything before had been
    purged), unless it holds a log already. Raises :class:`OSError`."""
    if read_meta(directory, topic) is not None or (directory.exists() and list_terms(directory)):
        return
    create_topic_dir(directory, topic, now_ms)
    write_start(directory, first_offset)
    write_checkpoint(directory, first_offset - 1)
