"""Small actors the tests share."""

from __future__ import annotations

from typing import Any

from accounts import Account
from actors import Actor, Turn


class Recorder(Actor):
    """Records what it handles, and the debt of the event's account at the
    time it handles it."""

    def __init__(self) -> None:
        self.seen: list[Any] = []
        self.accounts: list[Account] = []

    def handle(self, turn: Turn, message: Any) -> None:
        self.seen.append(message)
        self.accounts.append(turn.account)


class Forwarder(Actor):
    """Sends every event on to its targets, in the event's turn."""

    def __init__(self, *targets: Actor, cost: int = 0) -> None:
        self.targets = list(targets)
        self.cost = cost

    def handle(self, turn: Turn, message: Any) -> None:
        for target in self.targets:
            turn.send(target, message, cost=self.cost)


class Crasher(Actor):
    """Fails on the message "boom"; records the rest."""

    def __init__(self) -> None:
        self.seen: list[Any] = []

    def handle(self, turn: Turn, message: Any) -> None:
        if message == "boom":
            raise ValueError("boom")
        self.seen.append(message)
