"""The base exception of the ``broker`` package."""

from __future__ import annotations


class BrokerError(Exception):
    """Base class of every error the ``broker`` package raises on purpose."""
