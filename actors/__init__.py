"""The actor runtime on trio, with every event paid for by an account.

An :class:`Actor` handles the events in its mailbox one :class:`Turn` at a
time. Each event is a :class:`~accounts.LoanedItem`; the turn runs under that
event's account, and everything the turn sends is charged to the same account
(fan-out included) before the event's own loan is repaid. So the debt of the
connection or channel that caused some work stays outstanding until all the
work it caused is done, and a reader waiting on that account throttles the
producer. Mailboxes never drop and are not bounded by a count: the accounts
bound memory.
"""

from actors._actor import TURNS_PER_YIELD, Actor, ActorState, ActorStatistics, Turn
from actors._errors import ActorFailed, ActorsError, NotInTurnError, NotSpawnedError
from actors._system import ActorSystem, SystemStatistics, open_system
from actors._timers import Timer, TimerStatistics

__all__ = [
    "TURNS_PER_YIELD",
    "Actor",
    "ActorFailed",
    "ActorState",
    "ActorStatistics",
    "ActorSystem",
    "ActorsError",
    "NotInTurnError",
    "NotSpawnedError",
    "SystemStatistics",
    "Timer",
    "TimerStatistics",
    "Turn",
    "open_system",
]
