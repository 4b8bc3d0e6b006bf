"""Accounts: debt, roll-up, watermarks with hysteresis, waiting, statistics."""

from __future__ import annotations

import math

import pytest
import trio
import trio.testing

from accounts import (
    DEFAULT_EVENT_COST,
    Account,
    AccountsError,
    LoanedItem,
    live_accounts,
    unlimited,
)


def account(name: str = "a", high: float = 10, low: float = 5, **kw: object) -> Account:
    return Account(name, high_watermark=high, low_watermark=low, event_cost=0, **kw)  # type: ignore[arg-type]


def test_loan_charges_cost_plus_event_constant() -> None:
    a = Account("a", high_watermark=1e9, low_watermark=0)
    assert a.event_cost == DEFAULT_EVENT_COST
    loan = LoanedItem(a, 100, "x")
    assert loan.amount == 100 + DEFAULT_EVENT_COST
    assert a.debt == 100 + DEFAULT_EVENT_COST
    loan.repay()
    assert a.debt == 0


def test_child_inherits_event_cost_unless_given() -> None:
    root = Account("root", high_watermark=100, low_watermark=0, event_cost=7)
    assert Account("c", high_watermark=1, low_watermark=0, parent=root).event_cost == 7
    assert (
        Account("d", high_watermark=1, low_watermark=0, parent=root, event_cost=3).event_cost == 3
    )


def test_repay_is_idempotent() -> None:
    a = account()
    loan = LoanedItem(a, 4, None)
    loan.repay()
    loan.repay()
    assert a.debt == 0
    assert a.statistics().repaid_total == 4
    assert loan.repaid


def test_context_manager_repays_on_error() -> None:
    a = account()
    with pytest.raises(RuntimeError), LoanedItem(a, 3, "x") as loan:
        assert a.debt == 3
        raise RuntimeError
    assert loan.repaid
    assert a.debt == 0


def test_debt_rolls_up_to_every_ancestor() -> None:
    root = account("root", high=100, low=50)
    mid = account("mid", parent=root)
    leaf = account("leaf", parent=mid)
    other = account("other", parent=root)
    loans = [LoanedItem(leaf, 3, 0), LoanedItem(other, 4, 1), LoanedItem(mid, 2, 2)]
    assert (leaf.debt, other.debt, mid.debt, root.debt) == (3, 4, 5, 9)
    assert list(leaf.ancestors()) == [mid, root]
    for loan in loans:
        loan.repay()
    assert (leaf.debt, other.debt, mid.debt, root.debt) == (0, 0, 0, 0)


def test_statistics_track_totals_peak_and_loans() -> None:
    a = account(high=10, low=5)
    first = LoanedItem(a, 6, None)
    second = LoanedItem(a, 6, None)
    stats = a.statistics()
    assert (stats.debt, stats.peak_debt, stats.loans, stats.blocked) == (12, 12, 2, True)
    first.repay()
    second.repay()
    LoanedItem(a, 1, None).repay()
    stats = a.statistics()
    assert stats.borrowed_total == 13
    assert stats.repaid_total == 13
    assert stats.peak_debt == 12
    assert stats.loans == 0
    assert stats.debt == 0
    assert not stats.blocked


@pytest.mark.parametrize(
    ("high", "low", "event_cost"),
    [(5, 6, 0), (5, -1, 0), (5, 1, -1)],
)
def test_inconsistent_settings_are_refused(high: float, low: float, event_cost: int) -> None:
    with pytest.raises(AccountsError):
        Account("bad", high_watermark=high, low_watermark=low, event_cost=event_cost)


def test_negative_cost_is_refused_without_charging() -> None:
    a = account()
    with pytest.raises(AccountsError):
        LoanedItem(a, -1, None)
    assert a.debt == 0
    assert a.statistics().loans == 0


def test_hysteresis_blocks_above_high_and_clears_at_low() -> None:
    a = account(high=10, low=5)
    loans = [LoanedItem(a, 1, i) for i in range(10)]
    assert not a.blocked  # at the high watermark, not above it
    loans.append(LoanedItem(a, 1, 10))
    assert a.blocked
    # Between the watermarks the account stays blocked on the way down...
    for loan in loans[:5]:
        loan.repay()
    assert a.debt == 6
    assert a.blocked
    # ...and clears only at the low watermark.
    loans[5].repay()
    assert a.debt == 5
    assert not a.blocked
    # Rising again between the watermarks does not block (no flapping).
    more = [LoanedItem(a, 1, None) for _ in range(5)]
    assert a.debt == 10
    assert not a.blocked
    for loan in loans[6:] + more:
        loan.repay()


def test_unlimited_account_never_blocks() -> None:
    a = unlimited("meter")
    loan = LoanedItem(a, 10**12, None)
    assert a.is_clear()
    assert a.high_watermark == math.inf
    loan.repay()


def test_nowait_raises_wouldblock_when_an_ancestor_is_blocked() -> None:
    root = account("root", high=3, low=1)
    child = account("child", high=100, low=50, parent=root)
    child.ensure_clear_funds_nowait()
    loan = LoanedItem(child, 4, None)
    assert not child.blocked
    assert root.blocked
    assert not child.is_clear()
    with pytest.raises(trio.WouldBlock):
        child.ensure_clear_funds_nowait()
    loan.repay()
    child.ensure_clear_funds_nowait()


def test_registry_lists_live_accounts_until_closed() -> None:
    a = account("registered")
    assert a in live_accounts()
    a.close()
    a.close()
    assert a.closed
    assert a not in live_accounts()
    # A closed account still takes loans and repayments (events in flight).
    LoanedItem(a, 1, None).repay()
    assert a.debt == 0


# -- ensure_clear_funds ----------------------------------------------------


async def test_clear_account_returns_but_is_a_checkpoint() -> None:
    a = account()
    with trio.testing.assert_checkpoints():
        await a.ensure_clear_funds()
    with trio.CancelScope() as scope:
        scope.cancel()
        with pytest.raises(trio.Cancelled):
            await a.ensure_clear_funds()


async def test_waits_while_blocked_and_wakes_all_waiters_at_low_watermark() -> None:
    a = account(high=4, low=1)
    loans = [LoanedItem(a, 1, i) for i in range(5)]
    woken: list[int] = []

    async def waiter(i: int) -> None:
        await a.ensure_clear_funds()
        woken.append(i)

    async with trio.open_nursery() as nursery:
        for i in range(3):
            nursery.start_soon(waiter, i)
        await trio.testing.wait_all_tasks_blocked()
        assert a.statistics().waiters == 3
        for loan in loans[:3]:  # 5 -> 2: below high, above low
            loan.repay()
            await trio.testing.wait_all_tasks_blocked()
            assert woken == []
        loans[3].repay()  # 1: at the low watermark
        await trio.testing.wait_all_tasks_blocked()
        assert sorted(woken) == [0, 1, 2]
    assert a.statistics().waiters == 0
    loans[4].repay()


async def test_child_waits_on_blocked_parent_then_rechecks_the_chain() -> None:
    root = account("root", high=2, low=0)
    child = account("child", high=2, low=0, parent=root)
    sibling = account("sibling", high=100, low=0, parent=root)
    root_loans = [LoanedItem(sibling, 1, i) for i in range(3)]  # root blocked
    child_loans = [LoanedItem(child, 1, i) for i in range(3)]  # child blocked too
    done = trio.Event()

    async def reader() -> None:
        await child.ensure_clear_funds()
        done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader)
        await trio.testing.wait_all_tasks_blocked()
        for loan in child_loans:
            loan.repay()  # child clear, root still blocked by the sibling
        await trio.testing.wait_all_tasks_blocked()
        assert not done.is_set()
        assert root.blocked
        for loan in root_loans:
            loan.repay()
        await trio.testing.wait_all_tasks_blocked()
        assert done.is_set()


async def test_cancel_while_waiting_leaves_the_account_unchanged(
    autojump_clock: trio.testing.MockClock,
) -> None:
    a = account(high=0, low=0)
    loan = LoanedItem(a, 1, None)
    with trio.move_on_after(5) as scope:
        await a.ensure_clear_funds()
    assert scope.cancelled_caught
    stats = a.statistics()
    assert (stats.debt, stats.waiters, stats.blocked) == (1, 0, True)
    loan.repay()
    await a.ensure_clear_funds()


async def test_seconds_blocked_counts_parked_time(autojump_clock: trio.testing.MockClock) -> None:
    a = account(high=0, low=0)
    loan = LoanedItem(a, 1, None)

    async def repay_later() -> None:
        await trio.sleep(3)
        assert a.statistics().seconds_blocked == pytest.approx(3)  # wait in progress counts
        await trio.sleep(4)
        loan.repay()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(repay_later)
        await a.ensure_clear_funds()
        assert trio.current_time() == pytest.approx(7)
    assert a.statistics().seconds_blocked == pytest.approx(7)
