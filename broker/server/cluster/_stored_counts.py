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

An owner counts from its table of what its streams stored (restored with
each topic, raised as each run is stored: ``Broker.stored``), after
reading the origins of any run the stream holds past the last one its
log knows (:class:`OwnedCounts`): a previous owner still draining, or a
run whose answer has not come back yet, stored them.

The owners answer over NATS: front end ``ID`` answers requests on subject
``broker.stored.ID``, whose payload is CBOR ``[session, [[handle, topic],
...]]`` and whose reply is a CBOR map of handle to count for the topics it
owns and could open (a handle left out: ask again, its topic is moving).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import cbor2
import trio

from broker.log import LogError
from broker.nats import NatsClient, NatsError, NoResponders

from ..storage._topic_logs import TopicLogs, TopicUnavailable
from ._origin_dedup import SeenOrigins

__all__ = ["STORED_SUBJECT", "Answer", "OwnedCounts", "StoredCounts", "StoredCountsUnavailable"]

log = logging.getLogger("broker.server")

#: Subject prefix of a front end's answers (its id follows).
STORED_SUBJECT = "broker.stored."
#: Seconds an owner is given to answer one request.
ASK_TIMEOUT = 1.0
#: Seconds between requests while an owner does not know its topics yet.
ASK_AGAIN = 0.1

#: Runs read at once while catching up with a stream's end.
CATCH_UP_BATCH = 256

#: A broker's answer: per (handle, topic) it owns, the count its stream holds.
Answer = Callable[[bytes, list[tuple[int, str]]], Awaitable[dict[int, int]]]


class StoredCountsUnavailable(Exception):
    """An owner did not say (in time) what its streams hold of a session."""


class StoredCounts:
    """Asks other front ends, and answers them, over one NATS client."""

    def __init__(
        self, client: NatsClient, me: str, on_silent: Callable[[str], None] | None = None
    ) -> None:
        self.client = client
        self.me = me
        #: Told the id of an owner nobody answers for (no subscription on
        #: its subject in the NATS cluster: it died, or lost NATS).
        self.on_silent = on_silent
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
                    counts = cbor2.dumps(await respond(session, pairs))
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
                if isinstance(error, NoResponders) and self.on_silent is not None:
                    self.on_silent(owner)
            except (ValueError, TypeError, cbor2.CBORDecodeError):
                why = "a malformed answer"
            else:
                if wanted <= counts.keys():
                    return {h: counts[h] for h in wanted}
                why = "its topics are not open there yet"
            await trio.sleep(min(ASK_AGAIN, max(0.0, deadline - trio.current_time())))


class OwnedCounts:
    """The owner's side: how many of a session's publishes the streams of
    the topics this front end owns hold (see the module)."""

    def __init__(self, logs: TopicLogs, stored: SeenOrigins) -> None:
        assert logs.replication is not None
        self.logs = logs
        self.replication = logs.replication
        #: Per (topic, session, handle): the highest publish index stored.
        self.stored = stored
        self._reading = trio.Lock()

    async def count(self, session: bytes, handle: int, topic: str) -> int:
        """Publishes of (``session``, ``handle``) ``topic``'s stream holds
        (0: none, or the topic has no log here: never made, or set aside,
        then reported). Raises :class:`~broker.log.LogError` if the
        stream cannot be read now."""
        replicated = self.replication.logs.get(topic)
        if replicated is None:
            if topic in self.replication.broken:
                log.warning(
                    "topic %r is set aside: a resumed session's count on it is the "
                    "cluster's last written one",
                    topic[:64],
                )
            return 0
        try:
            self.logs.open(topic)  # (once: its restored runs' origins go into the table)
        except TopicUnavailable as error:
            raise LogError(str(error)) from None
        async with self._reading:  # (one reader of a stream at a time)
            stream = await self.replication.replicator.stream(topic)
            seq = replicated.last_seq + 1
            while runs := await stream.fetch(seq, CATCH_UP_BATCH):
                for run in runs:
                    if run.origins:
                        self.stored.stored(topic, run.origins)
                seq = runs[-1].seq + 1
        return self.stored.high(topic, session, handle)

    async def counts(
        self, session: bytes, pairs: list[tuple[int, str]], owns: Callable[[str], bool]
    ) -> dict[int, int]:
        """Per (handle, topic) of ``pairs`` whose topic is owned here: its
        count (see :meth:`count`); a topic whose stream cannot be read now
        is left out (the asker asks again)."""
        counts: dict[int, int] = {}
        for handle, topic in pairs:
            if owns(topic):
                try:
                    counts[handle] = await self.count(session, handle, topic)
                except LogError as error:
                    log.info("topic %r: its stream cannot be read now: %s", topic[:64], error)
        return counts


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
