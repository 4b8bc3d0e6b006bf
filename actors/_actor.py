"""Actors: a mailbox of loaned events, handled one turn at a time."""

from __future__ import annotations

import enum
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import trio

from accounts import Account, LoanedItem
from actors._errors import ActorFailed, NotInTurnError, NotSpawnedError
from actors._timers import Timer

log = logging.getLogger("actors")

ActorT = TypeVar("ActorT", bound="Actor")


class ActorHost(Protocol):
    """What an actor needs of the system it runs in (an
    :class:`~actors.ActorSystem`): spawning, the accounts that system-level
    events are charged to, and being told of deaths and unhandled failures."""

    account: Account
    timers: Account
    _dead_letters: int

    def spawn(
        self, actor: ActorT, *, name: str | None = None, supervisor: Actor | None = None
    ) -> ActorT: ...

    def _forget(self, actor: Actor) -> None: ...

    def _unhandled(self, actor: Actor, error: BaseException) -> None: ...


#: Turns an actor takes before it yields to the scheduler, when its mailbox
#: never runs dry. Large enough to amortise the yield, small enough that no
#: actor hogs the thread for long.
TURNS_PER_YIELD = 64


class ActorState(enum.Enum):
    """Where an actor is in its life."""

    NEW = "new"  #: constructed, not yet spawned
    RUNNING = "running"  #: spawned; handles its mailbox
    STOPPING = "stopping"  #: stop requested; finishing the current turn
    STOPPED = "stopped"  #: done; its mailbox was repaid and emptied


@dataclass(frozen=True, slots=True)
class ActorStatistics:
    """A snapshot of one actor.

    Attributes:
        name: the actor's name.
        state: see :class:`ActorState`.
        mailbox: events waiting in the mailbox (each an outstanding loan).
        turns: events (and exit notices) handled so far.
    """

    name: str
    state: ActorState
    mailbox: int
    turns: int


class _Exit:
    """Signal: an actor this one supervises or watches has stopped."""

    __slots__ = ("actor", "error")

    def __init__(self, actor: Actor, error: BaseException | None) -> None:
        self.actor = actor
        self.error = error


class Turn:
    """The handling of one event, under the account of that event.

    Everything sent through the turn is a :class:`~accounts.LoanedItem`
    charged to :attr:`account`, the account of the event being handled
    (fan-out rule). The turn is valid only while its handler runs: using it
    afterwards raises :class:`NotInTurnError`. Loans made by the turn are
    charged before the event's own loan is repaid.
    """

    __slots__ = ("_account", "actor")

    def __init__(self, actor: Actor) -> None:
        self.actor = actor
        self._account: Account | None = None

    @property
    def account(self) -> Account:
        """The account of the event being handled."""
        account = self._account
        if account is None:
            raise NotInTurnError(f"turn of {self.actor.name!r} has ended")
        return account

    def send(self, target: Actor, message: Any, *, cost: int = 0) -> None:
        """Put ``message`` in ``target``'s mailbox, charged to this turn's
        account (``cost`` bytes plus the per-event constant). Never blocks and
        never drops; a stopped target repays at once (a dead letter)."""
        account = self._account
        if account is None:
            raise NotInTurnError(f"turn of {self.actor.name!r} has ended")
        target._deliver(LoanedItem(account, cost, message))

    def spawn(self, actor: ActorT, *, name: str | None = None) -> ActorT:
        """Spawn ``actor`` supervised by the actor taking this turn."""
        return self.actor.system.spawn(actor, name=name, supervisor=self.actor)


class Actor:
    """Base class of actors: subclass it and override :meth:`handle`.

    An actor handles the events in its mailbox one at a time, in order, each
    in a :class:`Turn` under the event's account. Its mailbox never drops and
    is not bounded by a count: memory is bounded by the accounts that the
    events are charged to, whose readers stop reading when they owe too much.

    Subclasses may define ``__init__`` freely; the runtime attaches its state
    when the actor is spawned (see :meth:`ActorSystem.spawn`).

    Lifecycle: :meth:`started` runs first, in the actor's own task; then the
    mailbox is handled until :meth:`stop` or a failure. When an actor stops,
    its helper tasks and timers are cancelled, its children are asked to
    stop, every event left in its
    mailbox is repaid unhandled, :meth:`on_stop` runs, and its supervisor and
    watchers are told (:meth:`actor_exited`). A failure with no supervisor to
    take it propagates out of the actor system, as an exception in a trio
    nursery does.
    """

    name: str
    _state: ActorState = ActorState.NEW
    _system: ActorHost | None = None
    #: Take an event sent while the actor is idle (parked on an empty
    #: mailbox) at once, in the sender's task, instead of waking the actor's
    #: own task for it: same order, same accounts, one task switch fewer. For
    #: actors whose :meth:`handle` is a plain ``def`` (an ``async`` one
    #: fails the actor); a failure in such a turn still fails the actor, in
    #: its own task, never the sender.
    inline_turns: bool = False

    # -- to override -------------------------------------------------------

    async def started(self) -> None:
        """Runs once in the actor's task before the first event; may start
        helper tasks with :meth:`start_soon`."""

    def handle(self, turn: Turn, message: Any) -> Awaitable[None] | None:
        """Handle one event; raising makes the actor fail.

        Override it with either ``async def`` (the turn may wait, e.g. on a
        socket; the event's loan stays outstanding until it returns) or a
        plain ``def`` (cheaper, for turns that only compute and send)."""
        raise NotImplementedError(f"{type(self).__name__} does not handle {message!r}")

    async def actor_exited(self, turn: Turn, actor: Actor, error: BaseException | None) -> None:
        """A child (supervised actor) or a watched actor has stopped;
        ``error`` is what it failed with, or None for a normal stop.

        The default escalates a child's failure: this actor fails in turn with
        :class:`ActorFailed`, the child's error as its cause. A supervisor
        that restarts children overrides this.
        """
        if error is not None and actor.supervisor is self:
            raise ActorFailed(actor.name) from error

    def on_stop(self, error: BaseException | None) -> None:
        """Synchronous clean-up after the mailbox was repaid; ``error`` is the
        failure that stopped the actor, or None."""

    # -- runtime state -----------------------------------------------------

    def _attach(self, system: ActorHost, name: str, supervisor: Actor | None) -> None:
        if self._state is not ActorState.NEW:
            raise NotSpawnedError(f"actor {self!r} was already spawned")
        self.name = name
        self._system = system
        self.supervisor = supervisor
        self._state = ActorState.RUNNING
        self._mailbox: deque[LoanedItem[Any]] = deque()
        self._signals: deque[LoanedItem[_Exit]] = deque()
        self._parked: trio.lowlevel.Task | None = None
        #: A turn runs in a sender's task (see :attr:`inline_turns`).
        self._inline = False
        #: What an inline turn failed with, raised by the actor's task.
        self._inline_error: Exception | None = None
        self._turn = Turn(self)
        self._turns = 0
        self._watchers: list[Actor] = []
        self._children: dict[Actor, None] = {}
        self._nursery: trio.Nursery | None = None
        self._pending_tasks: list[tuple[Callable[..., Awaitable[Any]], tuple[Any, ...]]] = []
        self._error: BaseException | None = None
        self._stopped = trio.Event()
        self._timers: set[Timer] = set()

    @property
    def system(self) -> ActorHost:
        """The system the actor was spawned in."""
        if self._system is None:
            raise NotSpawnedError(f"{type(self).__name__} has not been spawned")
        return self._system

    @property
    def state(self) -> ActorState:
        """Where the actor is in its life."""
        return self._state

    @property
    def error(self) -> BaseException | None:
        """What the actor failed with, once stopped (None if it stopped normally)."""
        return self._error

    def statistics(self) -> ActorStatistics:
        """A snapshot of the actor (see :class:`ActorStatistics`)."""
        spawned = self._state is not ActorState.NEW
        return ActorStatistics(
            name=getattr(self, "name", type(self).__name__),
            state=self._state,
            mailbox=len(self._mailbox) + len(self._signals) if spawned else 0,
            turns=self._turns if spawned else 0,
        )

    def __repr__(self) -> str:
        name = getattr(self, "name", None)
        return f"<{type(self).__name__} {name!r} {self._state.value}>"

    # -- sending from outside a turn ---------------------------------------

    def send_nowait(self, message: Any, *, account: Account, cost: int = 0) -> None:
        """Put ``message`` in the mailbox, charged to ``account``, from code
        that is not handling an event (a socket reader, a test). Never blocks:
        callers that produce events in a loop should wait on the account
        (:meth:`send`, or :meth:`Account.ensure_clear_funds`) between them."""
        self._deliver(LoanedItem(account, cost, message))

    async def send(self, message: Any, *, account: Account, cost: int = 0) -> None:
        """Wait until ``account`` is clear of debt (a checkpoint), then
        :meth:`send_nowait`."""
        await account.ensure_clear_funds()
        self.send_nowait(message, account=account, cost=cost)

    def _deliver(self, loan: LoanedItem[Any]) -> None:
        if self._state is ActorState.RUNNING:
            if (
                self.inline_turns
                and self._parked is not None
                and not self._inline
                and not self._mailbox
                and not self._signals
            ):
                self._take_inline(loan)
                return
            self._mailbox.append(loan)
            if self._parked is not None:
                self._wake()
        else:
            self._dead_letter(loan)

    def _take_inline(self, loan: LoanedItem[Any]) -> None:
        """Handle ``loan`` now, in the sender's task, while the actor's own
        task stays parked: what arrives meanwhile (even from this very turn)
        is queued and wakes that task, which takes it after this turn, so the
        order is the order of sending. The loan is repaid after the turn, as
        in the mailbox loop, so what the turn sends is charged first."""
        turn = self._turn
        turn._account = loan.account
        self._inline = True
        try:
            pending = self.handle(turn, loan.item)
            if pending is not None:
                close = getattr(pending, "close", None)
                if close is not None:
                    close()  # (never awaited: no "never awaited" warning)
                raise TypeError(f"{type(self).__name__}.handle is async: no inline turns")
        except Exception as error:
            # The actor fails in its own task, as if the turn ran there.
            self._inline_error = error
            self._wake()
        finally:
            self._inline = False
            turn._account = None
            self._turns += 1
            loan.repay()

    def _wake(self) -> None:
        """Reschedule the actor's task if it is parked waiting for mail."""
        task = self._parked
        if task is not None:
            self._parked = None
            trio.lowlevel.reschedule(task)

    def _dead_letter(self, loan: LoanedItem[Any]) -> None:
        loan.repay()
        system = self._system
        if system is None:
            raise NotSpawnedError(f"{type(self).__name__} has not been spawned")
        system._dead_letters += 1
        log.debug("dead letter to %s: %r", self.name, loan.item)

    def _signal(self, exit_: _Exit) -> None:
        # Exit signals are charged to the system's account: the actor that
        # caused them is gone, and its accounts may be too.
        loan = LoanedItem(self.system.account, 0, exit_)
        if self._state is ActorState.RUNNING:
            self._signals.append(loan)
            self._wake()
        else:
            loan.repay()
            if exit_.error is not None and exit_.actor.supervisor is self:
                # Nobody is left to take the failure: it must not vanish.
                self.system._unhandled(exit_.actor, exit_.error)

    # -- control -----------------------------------------------------------

    def stop(self) -> None:
        """Ask the actor to stop after its current turn; idempotent. Events
        left in its mailbox are repaid without being handled."""
        if self._state is ActorState.RUNNING:
            self._state = ActorState.STOPPING
            self._wake()

    async def wait_stopped(self) -> None:
        """Wait until the actor has stopped (and repaid its mailbox)."""
        if self._state is ActorState.NEW:
            raise NotSpawnedError(f"{type(self).__name__} has not been spawned")
        await self._stopped.wait()

    def watch(self, other: Actor) -> None:
        """Have :meth:`actor_exited` called on this actor when ``other``
        stops (at once, in a later turn, if it already has)."""
        if other._state is ActorState.STOPPED:
            self._signal(_Exit(other, other._error))
        else:
            other._watchers.append(self)

    def start_soon(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Run ``fn(*args)`` as a helper task of this actor: it is cancelled
        when the actor stops, and its failure is the actor's failure."""
        self._check_running()
        if self._nursery is not None:
            self._nursery.start_soon(fn, *args)
        else:
            self._pending_tasks.append((fn, args))

    def _check_running(self) -> None:
        if self._state is not ActorState.RUNNING:
            raise NotSpawnedError(f"actor {self!r} is not running")

    def after(self, delay: float, message: Any) -> Timer:
        """Send ``message`` to this actor once, ``delay`` seconds from now,
        charged to an account of the timer's own."""
        self._check_running()
        return self._start_timer(message, delay, None)

    def every(self, period: float, message: Any, *, first: float | None = None) -> Timer:
        """Send ``message`` to this actor every ``period`` seconds (first
        after ``first`` seconds, default ``period``), charged to an account of
        the timer's own. A tick is not sent while the previous one (and what
        its turn sent) is still outstanding: a tick that falls due meanwhile
        goes out as soon as that is repaid, and the ones after it that fell
        due too are skipped, never piled up."""
        self._check_running()
        return self._start_timer(message, period if first is None else first, period)

    def _start_timer(self, message: Any, delay: float, period: float | None) -> Timer:
        timer = Timer(self, message, delay, period, self.system.timers)
        self._timers.add(timer)
        self.start_soon(timer._run)
        return timer

    def _timer_done(self, timer: Timer) -> None:
        """``timer`` was cancelled or fired its last: forget it."""
        self._timers.discard(timer)

    # -- the actor's task --------------------------------------------------

    async def _run(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                for fn, args in self._pending_tasks:
                    nursery.start_soon(fn, *args)
                self._pending_tasks.clear()
                try:
                    await self.started()
                    await self._handle_mailbox()
                finally:
                    nursery.cancel_scope.cancel()
        except BaseException as exc:
            cancelled, self._error = _split_cancellation(exc)
            self._finish()
            if cancelled is not None:
                raise cancelled from None
            if not isinstance(self._error, Exception):
                raise  # KeyboardInterrupt and the like are not actor failures
            # A failure: _finish handed it to the supervisor (or the system).
        else:
            self._finish()

    async def _handle_mailbox(self) -> None:
        mailbox = self._mailbox
        signals = self._signals
        turn = self._turn
        handle = self.handle
        running = ActorState.RUNNING
        while True:
            budget = TURNS_PER_YIELD
            while budget and self._state is running:
                if signals:
                    await self._handle_signal(signals.popleft())
                elif mailbox:
                    loan = mailbox.popleft()
                    turn._account = loan.account
                    try:
                        pending = handle(turn, loan.item)
                        if pending is not None:
                            await pending
                    finally:
                        turn._account = None
                        loan.repay()
                else:
                    break
                budget -= 1
            self._turns += TURNS_PER_YIELD - budget
            if self._state is not running:
                return
            if budget:
                await self._wait_for_mail()
                if self._inline_error is not None:  # (only ever set while parked)
                    error, self._inline_error = self._inline_error, None
                    raise error
            else:
                await trio.lowlevel.checkpoint()

    async def _handle_signal(self, loan: LoanedItem[_Exit]) -> None:
        turn = self._turn
        turn._account = loan.account
        try:
            await self.actor_exited(turn, loan.item.actor, loan.item.error)
        finally:
            turn._account = None
            loan.repay()

    async def _wait_for_mail(self) -> None:
        self._parked = trio.lowlevel.current_task()

        def abort(_: Any) -> trio.lowlevel.Abort:
            self._parked = None
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)

    def _finish(self) -> None:
        """Stop for good: repay the mailbox, clean up, tell who must know."""
        self._state = ActorState.STOPPED
        self._parked = None
        while self._mailbox:
            self._mailbox.popleft().repay()
        while self._signals:
            loan = self._signals.popleft()
            loan.repay()
            self._orphaned_exit(loan.item)
        for timer in list(self._timers):
            timer.cancel()
        for child in list(self._children):
            child.stop()
        try:
            self.on_stop(self._error)
        finally:
            self._stopped.set()
            system = self.system
            system._forget(self)
            exit_ = _Exit(self, self._error)
            if self.supervisor is not None:
                self.supervisor._children.pop(self, None)
                self.supervisor._signal(exit_)
            elif self._error is not None and isinstance(self._error, Exception):
                system._unhandled(self, self._error)
            for watcher in self._watchers:
                if watcher is not self.supervisor:
                    watcher._signal(exit_)
            self._watchers.clear()

    def _orphaned_exit(self, exit_: _Exit) -> None:
        # A child's failure still queued when its supervisor stopped: it was
        # never handled, so it goes up rather than vanishing.
        if exit_.error is not None and exit_.actor.supervisor is self:
            self.system._unhandled(exit_.actor, exit_.error)


def _split_cancellation(
    exc: BaseException,
) -> tuple[BaseException | None, BaseException | None]:
    """Split what escaped an actor's task into (cancellation, failure)."""
    if isinstance(exc, trio.Cancelled):
        return exc, None
    if isinstance(exc, BaseExceptionGroup):
        cancelled, rest = exc.split(trio.Cancelled)
        return cancelled, (None if rest is None else _unwrap(rest))
    return None, exc


def _unwrap(exc: BaseException) -> BaseException:
    """The single interesting exception of a nursery's exception group."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc
