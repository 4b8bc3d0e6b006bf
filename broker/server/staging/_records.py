"""How the staging area keeps its state in the state journal: the spaces,
their keys and the records' checks (a malformed record is dropped, never
a crash: the journal is storage that can be damaged)."""

from __future__ import annotations

import hashlib
import json

#: ``(principal, batch)``: batches of different principals never mix.
BatchKey = tuple[str | None, str]
#: ``(first offset, count)``: offsets a log's recovery found missing.
Gap = tuple[int, int]

#: Journal spaces. ``staged``: key a 20-digit serial (staging order), value
#: ``[owner, batch, member, topic, key, tail, cost]``, then, for a publish of
#: a client session, its origin: ``session, handle, index`` (its index on
#: its topic handle, so that a restart knows it has it: :func:`origin_of`).
#: ``committed``: key the batch key as JSON, value a serial (commit order). ``committing``: the same
#: keys, value the members the commit lists (``[[member, count], ...]``),
#: put before its publishes are routed (a commit under way, completed at
#: start-up if a stop cut it off). ``progress``: key ``[owner, batch,
#: topic]`` as JSON, value ``[index, offset, count]``: the batch's
#: publishes to ``topic`` from its ``index``-th (``count`` of them) go to
#: the topic's log from ``offset`` on (put before they are appended).
SPACE_STAGED = "staging.staged"
SPACE_COMMITTED = "staging.committed"
SPACE_COMMITTING = "staging.committing"
SPACE_PROGRESS = "staging.progress"

#: A commit's members with their counts, in the order listed.
Members = list[tuple[str, int]]
#: Where a commit's publishes to one topic go: ``(index, offset, count)``.
Progress = tuple[int, int, int]
_Staged = tuple[str | None, str, str, str, bytes | None, bytes, int]


def batch_id(batch_key: BatchKey) -> str:
    """A batch key as a journal key (JSON: the principal may be None)."""
    return json.dumps(list(batch_key), ensure_ascii=False, separators=(",", ":"))


def progress_id(batch_key: BatchKey, topic: str) -> str:
    """The journal key of a batch's progress into ``topic``."""
    return json.dumps([*batch_key, topic], ensure_ascii=False, separators=(",", ":"))


def parse_batch_id(key: str) -> BatchKey | None:
    try:
        owner, batch = json.loads(key)
    except ValueError:
        return None
    if (owner is None or isinstance(owner, str)) and isinstance(batch, str):
        return (owner, batch)
    return None


def parse_progress(key: str, value: object) -> tuple[BatchKey, str, Progress] | None:
    """A progress record's batch, topic and place, checked; None if malformed."""
    try:
        owner, batch, topic = json.loads(key)
    except ValueError:
        return None
    if not (
        (owner is None or isinstance(owner, str))
        and isinstance(batch, str)
        and isinstance(topic, str)
        and isinstance(value, list)
        and len(value) == 3
        and all(type(n) is int and n >= 0 for n in value)
    ):
        return None
    index, offset, count = value
    return (owner, batch), topic, (index, offset, count)


def parse_members(value: object) -> Members | None:
    """A commit record's members, checked; None if malformed (or a record of
    a broker before this one: ``True``, without them)."""
    if not isinstance(value, list):
        return None
    members: Members = []
    for item in value:
        if not (
            isinstance(item, list)
            and len(item) == 2
            and isinstance(item[0], str)
            and type(item[1]) is int
            and item[1] >= 0
        ):
            return None
        members.append((item[0], item[1]))
    return members


def parse_staged(record: object) -> _Staged | None:
    """A staged publish's journal record, checked; None if malformed."""
    if not isinstance(record, list) or len(record) not in (7, 10):
        return None
    owner, batch, member, topic, key, tail, cost = record[:7]
    if (
        (owner is None or isinstance(owner, str))
        and isinstance(batch, str)
        and isinstance(member, str)
        and isinstance(topic, str)
        and (key is None or isinstance(key, bytes))
        and isinstance(tail, bytes)
        and isinstance(cost, int)
        and cost >= 0
    ):
        return owner, batch, member, topic, key, tail, cost
    return None


#: A staged publish's origin: (session id, topic handle, index on the handle).
Origin = tuple[bytes, int, int]


def origin_of(record: object) -> Origin | None:
    """The origin a (checked) staged publish record names, if any."""
    if isinstance(record, list) and len(record) == 10:
        session, handle, index = record[7:]
        if isinstance(session, bytes) and type(handle) is int and type(index) is int:
            return session, handle, index
    return None


def commit_origin(batch: BatchKey) -> bytes:
    """The origin the publishes of committed ``batch`` are routed as, in
    cluster mode (16 bytes, as a session id: no session has it)."""
    principal, name = batch
    digest = hashlib.sha256(b"commit\0%s\0%s" % ((principal or "").encode(), name.encode()))
    return digest.digest()[:16]
