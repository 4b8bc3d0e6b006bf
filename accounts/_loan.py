"""Loaned items: an item travelling through the system on credit."""

from __future__ import annotations

import os
import traceback
import warnings
from types import TracebackType
from typing import Generic, TypeVar

from accounts._account import Account
from accounts._errors import AccountsError, LoanLeakWarning

T = TypeVar("T")
U = TypeVar("U")

_leak_detection = os.environ.get("ACCOUNTS_LEAK_DETECTION", "") not in ("", "0")
_leaked = 0


def set_leak_detection(enabled: bool) -> None:
    """Turn leak detection (the debug mode) on or off.

    With it on, every loan records where it was made, and a loan that is
    garbage-collected unrepaid raises a :class:`LoanLeakWarning` naming that
    place (a test run with warnings as errors then fails). With it off, such a
    loan is still repaid by the collector and counted in :func:`leaked_loans`,
    silently. Also switched on by the environment variable
    ``ACCOUNTS_LEAK_DETECTION=1``.
    """
    global _leak_detection
    _leak_detection = enabled


def leak_detection_enabled() -> bool:
    """Whether leak detection is on (see :func:`set_leak_detection`)."""
    return _leak_detection


def leaked_loans() -> int:
    """How many loans the garbage collector has repaid since start-up."""
    return _leaked


def _where_made() -> traceback.StackSummary:
    # Drop the two innermost frames: this helper and LoanedItem.__init__.
    return traceback.StackSummary.from_list(traceback.extract_stack(limit=14)[:-2])


class LoanedItem(Generic[T]):
    """``item``, lent on ``account``: borrows on creation, repaid exactly once.

    Creating the loan charges ``cost + account.event_cost`` to ``account`` and
    each of its ancestors. :meth:`repay` gives it back; later calls do
    nothing. Used as a context manager, the loan is repaid on exit, however
    the block ends.

    Args:
        account: the account to charge.
        cost: the item's size in bytes (the per-event constant is added).
        item: what is being lent.
    """

    __slots__ = ("account", "amount", "item", "origin", "repaid")

    account: Account
    amount: int
    item: T
    repaid: bool
    origin: traceback.StackSummary | None

    def __init__(self, account: Account, cost: int, item: T) -> None:
        if cost < 0:
            raise AccountsError(f"a loan's cost must be >= 0, got {cost}")
        amount = cost + account.event_cost
        # Charge the account and each ancestor. Inlined (rather than an
        # Account method) because this runs for every event in the broker.
        for debtor in account._chain:
            debtor._borrowed += amount
            debtor._loans += 1
            debt = debtor._debt = debtor._debt + amount
            if debt > debtor._peak:
                debtor._peak = debt
            if debt > debtor.high_watermark:
                debtor._blocked = True
        self.account = account
        self.amount = amount
        self.item = item
        self.repaid = False
        self.origin = _where_made() if _leak_detection else None

    def repay(self) -> None:
        """Give the loan back to its account; idempotent."""
        if not self.repaid:
            self.repaid = True
            amount = self.amount
            for debtor in self.account._chain:
                debtor._loans -= 1
                debt = debtor._debt = debtor._debt - amount
                if debtor._blocked and debt <= debtor.low_watermark:
                    debtor._blocked = False
                    debtor._wake_all()

    def split(self, amount: int, item: U) -> LoanedItem[U]:
        """Move ``amount`` of this outstanding loan to a new loan of ``item``
        on the same account, and return it: each is repaid on its own, and
        the account's debt does not change (so neither does its blocked phase).
        """
        if self.repaid:
            raise AccountsError("cannot split a repaid loan")
        if not 0 <= amount <= self.amount:
            raise AccountsError(f"cannot split {amount} off a loan of {self.amount}")
        part: LoanedItem[U] = LoanedItem.__new__(LoanedItem)
        part.account = self.account
        part.amount = amount
        part.item = item
        part.repaid = False
        part.origin = _where_made() if _leak_detection else None
        self.amount -= amount
        for debtor in self.account._chain:
            debtor._loans += 1
        return part

    def __enter__(self) -> LoanedItem[T]:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.repay()

    def __repr__(self) -> str:
        state = "repaid" if self.repaid else "outstanding"
        return f"<LoanedItem {self.amount} on {self.account.name!r} {state}: {self.item!r}>"

    def __del__(self) -> None:
        # A leaked loan would hold its account in debt forever (and with it a
        # producer): repay it, and say so in debug mode.
        try:
            if self.repaid:
                return
        except AttributeError:  # __init__ refused the loan before charging
            return
        global _leaked
        _leaked += 1
        self.repay()
        if _leak_detection:
            where = "".join(self.origin.format()) if self.origin else "(origin not recorded)\n"
            warnings.warn(
                f"loan of {self.amount} on account {self.account.name!r} was never "
                f"repaid; it was made at:\n{where}",
                LoanLeakWarning,
                stacklevel=1,
            )
