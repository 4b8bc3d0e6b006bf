"""Accounts: debt with watermarks, rolled up a hierarchy, that readers wait on."""

from __future__ import annotations

import math
import weakref
from collections.abc import Iterator
from dataclasses import dataclass

import trio

from accounts._errors import AccountsError

#: The default per-event constant: what one loaned event costs on top of its
#: bytes (the loan object, its slot in a mailbox). Close to what CPython spends
#: on a ``LoanedItem`` plus a deque slot; pure event counts would not bound memory.
DEFAULT_EVENT_COST = 128

_registry: weakref.WeakSet[Account] = weakref.WeakSet()


def live_accounts() -> list[Account]:
    """Every account that is neither closed nor garbage: what metrics export."""
    return sorted(_registry, key=lambda account: account.serial)


_serials = iter(range(1, 2**63))


@dataclass(frozen=True, slots=True)
class AccountStatistics:
    """A snapshot of one account (rolled-up figures include its descendants).

    Attributes:
        name: the account's name.
        kind: the account's kind (a small, bounded set, usable as a metric label).
        debt: bytes (plus per-event constants) lent and not yet repaid.
        peak_debt: the largest ``debt`` seen so far.
        borrowed_total: everything ever lent from this account.
        repaid_total: everything ever repaid to it.
        loans: loans outstanding (lent, not yet repaid).
        blocked: whether the account is in its blocked phase (went above its
            high watermark and has not yet come down to its low watermark).
        seconds_blocked: task-seconds spent parked in
            :meth:`Account.ensure_clear_funds` called on this account, including
            waits still in progress.
        waiters: tasks parked in :meth:`Account.ensure_clear_funds` now.
        high_watermark: the high watermark.
        low_watermark: the low watermark.
    """

    name: str
    kind: str
    debt: int
    peak_debt: int
    borrowed_total: int
    repaid_total: int
    loans: int
    blocked: bool
    seconds_blocked: float
    waiters: int
    high_watermark: float
    low_watermark: float


class Account:
    """An account that the activity of one connection or channel is charged to.

    Debt is measured in bytes plus a per-event constant (:attr:`event_cost`).
    Debt rolls up: every loan on an account is also debt of its parent, and of
    the parent's parent. An account is *blocked* from the moment its debt goes
    above ``high_watermark`` until it falls back to ``low_watermark`` or below
    (hysteresis: no flapping around a single threshold).
    :meth:`ensure_clear_funds` parks while this account or any ancestor is
    blocked.

    Args:
        name: what logs and metrics call the account.
        high_watermark: debt above which the account blocks; ``math.inf`` for
            an account that never blocks (a pure aggregate or a meter).
        low_watermark: debt at or below which a blocked account clears; must
            be ``<= high_watermark``.
        parent: the account debt rolls up to, if any.
        kind: a short label from a bounded set ("connection", "channel",
            "timer", ...), used to group accounts in metrics.
        event_cost: the per-event constant; defaults to the parent's, or
            :data:`DEFAULT_EVENT_COST` for a root account.
    """

    __slots__ = (
        "__weakref__",
        "_blocked",
        "_borrowed",
        "_chain",
        "_closed",
        "_debt",
        "_loans",
        "_lot",
        "_parked_seconds",
        "_peak",
        "_wait_start_sum",
        "_waiters",
        "event_cost",
        "high_watermark",
        "kind",
        "low_watermark",
        "name",
        "parent",
        "serial",
    )

    event_cost: int

    def __init__(
        self,
        name: str,
        *,
        high_watermark: float,
        low_watermark: float,
        parent: Account | None = None,
        kind: str = "account",
        event_cost: int | None = None,
    ) -> None:
        if not 0 <= low_watermark <= high_watermark:
            raise AccountsError(
                f"account {name!r}: need 0 <= low_watermark <= high_watermark, "
                f"got low={low_watermark} high={high_watermark}"
            )
        if event_cost is None:
            event_cost = parent.event_cost if parent is not None else DEFAULT_EVENT_COST
        if event_cost < 0:
            raise AccountsError(f"account {name!r}: event_cost must be >= 0, got {event_cost}")
        self.name = name
        self.kind = kind
        self.high_watermark = high_watermark
        self.low_watermark = low_watermark
        self.parent = parent
        self.event_cost = event_cost
        self.serial = next(_serials)
        # Self first, then ancestors: every loan walks this tuple once.
        self._chain: tuple[Account, ...] = (self, *(parent._chain if parent else ()))
        self._borrowed = 0
        self._debt = 0
        self._loans = 0
        self._peak = 0
        self._blocked = False
        self._closed = False
        self._lot = trio.lowlevel.ParkingLot()
        self._parked_seconds = 0.0
        self._wait_start_sum = 0.0
        self._waiters = 0
        _registry.add(self)

    def __repr__(self) -> str:
        return (
            f"<Account {self.name!r} debt={self.debt} "
            f"high={self.high_watermark} low={self.low_watermark}"
            f"{' blocked' if self._blocked else ''}>"
        )

    # -- reading -----------------------------------------------------------

    @property
    def debt(self) -> int:
        """Outstanding debt: everything lent from this account (and its
        descendants) that has not been repaid."""
        return self._debt

    @property
    def peak_debt(self) -> int:
        """The largest :attr:`debt` this account has had."""
        return self._peak

    @property
    def blocked(self) -> bool:
        """Whether this account itself is in its blocked phase (ancestors
        not considered; see :meth:`is_clear`)."""
        return self._blocked

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def is_clear(self) -> bool:
        """True when neither this account nor any ancestor is blocked, i.e.
        when :meth:`ensure_clear_funds` would return without parking."""
        return self._first_blocked() is None

    def ancestors(self) -> Iterator[Account]:
        """The parent, its parent, and so on up to the root."""
        return iter(self._chain[1:])

    def statistics(self) -> AccountStatistics:
        """A snapshot of this account's figures (see :class:`AccountStatistics`)."""
        waiters = self._waiters
        seconds = self._parked_seconds
        now = _now()
        if waiters and now is not None:
            seconds += waiters * now - self._wait_start_sum
        return AccountStatistics(
            name=self.name,
            kind=self.kind,
            debt=self._debt,
            peak_debt=self._peak,
            borrowed_total=self._borrowed,
            repaid_total=self._borrowed - self._debt,
            loans=self._loans,
            blocked=self._blocked,
            seconds_blocked=seconds,
            waiters=waiters,
            high_watermark=self.high_watermark,
            low_watermark=self.low_watermark,
        )

    # -- lending: LoanedItem moves the counters (see _loan.py) -------------

    def _wake_all(self) -> None:
        # Waiters exist only inside trio.run, where unparking is always
        # allowed; a loan repaid outside a run finds none.
        if self._lot:
            self._lot.unpark_all()

    # -- waiting -----------------------------------------------------------

    def ensure_clear_funds_nowait(self) -> None:
        """Return if this account and all its ancestors are clear; otherwise
        raise :class:`trio.WouldBlock`."""
        if self._first_blocked() is not None:
            raise trio.WouldBlock

    async def ensure_clear_funds(self) -> None:
        """Wait until neither this account nor any ancestor is blocked.

        A blocked account releases all its waiters together once its debt
        falls to its low watermark. This is a checkpoint like trio's own
        primitives: it always checks for cancellation and yields to the
        scheduler, whether or not it has to wait. Cancellation while parked
        raises :class:`trio.Cancelled` and leaves the account unchanged.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        blocker = self._first_blocked()
        if blocker is None:
            await trio.lowlevel.cancel_shielded_checkpoint()
            return
        start = trio.current_time()
        self._wait_start_sum += start
        self._waiters += 1
        try:
            while blocker is not None:
                await blocker._lot.park()
                blocker = self._first_blocked()
        finally:
            end = trio.current_time()
            self._wait_start_sum -= start
            self._waiters -= 1
            self._parked_seconds += end - start

    def _first_blocked(self) -> Account | None:
        for account in self._chain:
            if account._blocked:
                return account
        return None

    # -- lifetime ----------------------------------------------------------

    def close(self) -> None:
        """Take the account out of :func:`live_accounts` (its metrics series
        disappear). Lending and repaying go on working: a closed
        connection's events still in flight are charged and repaid as
        usual. Idempotent."""
        self._closed = True
        _registry.discard(self)


def unlimited(name: str, *, parent: Account | None = None, kind: str = "account") -> Account:
    """An account that never blocks: for aggregates and for meters."""
    return Account(name, high_watermark=math.inf, low_watermark=math.inf, parent=parent, kind=kind)


def _now() -> float | None:
    try:
        return trio.current_time()
    except RuntimeError:  # outside trio.run (e.g. statistics read from a thread)
        return None
