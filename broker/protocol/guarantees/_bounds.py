"""Checks shared by both sides of the guarantee protocol: amounts fit the
wire's integers, and a new limit must tighten the one before it."""

from __future__ import annotations

from .._errors import LocalProtocolError
from .._types import U64_MAX, Channel


def tightened(
    channel: Channel, name: str, current: int | None, bound: int, error: type[Exception]
) -> int:
    """``bound`` if it is tighter than ``current`` (strictly: an equal bound
    would say nothing new), else ``error``."""
    if current is not None and bound >= current:
        raise error(f"{channel}: {name} {bound} does not tighten the remaining bound {current}")
    return bound


def check_amount(value: int, what: str) -> None:
    if not 0 <= value <= U64_MAX:
        raise LocalProtocolError(f"{what} must be between 0 and 2**64-1, got {value}")
