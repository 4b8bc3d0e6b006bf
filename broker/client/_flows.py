"""The client's operations that wait, written once for both drivers, sans-IO.

Each flow is a generator of conditions (``Callable[[], bool]``): the driver
waits, in its own way and doing I/O meanwhile, until the condition yielded
holds, then resumes the flow (with :class:`Flow`); what the flow returns is
the result. A driver that gives up (timeout, cancellation) closes the
generator, which undoes what the flow holds (pins).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from typing import Generic, TypeVar, cast

from broker.protocol import AdminAnswer, AdminValue, Answer, Connection, HandleType, Headers, Stage
from broker.protocol.connection import ClientSessionState

from ._common import ClientError, admin_rows
from ._core import ClientSession
from ._resume import unconfirmed_publishes
from ._start import without_log_problem
from ._subscription import SubscriptionState

T = TypeVar("T")
#: A flow: conditions to wait for, one after the other, then a result.
Steps = Generator[Callable[[], bool], None, T]


class Flow(Generic[T]):
    """How a driver runs a flow: ``with Flow(steps) as flow``, wait for each
    condition of ``for condition in flow``, then take ``flow.result``.
    Leaving the block early (a timeout, a cancellation) closes the flow."""

    def __init__(self, steps: Steps[T]) -> None:
        self._steps = steps
        self._done = False
        self._result: T | None = None

    def __enter__(self) -> Flow[T]:
        return self

    def __exit__(self, *_: object) -> None:
        self._steps.close()

    def __iter__(self) -> Iterator[Callable[[], bool]]:
        self._result = yield from self._steps
        self._done = True

    @property
    def result(self) -> T:
        """What the flow returned (once iterated to its end)."""
        assert self._done
        return cast(T, self._result)


def session_ready(session: ClientSession) -> Callable[[], bool]:
    """The condition: the connection takes new frames (not being replaced)."""
    return lambda: session.ready


def answered(session: ClientSession, nonce: int, generation: int) -> Callable[[], bool]:
    """The condition: Ping ``nonce`` is answered, or its connection was replaced."""
    return lambda: session.pong >= nonce or session.generation != generation


def round_trip(session: ClientSession) -> Steps[None]:
    """Until the broker has processed everything sent so far: it handles
    a connection's frames in order and answers a Ping after the frames
    before it, so its Pong proves they were processed (done again on
    the new connection if this one is replaced meanwhile)."""
    while True:
        yield session_ready(session)
        generation = session.generation
        nonce = session.conn.ping()
        yield answered(session, nonce, generation)
        if session.generation == generation:
            return


def bound(session: ClientSession, topic: str) -> Steps[int]:
    """The topic's handle once the broker confirmed it, binding it (when
    there is room) if needed; it stays pinned until the caller unpins it."""
    handles: list[int] = []

    def bind_now() -> bool:
        handle = session.bind(topic)
        if handle is not None:
            handles.append(handle)
        return handle is not None

    yield bind_now
    handle = handles[0]
    session.cache.pin(handle)
    try:
        yield lambda: session.conn.confirmed(HandleType.TOPIC, handle)
    except BaseException:
        session.cache.unpin(handle)
        raise
    return handle


def open_subscription(session: ClientSession, subscription: SubscriptionState) -> Steps[None]:
    """Subscribe ``subscription`` (binding its topic first) and wait until
    the broker has processed it. Near the broker's limit of
    subscriptions, it tries again after a round trip (the room for what
    the broker processed comes first), then raises :class:`LimitReached`.
    Options that need a topic log raise :class:`ClientError` at once on a
    broker without one (it would end the connection)."""
    problem = None if session.offsets else without_log_problem(subscription.options)
    if problem is not None:
        raise ClientError(problem)
    handle = None if subscription.pattern else (yield from bound(session, subscription.topic))
    done: list[bool] = []

    def subscribe_now() -> bool:
        if session.try_subscribe(subscription, handle):
            done.append(True)
            return True
        return session.near_subscription_limit

    try:
        checked = False
        while True:
            yield subscribe_now
            if done:
                break
            if checked:  # at the broker's limit: no room after a round trip
                raise session.subscription_limit()
            yield from round_trip(session)
            checked = True
    finally:
        if handle is not None:
            session.cache.unpin(handle)
    yield lambda: session.conn.confirmed(HandleType.SUBSCRIPTION, subscription.handle)
    yield from round_trip(session)


def request(session: ClientSession, send: Callable[[Connection], int]) -> Steps[Answer]:
    """Send a Commit, Abort or ListOffsets (``send(conn)`` queues it and
    returns its number) and wait for its answer; sent again on a new
    connection if the connection is replaced first (all are idempotent)."""
    while True:
        yield session_ready(session)
        generation = session.generation
        number = send(session.conn)
        yield lambda: number in session.outcomes or session.generation != generation  # noqa: B023
        if session.generation == generation:
            return session.outcomes.pop(number)


def admin(
    session: ClientSession, command: str, arguments: dict[str, AdminValue]
) -> Steps[list[dict[str, AdminValue]]]:
    """Send Admin ``command`` and gather its answer's rows, page after page
    (each page asked again from the last one's ``next``); a refusal raises
    :class:`AdminRefused`."""
    rows: list[dict[str, AdminValue]] = []
    asked = dict(arguments)
    while True:
        answer = yield from request(session, lambda conn: conn.admin(command, asked))  # noqa: B023
        rows += admin_rows(command, answer)
        assert isinstance(answer, AdminAnswer)
        if answer.next is None:
            return rows
        asked = {**arguments, "after": answer.next}


def restore(session: ClientSession, state: ClientSessionState) -> Steps[None]:
    """The broker lost session ``state``: subscribe again, and publish
    again what it never confirmed (at least once), in order."""
    for subscription in session.lost_subscriptions(state):
        yield from open_subscription(session, subscription)
    for topic, stage, message in unconfirmed_publishes(state):
        payload, key, headers = message.payload, message.key, message.headers

        def publish_now(
            topic: str = topic,
            stage: Stage | None = stage,
            payload: bytes = payload,
            key: bytes | None = key,
            headers: Headers | None = headers,
        ) -> bool:
            return session.try_publish(topic, payload, key, headers, stage, count_stage=False)

        yield publish_now
