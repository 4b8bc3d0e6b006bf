"""A flow-controlled pub/sub broker of actors on trio.

Subpackages:

- ``broker.protocol``: the sans-IO wire protocol (framing, guarantees, handles,
  sessions). Never imports trio.
- ``broker.cli``: the ``broker`` command.
"""

from __future__ import annotations

from broker.errors import BrokerError


def __getattr__(name: str) -> str:
    """``__version__``, read from the installed package's metadata on first
    use (importing ``importlib.metadata`` takes most of ``import broker``:
    the ``broker`` command starts, and answers Ctrl-C, sooner without it)."""
    if name != "__version__":
        raise AttributeError(f"module 'broker' has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("trio-broker")
    except PackageNotFoundError:  # running from a checkout that was not installed
        found = "0+unknown"
    globals()["__version__"] = found
    return found


__all__ = ["BrokerError", "__version__"]
