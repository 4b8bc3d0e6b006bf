"""The base exception of the ``broker`` package."""

from __future__ import annotations


class BrokerError(Exception):
    """Base class of every error the ``broker`` package raises on purpose."""


def sole_exception(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The one exception inside ``group`` (through nested groups), else ``group``.

    trio's nurseries wrap whatever escapes them in exception groups; where a
    context manager or command knows only one thing can have failed, it hands
    that on as itself.
    """
    while len(group.exceptions) == 1:
        inner = group.exceptions[0]
        if not isinstance(inner, BaseExceptionGroup):
            return inner
        group = inner
    return group
