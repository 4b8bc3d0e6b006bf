"""How many of a session's publishes the topics' streams hold, asked of
each topic's owner (cluster mode, several front ends).

A front end writes a session's publish counts to the cluster lazily (see
``sessions._cluster_records``): a Confirm never waits for them. So a front
end that resumes a session another one served takes each topic handle's
count from the topic's owner, which knows the highest publish index of
each (session, handle) that its stream holds (each run names its
publishes' origins; see ``Broker.stored``). That count is at least what
the session's client saw confirmed (a Confirm follows the stream's
acknowledgement), so the client's resend starts where the stream ends.

The owners answer over NATS: front end ``ID`` answers requests on subject
``broker.stored.ID``, whose payload is CBOR ``[session, [[handle, topic],
...]]`` and whose reply is a CBOR map of handle to count for the topics it
owns and could open (a handle left out: ask again, its topic is moving).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import cbor2
import trio

from broker.nats import NatsClient, NatsError

__all__ = ["STORED_SUBJECT", "Answer", "StoredCounts", "StoredCountsUnavailable"]

#: Subject prefix of a front end's answers (its id follows).
STORED_SUBJECT = "broker.stored."
#: Seconds an owner is given to answer one request.
ASK_TIMEOUT = 1.0
#: Seconds between requests while an owner does not know its topics yet.
ASK_AGAIN = 0.1

#: A broker's answer: per (handle, topic) it owns, the count its stream holds.
Answer = Callable[[bytes, list[tuple[int, str]]], dict[int, int]]


class StoredCountsUnavailable(Exception):
    """An owner did not say (in time) what its streams hold of a session."""


class StoredCounts:
    """Asks other front ends, and answers them, over one NATS client."""

    def __init__(self, client: NatsClient, me: str) -> None:
        self.client = client
        self.me = me
        #: Requests answered, and requests this front end made.
        self.answered = 0
        self.asked = 0

    async def serve(
        self, answer: Callable[[], Answer | None], task_status: trio.TaskStatus[None]
    ) -> None:
        """Answer requests with ``answer()`` (the broker serving now; None:
        none, the request goes unanswered) until cancelled."""
        with self.client.subscribe(STORED_SUBJECT + self.me) as requests:
            await self.client.flush()
            task_status.started()
            async for request in requests:
                respond = answer()
                if respond is None or not request.reply:
                    continue
                try:
                    session, pairs = _request(request.payload)
                except (ValueError, TypeError, IndexError, cbor2.CBORDecodeError):
                    continue  # (not from a front end: left unanswered)
                with trio.move_on_after(ASK_TIMEOUT):
                    counts = cbor2.dumps(respond(session, pairs))
                    try:
                        await self.client.publish(request.reply, counts)
                        self.answered += 1
                    except NatsError:
                        pass  # (the asker asks again)

    async def ask(
        self, owners: Mapping[str, list[tuple[int, str]]], session: bytes, deadline: float
    ) -> dict[int, int]:
        """Per topic handle of ``owners`` (owner id -> its [handle, topic]),
        the count the owner's stream holds of ``session``'s publishes,
        asked again until trio time ``deadline``; raises
        :class:`StoredCountsUnavailable` if an owner has not answered for
        all of its handles by then."""
        counts: dict[int, int] = {}
        for owner, pairs in owners.items():
            counts |= await self._ask_one(owner, pairs, session, deadline)
        return counts

    async def _ask_one(
        self, owner: str, pairs: list[tuple[int, str]], session: bytes, deadline: float
    ) -> dict[int, int]:
        payload = cbor2.dumps([session, [list(pair) for pair in pairs]])
        wanted = {handle for handle, _ in pairs}
        why = "no answer"
        while True:
            timeout = min(ASK_TIMEOUT, deadline - trio.current_time())
            if timeout <= 0:
                raise StoredCountsUnavailable(
                    f"front end {owner} did not say what its streams hold ({why})"
                )
            self.asked += 1
            try:
                reply = await self.client.request(STORED_SUBJECT + owner, payload, timeout=timeout)
                counts = _reply(reply.payload)
            except NatsError as error:
                why = str(error) or type(error).__name__
            except (ValueError, TypeError, cbor2.CBORDecodeError):
                why = "a malformed answer"
            else:
                if wanted <= counts.keys():
                    return {h: counts[h] for h in wanted}
                why = "its topics are not open there yet"
            await trio.sleep(min(ASK_AGAIN, max(0.0, deadline - trio.current_time())))


def _request(payload: bytes) -> tuple[bytes, list[tuple[int, str]]]:
    session, pairs = cbor2.loads(payload)
    if not isinstance(session, bytes):
        raise TypeError("the session is not bytes")
    return session, [(int(handle), str(topic)) for handle, topic in pairs]


def _reply(payload: bytes) -> dict[int, int]:
    value: Any = cbor2.loads(payload)
    if not isinstance(value, dict):
        raise TypeError("the answer is not a map")
    return {int(handle): int(count) for handle, count in value.items()}
