"""Settle's rules, in one place for the decoder (a peer's Settle) and the
client (its own, before sending), and the helpers that make its ranges.

A Settle names deliveries of a group subscription by their delivery
numbers as ``(first, count)`` pairs: ``first >= 1``, ``count >= 1``,
``first + count - 1`` a uint, each pair starting past the end of the one
before it. Its ``detail`` goes with its outcome: a uint delay in ms for
RETRY, a reason of at most :data:`MAX_SETTLE_REASON` bytes of UTF-8 for
REJECT, null for DONE and IN_PROGRESS.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .._types import U64_MAX, SettleOutcome

#: Longest reason of a REJECT Settle, in bytes of UTF-8.
MAX_SETTLE_REASON = 1024
#: The most a Settle's body takes besides its ranges' pairs: array head (1),
#: type (2), subscription (9), outcome (1), the ranges' array head (at most
#: 5), and the longest detail (a reason: a 3-byte head and 1024 bytes).
_SETTLE_FIXED = 1 + 2 + 9 + 1 + 5 + 3 + MAX_SETTLE_REASON
#: A range at its longest: two 9-byte uints.
_RANGE_MOST = 18


def _shown(value: object) -> str:
    """A short description of a value, cheap whatever its size."""
    if type(value) is int:
        return str(value) if value.bit_length() <= 64 else f"a {value.bit_length()}-bit integer"
    return f"a {type(value).__name__}"


def _is_u64(value: object) -> bool:
    return type(value) is int and 0 <= value <= U64_MAX


def outcome_problem(outcome: object) -> str | None:
    """What is wrong with a Settle outcome (0 to 3), or None."""
    if type(outcome) is SettleOutcome or (type(outcome) is int and 0 <= outcome <= 3):
        return None
    return f"a Settle outcome is 0 (done) to 3 (in_progress), not {_shown(outcome)}"


def ranges_problem(pairs: Sequence[tuple[object, object]]) -> str | None:
    """What is wrong with a Settle's ``(first, count)`` pairs, or None."""
    if not pairs:
        return "a Settle names at least one range of deliveries"
    end = 1  # the first delivery number the next range may start at
    for first, count in pairs:
        if not _is_u64(first) or not _is_u64(count):
            return (
                "a Settle range is two unsigned 64-bit integers, "
                f"not ({_shown(first)}, {_shown(count)})"
            )
        assert isinstance(first, int) and isinstance(count, int)
        if first < 1 or count < 1:
            return f"a Settle range has first >= 1 and count >= 1, not ({first}, {count})"
        if first + count - 1 > U64_MAX:
            return f"a Settle range's last delivery must be a u64: ({first}, {count})"
        if first < end:
            return (
                f"Settle ranges ascend without overlapping: ({first}, {count}) "
                f"starts before {end}, the end of the range before it"
            )
        end = first + count
    return None


def detail_problem(outcome: int, detail: object) -> str | None:
    """What is wrong with a Settle's ``detail`` for its (valid) ``outcome``, or None."""
    if outcome == SettleOutcome.RETRY:
        if _is_u64(detail):
            return None
        return f"a retry Settle's detail is its delay in ms, a uint, not {_shown(detail)}"
    if outcome == SettleOutcome.REJECT:
        if type(detail) is not str:
            return f"a reject Settle's detail is its reason, a text, not {_shown(detail)}"
        try:
            size = len(detail.encode("utf-8"))
        except UnicodeEncodeError:
            return "a reject Settle's reason must be valid UTF-8"
        if size > MAX_SETTLE_REASON:
            return (
                f"a reject Settle's reason is at most {MAX_SETTLE_REASON} bytes of UTF-8, "
                f"not {size}"
            )
        return None
    if detail is None:
        return None
    name = SettleOutcome(outcome).name.lower()
    return f"a {name} Settle's detail is null, not {_shown(detail)}"


def settle_problem(outcome: object, ranges: object, detail: object) -> str | None:
    """What is wrong with a Settle of these fields as a client would send
    it (``ranges`` a list or tuple of ``(first, count)`` pairs), in one
    line, or None if the broker takes it."""
    problem = outcome_problem(outcome)
    if problem is not None:
        return problem
    if type(ranges) not in (list, tuple):
        return f"Settle ranges are a list of (first, count) pairs, not {_shown(ranges)}"
    pairs: list[tuple[object, object]] = []
    for pair in ranges:  # type: ignore[attr-defined]
        if type(pair) not in (list, tuple) or len(pair) != 2:
            return f"a Settle range is a (first, count) pair, not {_shown(pair)}"
        pairs.append((pair[0], pair[1]))
    assert isinstance(outcome, int)
    return ranges_problem(pairs) or detail_problem(outcome, detail)


def settle_ranges(seqs: Iterable[int]) -> list[tuple[int, int]]:
    """The delivery numbers ``seqs`` (in any order; a repeat counts once)
    as the ascending ``(first, count)`` pairs of a Settle: runs of
    consecutive numbers become one pair. Raises :class:`ValueError` for a
    number that is not 1 to 2^64-1."""
    pairs: list[tuple[int, int]] = []
    first = end = 0
    for seq in sorted(set(seqs)):
        if type(seq) is not int or not 1 <= seq <= U64_MAX:
            raise ValueError(f"a delivery number is 1 to 2^64-1, not {_shown(seq)}")
        if seq == end:
            end += 1
            continue
        if end:
            pairs.append((first, end - first))
        first, end = seq, seq + 1
    if end:
        pairs.append((first, end - first))
    return pairs


def max_settle_ranges(max_frame: int) -> int:
    """How many ranges a Settle may carry, whatever its uints and detail,
    in a frame body of at most ``max_frame`` bytes (every uint counted at
    9 bytes, the detail as the longest reason); 0 if not even one."""
    return max(0, (max_frame - _SETTLE_FIXED) // _RANGE_MOST)
