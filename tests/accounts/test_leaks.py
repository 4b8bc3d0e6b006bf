"""Leak detection: a loan lost without repayment is repaid by the collector,
counted, and reported in debug mode."""

from __future__ import annotations

import gc

import pytest

import accounts
from accounts import Account, LoanedItem, LoanLeakWarning


def make_and_lose_a_loan(a: Account) -> None:
    LoanedItem(a, 10, "lost")  # never repaid, never kept


def test_debug_mode_reports_a_leaked_loan_with_its_origin() -> None:
    assert accounts.leak_detection_enabled()  # conftest turns it on for every test
    a = Account("leaky", high_watermark=5, low_watermark=0, event_cost=0)
    before = accounts.leaked_loans()
    with pytest.warns(LoanLeakWarning, match="make_and_lose_a_loan") as record:
        make_and_lose_a_loan(a)
        gc.collect()
    assert "leaky" in str(record[0].message)
    # The collector repaid it, so the account is usable again...
    assert a.debt == 0
    assert not a.blocked
    # ...and the leak is counted. Undo the count so the autouse check passes.
    assert accounts.leaked_loans() == before + 1
    accounts._loan._leaked -= 1


def test_without_debug_mode_a_leak_is_repaid_silently_but_counted(
    recwarn: pytest.WarningsRecorder,
) -> None:
    a = Account("quiet", high_watermark=5, low_watermark=0, event_cost=0)
    before = accounts.leaked_loans()
    accounts.set_leak_detection(False)
    try:
        make_and_lose_a_loan(a)
        gc.collect()
    finally:
        accounts.set_leak_detection(True)
    assert not [w for w in recwarn if issubclass(w.category, LoanLeakWarning)]
    assert a.debt == 0
    assert accounts.leaked_loans() == before + 1
    accounts._loan._leaked -= 1


def test_repaid_loans_are_not_reported(recwarn: pytest.WarningsRecorder) -> None:
    a = Account("tidy", high_watermark=5, low_watermark=0, event_cost=0)
    before = accounts.leaked_loans()
    for _ in range(100):
        with LoanedItem(a, 1, None):
            pass
    gc.collect()
    assert accounts.leaked_loans() == before
    assert not recwarn.list
