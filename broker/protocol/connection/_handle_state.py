"""The state of one data handle on one side of a connection, in one object.

A connection's handle tables hold these as their bindings: what the handle is
bound to and where it is in the freeing exchange (:class:`Binding`), plus
everything else this side keeps per handle — the guarantee state of the
handle's channel, the session counts a resume needs, the retained frames, the
stage. So a fast path finds all it needs with one lookup, and deleting the
binding deletes the handle's state with it.

Which fields are in use depends on the role: a topic handle's channel
``[2, t]`` is sent on by the client and received on by the broker, a
subscription handle's channel ``[3, s]`` the other way round.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from ..frames._messages import Stage
from ..guarantees._receiver import ChannelReceiver, ChannelSender
from ._handles import Binding
from ._session import SubscriptionInfo


@dataclass(slots=True, eq=False)
class TopicState(Binding[str]):
    """One topic handle: its name, its publish channel and session data."""

    #: Broker: the receiving state of the publish channel ``[2, t]``.
    receiver: ChannelReceiver | None = None
    #: Client: the sending state of the publish channel ``[2, t]``.
    sender: ChannelSender | None = None
    #: Where publishes on the handle are staged (None: routed at once).
    stage: Stage | None = None
    #: Broker: Publish frames accepted on the handle in the whole session.
    received: int = 0
    #: Client: Publish frames the broker has not confirmed yet (kept for a
    #: resume), in order, and how many it confirmed before them.
    retained: deque[bytes] | None = None
    retained_base: int = 0
    #: Client: publishes sent after the retained ones and not kept (by a
    #: client that never resumes: ``hello(keep_unconfirmed=False)``).
    unkept: int = 0
    #: Broker: bytes the handle's BindTopic holds on the bind channel while
    #: the handle lives (None on the client).
    bind_size: int | None = None
    #: Broker: restored from a session, so its bind frame's space was taken
    #: off the bind channel's capacity (grown back, not released, when freed).
    restored: bool = False

    def retain(self, frame: bytes) -> None:
        """Client: keep a sent Publish frame until the broker confirms it."""
        retained = self.retained
        if retained is None:
            retained = self.retained = deque()
        retained.append(frame)

    def retain_all(self, frames: list[bytes]) -> None:
        """Client: :meth:`retain` each of ``frames``, in order."""
        retained = self.retained
        if retained is None:
            retained = self.retained = deque()
        retained += frames

    @property
    def published(self) -> int:
        """Client: Publish frames sent on the handle in the whole session."""
        retained = self.retained
        return self.retained_base + (len(retained) if retained is not None else 0) + self.unkept

    def confirm(self, count: int) -> bool:
        """Client: the broker confirmed ``count`` publishes (cumulative);
        the confirmed frames are dropped. False (nothing changed) if
        ``count`` goes back or beyond what was sent."""
        base = self.retained_base
        if not base <= count <= self.published:
            return False
        retained = self.retained
        if count > base:
            confirmed = count - base
            if retained:
                kept = min(confirmed, len(retained))
                for _ in range(kept):
                    retained.popleft()
                confirmed -= kept
            self.unkept -= confirmed
            self.retained_base = count
        return True


@dataclass(slots=True, eq=False)
class SubscriptionState(Binding[SubscriptionInfo]):
    """One subscription handle: what it subscribes to, its delivery channel
    and session data."""

    #: Client: the receiving state of the delivery channel ``[3, s]``.
    receiver: ChannelReceiver | None = None
    #: Broker: the sending state of the delivery channel ``[3, s]``.
    sender: ChannelSender | None = None
    #: Client: the last sequence number acknowledged (0: none).
    processed: int = 0
    #: Client, of a pattern subscription: its bound match indices' topics.
    matches: dict[int, str] | None = None
    #: Broker: bytes the handle's Subscribe holds on the bind channel.
    bind_size: int | None = None
    #: Broker: restored from a session (see :attr:`TopicState.restored`).
    restored: bool = False
