"""Resuming a session on a new connection, sans-IO: what to resume, what to
send again when the broker lost the session, and when to try again.

Time is passed in (``now``, in seconds of any monotonic clock): the trio
driver passes ``trio.current_time()``, the blocking one ``time.monotonic()``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Protocol

from broker.backoff import Backoff
from broker.protocol import Connection, GoodbyeCode, Publish, Stage
from broker.protocol.connection import ClientSessionState
from broker.protocol.frames import decode_body

from ._common import ConnectionLost

log = logging.getLogger("broker.client")

#: Goodbye codes after which a client with ``reconnect`` tries again (besides
#: a broken or silent connection): the broker went away, not the client's fault.
RECONNECT_CODES = frozenset(
    {GoodbyeCode.LEASE_EXPIRED, GoodbyeCode.SHUTTING_DOWN, GoodbyeCode.REDIRECT}
)
#: The reason of a Goodbye 8 (redirect): ``resume at HOST:PORT``.
REDIRECT_PREFIX = "resume at "


def redirect_target(error: ConnectionLost) -> str | None:
    """The ``HOST:PORT`` a Goodbye 8 sends the client to, else None."""
    if error.code != GoodbyeCode.REDIRECT or not error.reason.startswith(REDIRECT_PREFIX):
        return None
    return error.reason[len(REDIRECT_PREFIX) :].strip() or None


class Consumer(Protocol):
    """What a resume needs of a subscription: whether it is closed and the
    sequence number of the last message the application consumed."""

    _closed: bool
    _consumed: int


def resume_state(conn: Connection, subscriptions: Mapping[int, Consumer]) -> ClientSessionState:
    """The session of ``conn`` as it stands, for a resume: only the open
    subscriptions of ``subscriptions`` (handle -> subscription), each
    processed up to what the application consumed (the rest is delivered
    again)."""
    state = conn.session_state()
    assert isinstance(state, ClientSessionState)
    live = {
        handle: info
        for handle, info in state.subscriptions.items()
        if (sub := subscriptions.get(handle)) is not None and not sub._closed
    }
    processed = {handle: subscriptions[handle]._consumed for handle in live}
    return dataclasses.replace(state, subscriptions=live, processed=processed)


def without_subscription(state: ClientSessionState, handle: int) -> ClientSessionState:
    """``state`` without subscription ``handle`` (closed while reconnecting:
    the resumed session leaves it out, and the broker drops it)."""
    subscriptions = {h: v for h, v in state.subscriptions.items() if h != handle}
    processed = {h: v for h, v in state.processed.items() if h != handle}
    return dataclasses.replace(state, subscriptions=subscriptions, processed=processed)


def unconfirmed_publishes(
    state: ClientSessionState,
) -> list[tuple[str, Stage | None, Publish]]:
    """The messages of a lost session the broker never confirmed, in the
    order they were published per topic: ``(topic name, stage, Publish)``."""
    messages = []
    for handle, (_, frames) in sorted(state.retained.items()):
        topic = state.topics[handle]
        stage = state.stages.get(handle)
        for frame in frames:
            message = decode_body(frame[4:])
            assert isinstance(message, Publish)
            messages.append((topic, stage, message))
    return messages


def log_session_lost(name: str, state: ClientSessionState, offsets: bool) -> None:
    """Say (a warning) that the broker no longer knows the session ``state``
    records; ``offsets``: the broker keeps topic logs (reliable
    subscriptions then go on where they were, nothing missed)."""
    unconfirmed = sum(len(frames) for _, frames in state.retained.values())
    subscriptions = len(state.subscriptions)
    parts = []
    if subscriptions:
        parts.append(f"subscribing again to {subscriptions} topic(s)")
    if unconfirmed or not subscriptions:
        parts.append(f"publishing {unconfirmed} unconfirmed message(s) again")
    said = ", ".join(parts)
    if subscriptions:  # (what a subscriber missed: nothing to say to a publisher)
        said += "; " + (
            "reliable subscriptions go on from the topic logs after the last message "
            "processed; others miss what was published meanwhile"
            if offsets
            else "messages published meanwhile were not delivered to us"
        )
    log.warning(
        "%s: the broker lost our session (it restarted, or the session expired): %s",
        name,
        said,
    )


def may_retry(error: ConnectionLost) -> bool:
    """A connection that ended with ``error`` may be replaced: it broke, went
    silent, or the broker went away (not a refusal of this client)."""
    return error.code is None or error.code in RECONNECT_CODES


class ReconnectPlan:
    """When to try connecting again after a connection broke at ``now``:
    at once, then after the waits of ``backoff`` (exponential, full jitter:
    :class:`broker.backoff.Backoff`), for up to ``reconnect`` seconds in
    all; where: the client's address, or where a Goodbye 8 sent it, or,
    once the client's address cannot be reached, ``fallback`` if given."""

    def __init__(
        self,
        now: float,
        reconnect: float,
        fallback: str | None = None,
        *,
        backoff: Backoff | None = None,
    ) -> None:
        self.reconnect = reconnect
        #: ``HOST:PORT`` to go on through once the client's own address cannot
        #: be reached (see ``ClientSession.fallback``).
        self.fallback = fallback
        #: No attempt starts at or after this time; none fails for good more
        #: than the backoff's first wait before it.
        self.deadline = now + reconnect
        #: When the next attempt is due.
        self.next_attempt = now
        self._backoff = backoff if backoff is not None else Backoff()
        #: ``HOST:PORT`` a broker of several workers sent the resume to (its
        #: Goodbye 8: the worker that holds the session), for the next attempts.
        self.redirect: str | None = None

    def attempt_deadline(self, now: float, connect_timeout: float) -> float:
        """How long an attempt starting at ``now`` may take (connection and handshake)."""
        return min(self.deadline, now + connect_timeout)

    def failed(self, error: ConnectionLost, now: float) -> ConnectionLost | None:
        """An attempt failed at ``now`` with ``error``: None if another is due
        (at :attr:`next_attempt`), else the error the client ends with (the
        broker refused it, or the time is up)."""
        refused = not may_retry(error)
        target = redirect_target(error)
        if target is not None and target != self.redirect:
            self.redirect = target
            self.next_attempt = now  # at once, there
            return None
        if error.unreachable and self.fallback is not None and self.redirect is None:
            self.redirect = self.fallback
            self.next_attempt = now  # at once, through the broker's public address
            return None
        wait = self._backoff.next()
        left = self.deadline - now
        if refused or left <= self._backoff.first:
            return ConnectionLost(
                f"could not reconnect within {self.reconnect} s: {error}", error.code
            )
        # A wait drawn past the window's end is cut to half of what is left:
        # the client goes on trying until the window is over (to within the
        # first wait), however the jitter fell.
        self.next_attempt = now + min(wait, left / 2)
        return None
