"""Consumer groups: a topic's records shared among the members of a group,
settled one by one, redelivered, dead-lettered, in order per key if asked.

This package is the sans-IO part (no I/O, no clock: times are passed in):
:class:`GroupState` is one group's bookkeeping, :func:`group_request` reads
a member's ``Subscribe`` options. The broker's side (reading the log,
sending, the state journal) is ``broker.server.topics._groups``.
"""

from ._options import (
    DEFAULT_ACK_WAIT_MS,
    DEFAULT_MAX_DELIVERIES,
    DEFAULT_MAX_OUTSTANDING,
    GROUP_OPTIONS,
    GroupOptionError,
    GroupRequest,
    dead_letters_default,
    group_request,
)
from ._state import (
    DeadLetter,
    GroupConfig,
    GroupError,
    GroupState,
    Member,
    Outcome,
    Taken,
    key_hash,
)

__all__ = [
    "DEFAULT_ACK_WAIT_MS",
    "DEFAULT_MAX_DELIVERIES",
    "DEFAULT_MAX_OUTSTANDING",
    "GROUP_OPTIONS",
    "DeadLetter",
    "GroupConfig",
    "GroupError",
    "GroupOptionError",
    "GroupRequest",
    "GroupState",
    "Member",
    "Outcome",
    "Taken",
    "dead_letters_default",
    "group_request",
    "key_hash",
]
