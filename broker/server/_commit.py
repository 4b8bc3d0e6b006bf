"""Routing a committed batch: its staged publishes go to their topics, in order,
charged to the committing connection (the fan-out rule) and paced by that
charge, like any publisher's."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import trio

from accounts import Account

from ._staging import StagedPublish
from ._topic import FORWARD_BATCH, Routed, Topic


class Topics(Protocol):
    """Where topics are found by name (the broker)."""

    def topic(self, name: str) -> Topic:
        """The topic actor for ``name``, spawned on first use."""
        ...


@dataclass(slots=True, eq=False)
class CommitInFlight:
    """A commit being routed: ``waiters`` are called once it is all routed
    (its own answer, and those of the same commit sent again meanwhile),
    then ``routed`` is set (also if it was cut off)."""

    routed: trio.Event = field(default_factory=trio.Event)
    waiters: list[Callable[[], None]] = field(default_factory=list)


class CommitRun:
    """Counts the routed publishes of one commit; :attr:`done` is set once
    every topic has routed all of them to its subscriptions."""

    def __init__(self, total: int) -> None:
        self.left = total
        self.done = trio.Event()
        if total == 0:
            self.done.set()

    def routed(self, routed: Routed) -> None:
        """A topic routed a batch of this commit's publishes."""
        self.left -= len(routed.tails)
        if self.left <= 0:
            self.done.set()


async def route_commit(broker: Topics, account: Account, publishes: list[StagedPublish]) -> None:
    """Route ``publishes`` (runs per topic in the order given), each batch a
    loan on ``account``; waits while ``account`` is over its watermark (slow
    subscribers slow the commit, not the broker's memory) and returns once
    everything is routed. Staged loans are repaid as their batch is handed on,
    and all of them, routed or not, if this is cancelled."""
    run = CommitRun(len(publishes))
    held: dict[str, Topic] = {}
    try:
        for topic_name, group in itertools.groupby(publishes, key=lambda p: p.topic):
            topic = held.get(topic_name)
            if topic is None:
                topic = held[topic_name] = broker.topic(topic_name)
                topic.publishers += 1  # kept alive until everything is routed
            run_of_topic = list(group)
            for start in range(0, len(run_of_topic), FORWARD_BATCH):
                chunk = run_of_topic[start : start + FORWARD_BATCH]
                await account.ensure_clear_funds()
                tails = [p.loan.item for p in chunk]
                size = sum(len(tail) for tail in tails)
                keys = [p.key for p in chunk]
                # (No fan-out estimate: the account's own debt paces a commit.)
                routed = Routed(tails, run, 0, 0, keys)
                topic.send_nowait(routed, account=account, cost=size)
                for publish in chunk:
                    publish.loan.repay()
        await run.done.wait()
    finally:
        for publish in publishes:
            publish.loan.repay()  # (once only: those handed on already were)
        for topic in held.values():
            topic.publishers -= 1
            topic.release_if_unused()
