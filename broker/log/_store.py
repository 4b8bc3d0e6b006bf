"""LogStore: a broker's data directory of topic logs, locked while open."""

from __future__ import annotations

import shutil
from pathlib import Path

from ..protocol import check_topic_name
from ._errors import LogClosed
from ._files import DirLock, fsync_dir, stored_topics, topic_dir_name, topics_dir
from ._log import TopicLog
from ._types import LogConfig

__all__ = ["LogStore"]


class LogStore:
    """The topic logs under one data directory.

    Opening takes an exclusive ``flock`` on ``<data_dir>/.lock`` (raising
    :class:`DataDirLocked` with a one-line message if another process, or
    another store in this one, has it); :meth:`close` closes every log and
    releases it.
    """

    def __init__(self, data_dir: Path | str, config: LogConfig | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.config = config or LogConfig()
        self._lock: DirLock | None = DirLock(self.data_dir)
        self._logs: dict[str, TopicLog] = {}

    def topic(
        self, name: str, config: LogConfig | None = None, now_ms: int | None = None
    ) -> TopicLog:
        """The log of topic ``name``, opened (and recovered, or created) on
        first use; ``config`` (default: the store's) applies from the first
        use. Raises :class:`TopicNameError` for an invalid name."""
        if self._lock is None:
            raise LogClosed(f"the log store of {self.data_dir} is closed")
        log = self._logs.get(name)
        if log is None:
            check_topic_name(name)
            directory = topics_dir(self.data_dir) / topic_dir_name(name)
            log = TopicLog.open(directory, name, config or self.config, now_ms)
            self._logs[name] = log
        return log

    def open_logs(self) -> dict[str, TopicLog]:
        """The logs opened so far, by topic."""
        return dict(self._logs)

    def stored_topics(self) -> list[str]:
        """The topics that have a log in the data directory (opened or not)."""
        return stored_topics(self.data_dir)

    def delete_topic(self, name: str) -> bool:
        """Close the log of ``name`` (if open) and delete its directory;
        returns whether there was one. Slices already read stay valid."""
        if self._lock is None:
            raise LogClosed(f"the log store of {self.data_dir} is closed")
        log = self._logs.pop(name, None)
        if log is not None:
            log.close()
        directory = topics_dir(self.data_dir) / topic_dir_name(name)
        if not directory.exists():
            return False
        shutil.rmtree(directory)
        fsync_dir(directory.parent)
        return True

    def close(self) -> None:
        """Close every log (flushing it) and release the lock; idempotent.
        Every log is closed even if one fails to flush (the first error is raised)."""
        if self._lock is None:
            return
        error: BaseException | None = None
        for log in self._logs.values():
            try:
                log.close()
            except Exception as exc:
                error = error or exc
        self._logs.clear()
        self._lock.release()
        self._lock = None
        if error is not None:
            raise error

    def __enter__(self) -> LogStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
