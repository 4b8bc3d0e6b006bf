"""Test-wide fixtures: every test runs with loan-leak detection on, and fails
if the garbage collector had to repay a loan that the code under test lost."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

import accounts

accounts.set_leak_detection(True)


@pytest.fixture(autouse=True)
def _no_leaked_loans() -> Iterator[None]:
    before = accounts.leaked_loans()
    yield
    gc.collect()
    leaked = accounts.leaked_loans() - before
    assert leaked == 0, f"{leaked} loan(s) were garbage-collected without being repaid"
