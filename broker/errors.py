"""The base exception of the ``broker`` package."""

from __future__ import annotations


class BrokerError(Exception):
    """Base class of every error the ``broker`` package raises on purpose."""


def sole_exception(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The one exception inside ``group``, else ``group`` itself.

    trio's nurseries wrap whatever escapes them in an exception group; a
    context manager or command that knows only one thing can have failed
    hands that on as itself. One level only: a group that the code inside
    raised on purpose stays a group.
    """
    return group.exceptions[0] if len(group.exceptions) == 1 else group
