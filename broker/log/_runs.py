"""A run of records as one message, sans-IO: how a replicated topic sends
consecutive records to its storage engine and reads them back.

The body of a run is the records as a term file holds them (see
``_format``: a 24-byte header with checksum, length, offset and receive
time, then the record's bytes, back to back), so it is encoded once, checked
by the same checksums when it comes back, and carries each record's offset
and time with it.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from ._errors import LogError
from ._format import HEADER_SIZE, scan, write_records

__all__ = ["DecodedRun", "RunDamaged", "decode_run", "encode_run"]


class RunDamaged(LogError):
    """A run's body does not hold the records it says it does (a checksum,
    an offset or a length is wrong): it is set aside, never delivered."""


@dataclass(frozen=True, slots=True)
class DecodedRun:
    """The records of a run: consecutive offsets from ``first_offset``, each
    with its bytes and its receive time (ms since the epoch)."""

    first_offset: int
    tails: list[memoryview]
    times: list[int]

    @property
    def next_offset(self) -> int:
        """The offset after its last record."""
        return self.first_offset + len(self.tails)


def encode_run(
    first_offset: int, tails: Sequence[bytes | memoryview], times: Sequence[int]
) -> bytes:
    """The body of a run of ``tails`` from ``first_offset``, received at
    ``times`` (one per record, never decreasing)."""
    if len(tails) != len(times):
        raise ValueError(f"{len(tails)} records with {len(times)} times")
    body = bytearray(sum(map(len, tails)) + HEADER_SIZE * len(tails))
    view = memoryview(body)
    ends = array("I", [0])
    done = 0
    while done < len(tails):
        # Records of one time go in one call (a run spans few appends).
        time_ms = times[done]
        same = done + 1
        while same < len(tails) and times[same] == time_ms:
            same += 1
        done += write_records(view, len(body), tails[done:same], first_offset + done, time_ms, ends)
    view.release()
    return bytes(body)


def decode_run(body: bytes | memoryview, first_offset: int, count: int) -> DecodedRun:
    """The ``count`` records from ``first_offset`` that ``body`` holds;
    raises :class:`RunDamaged` unless it holds exactly those, intact."""
    view = memoryview(body)
    found = scan(view, len(view), first_offset)
    if found.count != count or found.cut:
        raise RunDamaged(
            f"a run said to hold offsets {first_offset}-{first_offset + count - 1} "
            f"holds {found.count} intact records and {found.cut} bytes of damage"
        )
    positions = found.positions
    tails = [view[positions[i] + HEADER_SIZE : positions[i + 1]] for i in range(count)]
    times = [
        int.from_bytes(view[positions[i] + 16 : positions[i] + 24], "little") for i in range(count)
    ]
    return DecodedRun(first_offset, tails, times)
