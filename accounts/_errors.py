"""The base exception and the warning of the ``accounts`` package."""

from __future__ import annotations


class AccountsError(Exception):
    """Base class of every error the ``accounts`` package raises on purpose
    (misuse such as inconsistent watermarks or a negative cost)."""


class LoanLeakWarning(ResourceWarning):
    """A :class:`~accounts.LoanedItem` was garbage-collected without being
    repaid. The collector repaid it, but the code that lost it has a bug: until
    the collector ran, the loan kept its account in debt."""
