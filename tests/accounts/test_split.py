"""Splitting a loan: two loans repaid on their own, the debt unchanged."""

from __future__ import annotations

import pytest

from accounts import Account, AccountsError, LoanedItem


def _account(parent: Account | None = None) -> Account:
    return Account("a", high_watermark=100, low_watermark=50, event_cost=0, parent=parent)


def test_a_split_moves_part_of_the_debt_to_a_new_loan() -> None:
    root = Account("root", high_watermark=1000, low_watermark=0, event_cost=0)
    account = _account(root)
    loan = LoanedItem(account, 90, "whole")
    part = loan.split(30, "part")
    assert (loan.amount, part.amount, part.item, part.account) == (60, 30, "part", account)
    assert account.debt == root.debt == 90
    assert account.statistics().loans == root.statistics().loans == 2
    part.repay()
    assert account.debt == root.debt == 60
    loan.repay()
    assert account.debt == root.debt == 0
    assert account.statistics().loans == 0


def test_a_split_leaves_the_blocked_phase_alone() -> None:
    """Repaying and borrowing again would dip the debt to the low watermark
    and unblock the account; a split does not."""
    account = _account()
    loan = LoanedItem(account, 120, None)
    assert account.blocked
    part = loan.split(80, None)
    assert account.blocked
    part.repay()  # 40 left: at or below the low watermark
    assert not account.blocked
    loan.repay()


def test_only_an_outstanding_loan_splits_and_only_what_it_holds() -> None:
    account = _account()
    loan = LoanedItem(account, 10, None)
    with pytest.raises(AccountsError):
        loan.split(11, None)
    with pytest.raises(AccountsError):
        loan.split(-1, None)
    loan.repay()
    with pytest.raises(AccountsError):
        loan.split(0, None)
