"""The broker-wide bound on messages arriving in parts.

A connection holds at most ``max_message`` bytes of messages received in
parts and not whole yet (the protocol refuses more). That memory is not
charged to the connection's account while the message is incomplete:
charged, a large message would block the reader that must read its last
part. Instead, at most :attr:`ReassemblyRoom.slots` connections reassemble
at once (``global_budget // max_message``, at least one): a connection that
starts a message in parts without a slot stops reading (after what its
current read held) until another's message is whole. So the broker holds
at most ``slots x max_message`` bytes of incomplete messages, plus one read
per waiting connection, however many connections send large messages.
"""

from __future__ import annotations

import trio

__all__ = ["ReassemblyRoom"]


class ReassemblyRoom:
    """Slots for connections holding messages in parts (see the module)."""

    __slots__ = ("_freed", "holders", "slots")

    def __init__(self, slots: int) -> None:
        self.slots = max(1, slots)
        #: The connections that hold a slot.
        self.holders: set[object] = set()
        self._freed = trio.Event()

    def update(self, owner: object, reassembling: int) -> bool:
        """``owner`` now holds ``reassembling`` bytes of messages in parts:
        False if it must wait for a slot before it reads on (then await
        :meth:`wait_for_slot`); a slot it no longer needs is given back."""
        if not reassembling:
            self.release(owner)
            return True
        if owner in self.holders:
            return True
        if len(self.holders) < self.slots:
            self.holders.add(owner)
            return True
        return False

    async def wait_for_slot(self, owner: object) -> None:
        """Wait until ``owner`` holds a slot."""
        while owner not in self.holders:
            if len(self.holders) < self.slots:
                self.holders.add(owner)
                return
            await self._freed.wait()

    def release(self, owner: object) -> None:
        """``owner`` holds no message in parts any more (or closed)."""
        if owner in self.holders:
            self.holders.discard(owner)
            self._freed.set()
            self._freed = trio.Event()
