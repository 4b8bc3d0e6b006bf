"""The connection a pattern subscription's members send through: the
pattern's own connection, with each member's deliveries made the
pattern's (see ``_patterns``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, cast

from accounts import Account, LoanedItem

from ..topics._lossy import DropCounts
from ..topics._topic import Subscriber, Subscription


class PatternConnection(Subscriber, Protocol):
    """What a pattern subscription needs of its subscriber's connection (the
    broker's ``Deliveries``)."""

    dropping_bytes: int

    @property
    def name(self) -> str: ...

    @property
    def root_account(self) -> Account: ...

    @property
    def counters(self) -> DropCounts: ...

    @property
    def lossy_budget(self) -> int: ...

    def written_later(self, loan: LoanedItem[Any]) -> None: ...

    def room(self, subscription: Subscription) -> int: ...

    def send_matched(
        self, subscription: Subscription, tails: list[bytes], match: int, first: int
    ) -> int | None:
        """Queue DeliverMatched frames of ``tails`` (records ``first`` on of
        the topic matched as ``match``), numbered from the pattern's
        ``next_seq``, as far as the guarantees allow; how many were taken,
        or None if the subscription is being freed."""
        ...

    def matched(self, subscription: Subscription, match: int, topic: str | None) -> bool:
        """Send a Matched; False if nothing more can be said on the subscription."""
        ...

    def matched_gap(self, subscription: Subscription, match: int, first: int, count: int) -> bool:
        """Send a MatchedGap; False if nothing more can be said on it."""
        ...


class OutletOwner(Protocol):
    """The pattern subscription an :class:`Outlet` serves (a ``Subscription``)."""

    @property
    def connection(self) -> PatternConnection: ...

    @property
    def members(self) -> dict[int, Subscription]: ...

    def send(self, member: Subscription, tails: list[bytes]) -> int | None: ...

    def gap(self, member: Subscription, first: int, count: int) -> bool: ...

    def stalled(self, member: Subscription) -> None: ...

    def remove(self, name: str) -> None: ...


class Outlet:
    """The connection a pattern's members send through (a ``Subscriber``,
    ``LogSubscriber`` and ``DroppingSubscriber``): the pattern's own
    connection, with each member's deliveries made the pattern's."""

    __slots__ = ("pattern",)

    def __init__(self, pattern: OutletOwner) -> None:
        self.pattern = pattern

    @property
    def open(self) -> bool:
        return self.pattern.connection.open

    @property
    def subscriptions(self) -> Mapping[int, Subscription]:
        return self.pattern.members

    @property
    def name(self) -> str:
        return self.pattern.connection.name

    @property
    def root_account(self) -> Account:
        return self.pattern.connection.root_account

    @property
    def counters(self) -> DropCounts:
        return self.pattern.connection.counters

    @property
    def lossy_budget(self) -> int:
        return self.pattern.connection.lossy_budget

    @property
    def dropping_bytes(self) -> int:
        return self.pattern.connection.dropping_bytes

    @dropping_bytes.setter
    def dropping_bytes(self, value: int) -> None:
        self.pattern.connection.dropping_bytes = value

    def send_deliveries(self, subscription: Subscription, tails: list[bytes]) -> int | None:
        return self.pattern.send(subscription, tails)

    def send_timed(
        self, subscription: Subscription, tails: list[bytes], times: list[int]
    ) -> int | None:
        return self.pattern.send(subscription, tails)  # (a pattern refuses timestamps)

    def deliver(self, subscription: Subscription, loans: list[LoanedItem[bytes]]) -> int:
        count = self.pattern.send(subscription, [loan.item for loan in loans])
        if count is None:
            for loan in loans:
                loan.repay()
            return len(loans)
        for loan in loans[:count]:
            self.pattern.connection.written_later(loan)
        return count

    def written_later(self, loan: LoanedItem[Any]) -> None:
        self.pattern.connection.written_later(loan)

    def room(self, subscription: Subscription) -> int:
        return self.pattern.connection.room(cast(Subscription, self.pattern))

    def has_room(self, subscription: Subscription, size: int) -> bool:
        return self.pattern.connection.has_room(cast(Subscription, self.pattern), size)

    def gap(self, subscription: Subscription, first_seq: int, count: int) -> bool:
        return self.pattern.gap(subscription, first_seq, count)

    def subscription_stalled(self, subscription: Subscription) -> None:
        self.pattern.stalled(subscription)

    def end(self, handle: int) -> None:
        """A member's topic was deleted (at its owner): the pattern lets it go."""
        member = self.pattern.members.get(handle)
        if member is not None:
            self.pattern.remove(member.topic.topic_name)
