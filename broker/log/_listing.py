"""Listing the stored topics cheaply, without opening (locking, recovering)
their logs: from directory listings, the sizes and times the file system
keeps, and the small mark files. See ``docs/topic-log.md``, "Listing topics
without opening them"."""

from __future__ import annotations

import json
import os
import re
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ._files import INDEX_SUFFIX, META, TERM_NAME, topic_dir_name, topics_dir
from ._marks import CHECKPOINT, CHECKPOINT_MAGIC, GAPS, START, START_MAGIC, read_mark

__all__ = ["StoredTopic", "list_stored_topics"]

#: A directory name that is a topic name as it is (nothing percent-encoded).
_PLAIN = re.compile(r"[A-Za-z0-9_-]+")
_INDEX_LENGTH = 20 + len(INDEX_SUFFIX)


@dataclass(frozen=True, slots=True)
class StoredTopic:
    """A topic's log as its files say, read without opening it.

    ``first``: the first offset kept (the first term's base, or the start
    mark of a purge beyond it). ``end``: the next offset as of the log's
    last flush (its checkpoint + 1, at least ``first``): exact after a clean
    stop; a log open meanwhile may be further on. ``bytes``: the size of its
    term, index and mark files. ``terms``: how many term files it has.
    ``last_append_ms``: the modification time of its newest term file, ms
    since the epoch (``None``: no term file).
    """

    name: str
    first: int
    end: int
    bytes: int
    terms: int
    last_append_ms: int | None


def list_stored_topics(
    data_dir: Path, match: Callable[[str], bool] | None = None
) -> list[StoredTopic]:
    """The topics with a log under ``data_dir`` (those
    :func:`stored_topics` names), sorted by name; only those whose name
    ``match`` accepts (asked before anything else of the topic is read).

    Read only and lock free: safe in a worker thread and beside the logs'
    writers (a log appended to, purged or deleted meanwhile reads as of
    some moment, or is left out if its directory is gone). Reads the
    ``topics/`` listing, each topic directory's listing with the sizes and
    times of its files, its ``checkpoint`` and ``start`` marks, and its
    ``meta.json`` only when the directory's name is a shortened one.
    Raises :class:`OSError` if a directory cannot be read for another
    reason than being gone.
    """
    try:
        top = os.scandir(topics_dir(data_dir))
    except FileNotFoundError:
        return []
    found: list[StoredTopic] = []
    with top:
        for entry in top:
            dir_name = entry.name
            if dir_name.startswith(".") or not entry.is_dir(follow_symlinks=False):
                continue
            name = _topic_of(dir_name)
            if name is not None and match is not None and not match(name):
                continue
            try:
                stored = _read_topic(entry.path, name, match)
            except (FileNotFoundError, NotADirectoryError):
                continue  # (deleted meanwhile)
            if stored is not None:
                found.append(stored)
    found.sort(key=_name)
    return found


def read_stored_topic(data_dir: Path, name: str) -> StoredTopic | None:
    """What :func:`list_stored_topics` says of topic ``name`` alone, reading
    only its own directory (None: it has no log there)."""
    path = topics_dir(data_dir) / topic_dir_name(name)
    try:
        stored = _read_topic(str(path), name, lambda found: found == name)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return stored if stored is not None and stored.name == name else None


def _name(topic: StoredTopic) -> str:
    return topic.name


def _topic_of(dir_name: str) -> str | None:
    """The topic the directory name encodes (None: shortened, or not one
    :func:`topic_dir_name` gives)."""
    if _PLAIN.fullmatch(dir_name):
        return dir_name
    if "~" in dir_name:
        return None
    try:
        topic = urllib.parse.unquote_to_bytes(dir_name).decode("utf-8")
    except UnicodeDecodeError:
        return None
    return topic if topic_dir_name(topic) == dir_name else None


def _read_topic(
    path: str, name: str | None, match: Callable[[str], bool] | None
) -> StoredTopic | None:
    """What the directory ``path`` of topic ``name`` (None: named only by its
    meta.json) holds; None if it is no topic's (no metadata, no term) or
    ``match`` refuses the name found in its metadata."""
    terms: list[tuple[str, os.DirEntry[str]]] = []
    size = 0
    has_meta = has_checkpoint = has_start = False
    with os.scandir(path) as listing:
        for entry in listing:
            file_name = entry.name
            if TERM_NAME.match(file_name):
                terms.append((file_name, entry))
            elif file_name == CHECKPOINT:
                has_checkpoint = True
            elif file_name == META:
                has_meta = True
            elif file_name == START:
                has_start = True
            elif file_name == GAPS or (
                len(file_name) == _INDEX_LENGTH and file_name.endswith(INDEX_SUFFIX)
            ):
                size += _size(entry)
    if name is None:
        if not has_meta:
            return None
        name = _meta_topic(f"{path}/{META}")
        if name is None or (match is not None and not match(name)):
            return None
    elif not has_meta and not terms:
        return None
    checkpoint = start = 0
    if has_checkpoint:
        checkpoint, length = read_mark(f"{path}/{CHECKPOINT}", CHECKPOINT_MAGIC)
        size += length
    if has_start:
        start, length = read_mark(f"{path}/{START}", START_MAGIC)
        size += length
    last_ms: int | None = None
    if terms:
        terms.sort()
        first = max(int(terms[0][0][:20]), start)
        newest = True
        for _, entry in reversed(terms):
            try:
                stat = entry.stat()
            except FileNotFoundError:
                continue  # (deleted by retention meanwhile)
            size += stat.st_size
            if newest:
                last_ms = stat.st_mtime_ns // 1_000_000
                newest = False
    else:
        first = max(1, start, checkpoint + 1)
    return StoredTopic(name, first, max(first, checkpoint + 1), size, len(terms), last_ms)


def _size(entry: os.DirEntry[str]) -> int:
    try:
        return entry.stat().st_size
    except FileNotFoundError:
        return 0


def _meta_topic(path: str) -> str | None:
    """The topic named by the metadata file at ``path`` (None: unreadable)."""
    try:
        with open(path, "rb") as file:
            topic = json.loads(file.read()).get("topic")
    except (OSError, ValueError, AttributeError):
        return None
    return topic if isinstance(topic, str) else None
