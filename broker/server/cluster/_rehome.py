"""Durable cursors and sessions follow their homes when the number of
workers changes.

A process keeps its state in its own journal: ``<data_dir>/state.journal``
for a single broker process, ``<data_dir>/workers/<id>/state.journal`` for
worker ``<id>``. A durable cursor belongs with its topic's owner, a
session with its home worker (the first byte of its id, modulo the number
of workers; see ``_handover.home_of``). Changing ``--workers`` moves both;
:func:`rehome_state`, run before any worker starts (the caller holds the
data directory's lock), moves each record to its new home, so a cursor
goes on from its position, and a client resumes its session, instead of
starting again.

Crash-safe by order: every destination journal is fsynced before any
source forgets a record; a crash between the two leaves a record in both,
and the next run keeps the larger position or count (both only grow) and
the session record already at its home.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from broker.log import JOURNAL_NAME, WORKERS, DirLock, StateJournal

from ..sessions._records import COUNTS, SESSIONS
from ..topics._log_subscription import CURSORS, cursor_topic
from ._handover import SESSION_ID_BYTES

__all__ = ["rehome_state"]

log = logging.getLogger("broker.server")

#: The journal of the single broker process (a worker's is named by its id).
Home = str | None


def _homes_with_journals(data_dir: Path) -> list[Home]:
    """Every journal under ``data_dir``: the single process's, then each worker's."""
    homes: list[Home] = [None] if (data_dir / JOURNAL_NAME).exists() else []
    workers = data_dir / WORKERS
    if workers.is_dir():
        homes += sorted(p.name for p in workers.iterdir() if (p / JOURNAL_NAME).exists())
    return homes


def _session_of(key: str) -> bytes | None:
    """The session id a session record or count key (hex id first) names."""
    try:
        sid = bytes.fromhex(key.partition("/")[0])
    except ValueError:
        return None
    return sid if len(sid) == SESSION_ID_BYTES else None


def rehome_state(
    data_dir: Path,
    topic_home: Callable[[str], Home],
    session_home: Callable[[bytes], Home],
    opened: tuple[Home, StateJournal] | None = None,
) -> int:
    """Move every durable cursor under ``data_dir`` to the journal of
    ``topic_home(topic)``, and every session's records to the journal of
    ``session_home(session id)`` (None: the single process's); return how
    many records moved.

    ``opened`` is a journal the caller has open already (used, not closed);
    every other is opened here, a worker's under its directory's lock (a
    :class:`~broker.log.DataDirLocked` if a worker still runs). A record in
    two journals keeps the larger position or count (a session's record:
    the one already at its home).
    """
    journals: dict[Home, StateJournal] = {}
    locks: list[DirLock] = []

    def journal(home: Home) -> StateJournal:
        found = journals.get(home)
        if found is None:
            if opened is not None and opened[0] == home:
                found = opened[1]
            else:
                where = data_dir
                if home is not None:  # (the caller holds the data directory's own lock)
                    where = data_dir / WORKERS / home
                    locks.append(DirLock(where, f"worker {home}'s directory {where}"))
                found = StateJournal(where / JOURNAL_NAME)
            journals[home] = found
        return found

    def home_of(space: str, key: str) -> tuple[bool, Home]:
        """Whether ``key`` names a cursor (a session) and its home."""
        if space == CURSORS:
            topic = cursor_topic(key)
            return (False, None) if topic is None else (True, topic_home(topic))
        sid = _session_of(key)
        return (False, None) if sid is None else (True, session_home(sid))

    def flush_all() -> None:
        for each in journals.values():
            if each.pending:
                each.flush()

    try:
        moved: list[tuple[StateJournal, str, str]] = []
        for home in _homes_with_journals(data_dir):
            source = journal(home)
            for space in (CURSORS, SESSIONS, COUNTS):
                for key, value in source.items(space):
                    known, target = home_of(space, key)
                    if not known or target == home:
                        continue
                    destination = journal(target)
                    held = destination.get(space, key)
                    if held is None or (type(held) is int and type(value) is int and held < value):
                        destination.put(space, key, value)
                    moved.append((source, space, key))
        if moved:
            flush_all()  # (every record at its new home first)
            for source, space, key in moved:
                source.delete(space, key)
            flush_all()
            log.info("moved %d records of cursors and sessions to their new homes", len(moved))
        return len(moved)
    finally:
        for home, each in journals.items():
            if opened is None or opened[0] != home:
                each.close()
        for lock in locks:
            lock.release()
