"""Fixtures of the command-line tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .helpers import Served, serving


@pytest.fixture
def served() -> Iterator[Served]:
    """A running ``broker serve`` (stopped, and checked to stop cleanly, after the test)."""
    with serving() as broker:
        yield broker
