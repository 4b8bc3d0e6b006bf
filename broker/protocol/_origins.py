"""Where forwarded publishes first came from: the origin runs of a
worker link's ``PublishMany`` (sans-IO).

A worker that forwards its clients' publishes to a topic's owner says, per
run of consecutive entries of a ``PublishMany``, whose they are: the
client's session id, its topic handle and the index (from 1) of the run's
first publish on that handle, counted over the session's life. The owner
keeps, per topic and per (session, handle), the highest index it took, and
stores no publish twice: a client whose forwarding worker died resends
what it has not seen confirmed, under the same indices, and the owner
confirms those it already has without storing them again.

On the wire the runs are one optional last element of the ``PublishMany``
array, after the entries: ``[[session, handle, first, count], ...]``, with
the counts adding up to the number of entries. A run with an empty session
id names no origin (nothing to deduplicate). Only a worker's link may send
them; a client that does is told so and closed.
"""

from __future__ import annotations

from typing import Any

from ._errors import RemoteProtocolError
from ._types import U64_MAX

__all__ = [
    "MAX_SESSION_ID",
    "OriginRun",
    "add_runs",
    "check_origins",
    "origins_size_bound",
    "slice_origins",
]

#: A run of publishes of one origin: (session id, topic handle, index of
#: its first publish on that handle, how many).
OriginRun = tuple[bytes, int, int, int]

#: The longest session id a run may name.
MAX_SESSION_ID = 64
#: The most bytes one encoded run can take: its array head, the session id
#: (with a head of up to 2 bytes) and three u64 (9 bytes each at most).
_RUN_MAX = 1 + 2 + MAX_SESSION_ID + 3 * 9


def _bad(what: str) -> RemoteProtocolError:
    return RemoteProtocolError(f"malformed frame: {what}")


def check_origins(value: Any, count: int) -> list[OriginRun]:
    """The origin runs in the decoded CBOR ``value`` of a ``PublishMany`` of
    ``count`` entries; :class:`RemoteProtocolError` unless they are runs of
    the right types whose counts add up to ``count``."""
    if type(value) is not list or not value:
        raise _bad("a PublishMany's origins must be a non-empty array of runs")
    runs: list[OriginRun] = []
    total = 0
    for run in value:
        if type(run) is not list or len(run) != 4:
            raise _bad("an origin run is [session, handle, first, count]")
        session, handle, first, size = run
        if type(session) is not bytes or len(session) > MAX_SESSION_ID:
            raise _bad(f"an origin's session is a byte string of at most {MAX_SESSION_ID} bytes")
        for number in (handle, first, size):
            if type(number) is not int or not 0 <= number <= U64_MAX:
                raise _bad("an origin's handle, first and count are unsigned 64-bit integers")
        if first < 1 or size < 1:
            raise _bad("an origin run starts at index 1 or later and holds one publish or more")
        total += size
        runs.append((session, handle, first, size))
    if total != count:
        raise _bad(f"the origin runs cover {total} publishes of a PublishMany of {count}")
    return runs


def origins_size_bound(runs: int) -> int:
    """The most bytes the encoding of ``runs`` runs can take."""
    return 3 + _RUN_MAX * runs


def add_runs(runs: list[OriginRun], more: list[OriginRun]) -> None:
    """Append ``more`` to ``runs``; a run that continues the one before it
    (the same session and handle, the next index) joins it."""
    for run in more:
        if runs:
            session, handle, first, count = runs[-1]
            if run[0] == session and run[1] == handle and run[2] == first + count:
                runs[-1] = (session, handle, first, count + run[3])
                continue
        runs.append(run)


def slice_origins(runs: list[OriginRun], start: int, stop: int) -> list[OriginRun]:
    """The runs of the publishes from ``start`` to ``stop`` (positions in
    the sequence ``runs`` describes, as a slice)."""
    out: list[OriginRun] = []
    pos = 0
    for session, handle, first, size in runs:
        lo = max(start, pos)
        hi = min(stop, pos + size)
        if lo < hi:
            out.append((session, handle, first + lo - pos, hi - lo))
        pos += size
        if pos >= stop:
            break
    return out
