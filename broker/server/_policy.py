"""The broker's guarantee policy: capacities from budgets, issuing tied to accounts."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

from broker.protocol import Channel, ChannelKind, Policy

if TYPE_CHECKING:
    from ._connection import ServerConnection


class BrokerPolicy(Policy):
    """Guarantees on a publish channel are issued only while its account is clear.

    A new publish channel is funded from the connection's and the broker's
    buffer budgets (shrinking idle channels when they are spent).
    """

    def __init__(self, connection: ServerConnection) -> None:
        config = connection.broker.config
        super().__init__(
            bind_capacity=config.bind_capacity,
            publish_capacity=config.publish_capacity,
            deliver_capacity=0,
        )
        # A proxy: the connection holds its protocol, which holds this policy;
        # a strong reference back would leave every closed connection a cycle.
        self._connection: ServerConnection = weakref.proxy(connection)

    def initial_capacity(self, channel: Channel) -> int:
        if channel.kind == ChannelKind.PUBLISH:
            return self._connection.fund_channel(channel)
        return super().initial_capacity(channel)

    def may_issue(self, channel: Channel) -> bool:
        if channel.kind != ChannelKind.PUBLISH:
            return True
        state = self._connection.channels.get(channel.index)
        return state is None or not state.account.blocked
