"""Accounts: every unit of work is paid for by the activity that caused it.

An :class:`Account` records the debt of one activity (a connection, a logical
channel, a timer): bytes plus a per-event constant, lent out as
:class:`LoanedItem` objects and repaid when the work they stand for is done.
Debt rolls up to parent accounts. A reader calls
:meth:`Account.ensure_clear_funds` between units of input, so a producer whose
work is still outstanding downstream stops being read, and TCP throttles it.
"""

from accounts._account import (
    DEFAULT_EVENT_COST,
    Account,
    AccountStatistics,
    live_accounts,
    unlimited,
)
from accounts._errors import AccountsError, LoanLeakWarning
from accounts._loan import (
    LoanedItem,
    leak_detection_enabled,
    leaked_loans,
    set_leak_detection,
)

__all__ = [
    "DEFAULT_EVENT_COST",
    "Account",
    "AccountStatistics",
    "AccountsError",
    "LoanLeakWarning",
    "LoanedItem",
    "leak_detection_enabled",
    "leaked_loans",
    "live_accounts",
    "set_leak_detection",
    "unlimited",
]
