"""Acknowledgements held back for a moment, so that a subscription whose
messages trickle in sends one cumulative ``Ack`` per ``ack_delay`` seconds
rather than one per message (the delayed acknowledgement of TCP and QUIC).

Every ``Ack`` the broker reads costs it a wake-up; at everyday rates that is
about a sixth of its CPU per message. An ``Ack`` covers every delivery
before it, so holding one back for a few milliseconds loses nothing: it
only lets the broker keep the deliveries' loans that much longer. What is
held is bounded in time (``ack_delay``) and in bytes (:data:`HOLD_BYTES`,
and a quarter of the subscription's delivery window);
larger batches are acknowledged at once, as before.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

#: The most bytes of delivered frames an acknowledgement is held back for:
#: past it the ``Ack`` goes at once. The loans held count against the
#: publishers' accounts, so this stays far below a broker's watermarks (the
#: default ``channel_high_watermark`` is 1 MiB): a subscription at 1,000
#: messages of 100 bytes a second holds about 2.6 KiB for 20 ms.
HOLD_BYTES = 8 * 1024

K = TypeVar("K", bound=Hashable)


class HeldAcks(Generic[K]):
    """Which subscriptions' acknowledgements are held back, until when.

    ``delay`` is the policy's ``ack_delay`` (0: nothing is ever held).
    ``on_timer(due)`` is called when an Ack starts being held until ``due``:
    the driver's timer must wake by then (:meth:`earliest`). All entries are
    held for the same delay, so they fall due in the order they were held.
    """

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.on_timer: Callable[[float], object] = lambda due: None
        #: Per subscription: when its Ack is due, and the bytes it covers.
        self._held: dict[K, list[float]] = {}

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, key: K, size: int, now: float, window: int) -> bool:
        """Hold back the Ack of ``size`` more bytes of ``key``'s deliveries,
        whose delivery window is ``window`` bytes; False if it must go now
        instead (nothing is ever held, or the bytes held reach
        :data:`HOLD_BYTES` or a quarter of the window: then nothing of
        ``key`` is held)."""
        most = min(HOLD_BYTES, window // 4)
        held = self._held.get(key)
        if held is None:
            if self.delay <= 0 or size >= most:
                return False
            due = now + self.delay
            self._held[key] = [due, size]
            self.on_timer(due)
            return True
        held[1] += size
        if held[1] >= most:
            del self._held[key]
            return False
        return True

    def forget(self, key: K) -> None:
        """``key`` was acknowledged: nothing of it is held any more."""
        self._held.pop(key, None)

    def clear(self) -> None:
        """Hold nothing (the connection was replaced)."""
        self._held.clear()

    def earliest(self) -> float | None:
        """When the first held Ack is due (None: none is held)."""
        for due, _size in self._held.values():
            return due
        return None

    def take_due(self, now: float) -> list[K]:
        """The keys whose Ack is due at ``now`` (no longer held)."""
        due: list[K] = []
        held = self._held
        for key, (when, _size) in list(held.items()):
            if when > now:
                break
            del held[key]
            due.append(key)
        return due
