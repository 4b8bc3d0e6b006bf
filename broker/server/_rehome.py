"""Durable cursors follow their topics when the number of workers changes.

A durable cursor's position lives in the state journal of the process that
owns its topic: ``<data_dir>/state.journal`` for a single broker process,
``<data_dir>/workers/<id>/state.journal`` for worker ``<id>``. Changing
``--workers`` moves topics to other owners; :func:`rehome_cursors`, run
before any worker starts (the caller holds the data directory's lock),
moves each cursor to the journal of its topic's new owner, so a cursor goes
on from its position instead of from its subscription's start.

Crash-safe by order: every destination journal is fsynced before any
source forgets a cursor; a crash between the two leaves a cursor in both,
and the next run keeps the larger position (a cursor only moves forward).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from broker.log import JOURNAL_NAME, WORKERS, DirLock, StateJournal

__all__ = ["CURSORS", "rehome_cursors"]

#: The state journal's space of durable cursors (key: principal NUL topic NUL name).
CURSORS = "cursors"

log = logging.getLogger("broker.server")

#: The journal of the single broker process (a worker's is named by its id).
Home = str | None


def _topic_of(key: str) -> str | None:
    """The topic a cursor key (``principal NUL topic NUL name``) names."""
    parts = key.split("\x00")
    return parts[1] if len(parts) == 3 else None


def _homes_with_journals(data_dir: Path) -> list[Home]:
    """Every journal under ``data_dir``: the single process's, then each worker's."""
    homes: list[Home] = [None] if (data_dir / JOURNAL_NAME).exists() else []
    workers = data_dir / WORKERS
    if workers.is_dir():
        homes += sorted(p.name for p in workers.iterdir() if (p / JOURNAL_NAME).exists())
    return homes


def rehome_cursors(
    data_dir: Path,
    home_of: Callable[[str], Home],
    opened: tuple[Home, StateJournal] | None = None,
) -> int:
    """Move every durable cursor under ``data_dir`` to the journal of
    ``home_of(topic)`` (None: the single process's); return how many moved.

    ``opened`` is a journal the caller has open already (used, not closed);
    every other is opened here, a worker's under its directory's lock (a
    :class:`~broker.log.DataDirLocked` if a worker still runs). A cursor
    in two journals keeps the larger position.
    """
    space = CURSORS
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

    try:
        moved: list[tuple[StateJournal, str]] = []
        for home in _homes_with_journals(data_dir):
            source = journal(home)
            for key, position in source.items(space):
                topic = _topic_of(key)
                if type(position) is not int or topic is None or home_of(topic) == home:
                    continue
                destination = journal(home_of(topic))
                held = destination.get(space, key)
                if type(held) is not int or held < position:
                    destination.put(space, key, position)
                moved.append((source, key))
        if moved:
            for each in journals.values():
                if each.pending:
                    each.flush()
            for source, key in moved:
                source.delete(space, key)
            for each in journals.values():
                if each.pending:
                    each.flush()
            log.info("moved %d durable cursors to their topics' owners", len(moved))
        return len(moved)
    finally:
        for home, each in journals.items():
            if opened is None or opened[0] != home:
                each.close()
        for lock in locks:
            lock.release()
