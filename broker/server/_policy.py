"""The broker's guarantee policy: capacities from budgets, issuing tied to accounts."""

from __future__ import annotations

from collections.abc import Callable

from broker.protocol import SUBSCRIPTION_BINDS, Channel, ChannelKind, ChannelReceiver, Policy

from ._budget import ConnectionBudget


class BrokerPolicy(Policy):
    """Guarantees on a publish channel are issued only while its account is clear.

    A new publish channel is funded from the connection's and the broker's
    buffer budgets (see :class:`ConnectionBudget`); the subscription bind
    channel never offers room beyond what ``max_subscriptions`` allows.
    ``blocked(index)`` says whether publish channel ``index``'s account
    withholds its guarantees.
    """

    def __init__(self, budget: ConnectionBudget, blocked: Callable[[int], bool]) -> None:
        config = budget.config
        super().__init__(
            bind_capacity=config.bind_capacity,
            publish_capacity=config.publish_capacity,
            deliver_capacity=0,
        )
        self._budget = budget
        self._blocked = blocked

    def initial_capacity(self, channel: Channel) -> int:
        if channel.kind == ChannelKind.PUBLISH:
            return self._budget.fund(channel)
        if channel == SUBSCRIPTION_BINDS:
            return self._budget.subscription_room()
        return super().initial_capacity(channel)

    def may_issue(self, channel: Channel) -> bool:
        if channel.kind != ChannelKind.PUBLISH:
            return True
        return not self._blocked(channel.index)

    def amount_to_issue(self, receiver: ChannelReceiver) -> int:
        amount = super().amount_to_issue(receiver)
        if amount > 0 and receiver.channel == SUBSCRIPTION_BINDS:
            return min(amount, self._budget.subscription_issue_cap(receiver))
        return amount
