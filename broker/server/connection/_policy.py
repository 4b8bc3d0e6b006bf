"""The broker's guarantee policy: capacities from budgets, issuing tied to accounts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from broker.config import BrokerConfig
from broker.protocol import (
    LENGTH_PREFIX,
    OPTIMISM_FRAMES,
    SUBSCRIPTION_BINDS,
    Channel,
    ChannelKind,
    Policy,
)
from broker.protocol.guarantees import ChannelReceiver

from ._budget import Grant


class BudgetView(Protocol):
    """What the policy asks of a connection's receive-buffer budget (see
    :class:`~broker.server.connection._budget.ConnectionBudget`). The policy is called
    while the protocol handles a read: none of these may call the protocol,
    read the clock or write the ledger."""

    @property
    def config(self) -> BrokerConfig: ...

    #: The grants not booked yet: the policy appends each one it makes; the
    #: connection books them (``book``) once the protocol call returned.
    pending: list[Grant]

    def quote(self, channel: Channel) -> Grant:
        """Capacity for a new publish channel, from a snapshot (no writes)."""
        ...

    def subscription_room(self) -> int:
        """Free room the subscription bind channel may have."""
        ...

    def subscription_issue_cap(self, receiver: ChannelReceiver) -> int:
        """The most that may be issued on the subscription bind channel now."""
        ...


class BrokerPolicy(Policy):
    """Guarantees on a publish channel are issued only while its account is clear.

    A new publish channel is funded from the connection's and the broker's
    buffer budgets (see :class:`ConnectionBudget`); the subscription bind
    channel never offers room beyond what ``max_subscriptions`` allows.
    ``blocked(index)`` says whether publish channel ``index``'s account
    withholds its guarantees. Nothing here calls back into the protocol,
    reads the clock or writes the ledger: the grants are booked after the
    protocol's call returns (see ``ConnectionBudget.book``).
    """

    def __init__(self, budget: BudgetView, blocked: Callable[[int], bool]) -> None:
        config = budget.config
        super().__init__(
            bind_capacity=config.bind_capacity,
            publish_capacity=config.publish_capacity,
            deliver_capacity=0,
            # A client that goes on flooding a dropping channel is cut off
            # (it would have the broker read and drop at full speed for good);
            # one that heeds AnnounceDropping drops at most its guarantees
            # (a channel holds at most connection_budget) and its optimism.
            max_dropping=config.connection_budget
            + OPTIMISM_FRAMES * (config.max_frame + LENGTH_PREFIX),
        )
        self._budget = budget
        self._blocked = blocked

    def initial_capacity(self, channel: Channel) -> int:
        """A publish channel's capacity is quoted from the budget's snapshot;
        a bind channel's is fixed. Either way the grant is only noted
        (``pending``): the connection books it after the protocol call."""
        budget = self._budget
        if channel.kind == ChannelKind.PUBLISH:
            grant = budget.quote(channel)
        else:
            if channel == SUBSCRIPTION_BINDS:
                capacity = budget.subscription_room()
            else:
                capacity = super().initial_capacity(channel)
            grant = Grant(channel, capacity)
        budget.pending.append(grant)
        return grant.capacity

    def may_issue(self, channel: Channel) -> bool:
        if channel.kind != ChannelKind.PUBLISH:
            return True
        return not self._blocked(channel.index)

    def amount_to_issue(self, receiver: ChannelReceiver) -> int:
        amount = super().amount_to_issue(receiver)
        if amount > 0 and receiver.channel == SUBSCRIPTION_BINDS:
            return min(amount, self._budget.subscription_issue_cap(receiver))
        return amount
