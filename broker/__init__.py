"""A flow-controlled pub/sub broker of actors on trio.

Subpackages:

- ``broker.protocol``: the sans-IO wire protocol (framing, guarantees, handles,
  sessions). Never imports trio.
- ``broker.cli``: the ``broker`` command.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from .errors import BrokerError

try:
    __version__ = version("trio-broker")
except PackageNotFoundError:  # running from a checkout that was not installed
    __version__ = "0+unknown"

__all__ = ["BrokerError", "__version__"]
