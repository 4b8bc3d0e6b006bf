"""Test-wide fixtures: every test runs with loan-leak detection on, and fails
if the garbage collector had to repay a loan that the code under test lost."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
from hypothesis import settings

import accounts

accounts.set_leak_detection(True)

# Property tests check behaviour, not speed: no per-example deadline (the
# default 200 ms fails on a loaded or slower machine).
settings.register_profile("broker", deadline=None)
settings.load_profile("broker")


@pytest.fixture(autouse=True)
def _no_leaked_loans() -> Iterator[None]:
    before = accounts.leaked_loans()
    yield
    gc.collect()
    leaked = accounts.leaked_loans() - before
    assert leaked == 0, f"{leaked} loan(s) were garbage-collected without being repaid"
