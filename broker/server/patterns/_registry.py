"""The broker's live pattern subscriptions: each told of every topic made
here (at once) and deleted, and, on a worker of several, of the matching
topics the other workers make (a look at the shared data directory every
:data:`RESCAN_INTERVAL` seconds: they tell this worker nothing)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import trio

from broker.errors import BrokerError
from broker.log import LogError

from ._subscription import RESCAN_INTERVAL, PatternSubscription

log = logging.getLogger("broker.server")


class PatternRegistry:
    """The broker's live pattern subscriptions: told of every topic made
    (to match it) and deleted (to let it go)."""

    def __init__(self) -> None:
        self._subscriptions: set[PatternSubscription] = set()

    def __len__(self) -> int:
        return len(self._subscriptions)

    def add(self, subscription: PatternSubscription) -> None:
        self._subscriptions.add(subscription)

    def discard(self, subscription: PatternSubscription) -> None:
        self._subscriptions.discard(subscription)

    def topic_made(self, name: str) -> None:
        """Topic ``name`` has an actor now: every pattern that matches it takes it."""
        for subscription in list(self._subscriptions):
            if subscription.matches(name):
                try:
                    subscription.add(name)
                except (BrokerError, ValueError) as error:  # (options accepted once)
                    log.warning(
                        "pattern %r: topic %r left out: %s",
                        subscription.pattern.text,
                        name[:64],
                        error,
                    )

    async def watch(
        self,
        stored: Callable[[Callable[[str], bool]], Awaitable[list[str]]],
        *,
        interval: float = RESCAN_INTERVAL,
    ) -> None:
        """Look, every ``interval`` seconds while there are pattern
        subscriptions, for matching topics on disk that a pattern has not
        taken and did not find there when it subscribed: another worker of
        the same data directory made them since (and tells this one
        nothing). The pattern takes each from its first record."""
        while True:
            await trio.sleep(interval)
            patterns = [s for s in self._subscriptions if s.existing is not None]
            if not patterns:
                continue

            def wanted(name: str, patterns: list[PatternSubscription] = patterns) -> bool:
                return any(pattern.matches(name) for pattern in patterns)

            try:
                names = await stored(wanted)
            except (OSError, LogError) as error:  # (tried again at the next look)
                log.warning("the topics cannot be listed now: %s", error)
                continue
            for subscription in patterns:
                existing = subscription.existing or set()
                for name in names:
                    if (
                        name not in subscription.matched_topics
                        and name not in existing
                        and subscription.matches(name)
                    ):
                        try:
                            subscription.add(name, from_start=True)
                        except (BrokerError, ValueError) as error:
                            log.warning(
                                "pattern %r: topic %r left out: %s",
                                subscription.pattern.text,
                                name[:64],
                                error,
                            )

    def topic_deleted(self, name: str) -> None:
        """Topic ``name`` was deleted: every pattern that had it lets it go."""
        for subscription in list(self._subscriptions):
            subscription.remove(name)
