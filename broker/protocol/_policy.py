"""Policy hooks: the decisions the protocol leaves to the application.

The state machines say what is *allowed*; a :class:`Policy` says what to
*do*: how much buffer a new channel gets, when freed space is promised
again, whether to send beyond the guarantees, whether binds are processed
on arrival. Subclass it (or pass another instance) to change one decision.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._types import Channel, ChannelKind
from .guarantees._receiver import ChannelReceiver

#: A subscription's delivery window unless the policy or the broker's
#: ``max_frame`` says otherwise (see :attr:`Policy.deliver_capacity`).
DEFAULT_DELIVER_CAPACITY = 256 * 1024
#: Publish and deliver channels issue in batches; bind channels never do.
_FIRST_BATCHED_KIND = int(ChannelKind.PUBLISH)


@dataclass
class Policy:
    """The defaults: issue in batches, never optimistic, binds processed on arrival."""

    #: Initial buffer capacity per receiving channel kind, in bytes.
    bind_capacity: int = 16 * 1024
    publish_capacity: int = 256 * 1024
    #: A subscription's delivery window. None (the default):
    #: :data:`DEFAULT_DELIVER_CAPACITY`, or, if the broker's largest Deliver
    #: is larger (its ``max_frame`` raised), that: a window must hold one
    #: delivery, and one smaller than a message never takes it, nor anything
    #: after it. A number is the window, as given.
    deliver_capacity: int | None = None
    #: Issue freed space only once at least this many bytes are issuable...
    issue_threshold: int = 1
    #: ...and at least this fraction of the channel's capacity. Batching saves
    #: one IssueGuarantee frame per processed frame; a sender with no
    #: guarantees left is never kept waiting for a batch.
    issue_fraction: float = 0.25
    #: Bytes a sender may have in flight beyond its guarantees (0 = never).
    optimism: int = 0
    #: Bytes this side lets a sender go on sending on a channel after its
    #: first drop, before the sender's Apologise; past it the connection ends
    #: (code 3). None: no bound.
    max_dropping: int | None = None
    #: When a buffer is shrunk below what its sender holds guarantees for,
    #: ask the sender to absolve the rest (True) or wait for processing alone.
    plead_on_shrink: bool = True
    #: Process binds when they arrive (True) or only when referenced or
    #: asked to with :meth:`Connection.process_binds` (False).
    process_binds_on_arrival: bool = True
    #: Client: the longest, in seconds, an ``Ack`` for fewer than a batch of
    #: deliveries is held back, so that one cumulative Ack covers what
    #: trickles in meanwhile (0: acknowledge at once).
    ack_delay: float = 0.02

    def initial_capacity(self, channel: Channel) -> int:
        """Buffer capacity a new receiving channel starts with."""
        if channel.kind == ChannelKind.PUBLISH:
            return self.publish_capacity
        if channel.kind == ChannelKind.DELIVER:
            if self.deliver_capacity is None:
                return DEFAULT_DELIVER_CAPACITY
            return self.deliver_capacity
        return self.bind_capacity

    def may_issue(self, channel: Channel) -> bool:
        """Whether guarantees may be issued on ``channel`` now.

        The broker overrides this to withhold guarantees while the channel's
        account is above its watermark; call
        :meth:`Connection.issue_guarantees` when the answer changes.
        """
        return True

    def amount_to_issue(self, receiver: ChannelReceiver) -> int:
        """How many bytes to promise on ``receiver`` now (0 = not now)."""
        issuable = receiver.issuable
        if issuable <= 0:
            return 0
        # Bind channels are never batched: live handles hold bind bytes until
        # freed, so a batch might never fill up, and binds are rare.
        if receiver.channel.kind >= _FIRST_BATCHED_KIND and receiver.sender_balance > 0:
            # The sender still has guarantees: wait until a batch has freed up...
            batch = max(self.issue_threshold, int(receiver.capacity * self.issue_fraction))
            if issuable < batch:
                largest = receiver.largest_frame
                if (
                    largest is not None
                    and receiver.sender_balance >= largest
                    and receiver.receiving_limit is None
                ):
                    # The sender can send any frame it has: its next frames
                    # complete the batch (one IssueGuarantee per batch, not
                    # per processed frame, when frames trickle in).
                    return 0
                # ...but never for a batch that processing or a receiving limit
                # cannot complete (the sender may be blocked on a large frame).
                batch = min(batch, issuable + receiver.buffered)
                if receiver.receiving_limit is not None:
                    batch = min(batch, receiver.receiving_limit)
                if issuable < batch:
                    return 0
        if not self.may_issue(receiver.channel):
            return 0
        return issuable

    def optimism_for(self, channel: Channel) -> int:
        """Bytes beyond the guarantees this side may send on ``channel``."""
        return self.optimism
